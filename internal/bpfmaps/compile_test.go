package bpfmaps

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// TestCompiledEntriesMatchVerdict is the property test of the compiler: random policies
// are committed to the in-memory backend, whose entries are evaluated with a Go model
// of the LPM trie lookups policy.c does, and every random packet must get the verdict
// DirectionPolicy.Verdict gives.
func TestCompiledEntriesMatchVerdict(t *testing.T) {
	g := newPolicyGen(1).withNode()
	m := NewMemory()
	const pods, rounds, packets = 4, 400, 200
	ifaces := make([]int, pods)
	for i := range ifaces {
		ifaces[i] = i + 1
	}
	checked, allowed := checkAgainstReference(t, g, m, ifaces, rounds, packets, func(ifindex int, d Direction, pkt packet) bool {
		return m.Verdict(ifindex, d, pkt.peer, pkt.proto, pkt.port)
	})
	t.Logf("%d packets checked, %d allowed", checked, allowed)
	for i := 1; i <= pods; i++ {
		if _, err := m.Remove(i); err != nil {
			t.Fatal(err)
		}
	}
	if n := m.entryCount(Ingress) + m.entryCount(Egress); n != 0 {
		t.Fatalf("after removing every pod %d entries remain", n)
	}
}

func TestVerdictSemantics(t *testing.T) {
	pfx := netip.MustParsePrefix
	ip := netip.MustParseAddr
	web := Rule{CIDR: pfx("10.0.0.0/8"), Except: []netip.Prefix{pfx("10.1.0.0/16")},
		Ports: []PortRule{{Protocol: ProtocolTCP, Port: 80}, {Protocol: ProtocolUDP, Port: 1000, EndPort: 1010}}}
	anyNoPort := Rule{CIDR: pfx("10.9.0.0/16"), Ports: []PortRule{{Protocol: ProtocolAny}}}
	anyPort := Rule{CIDR: pfx("10.8.0.0/16"), Ports: []PortRule{{Protocol: ProtocolAny, Port: 53}}}
	iso := DirectionPolicy{Isolated: true, Allow: []Rule{web, anyNoPort, anyPort}}
	cases := []struct {
		name  string
		pol   DirectionPolicy
		peer  string
		proto Protocol
		port  uint16
		want  bool
	}{
		{"no policy allows", DirectionPolicy{}, "1.2.3.4", ProtocolTCP, 1, true},
		{"isolated, nothing allowed", DirectionPolicy{Isolated: true}, "1.2.3.4", ProtocolTCP, 1, false},
		{"allowed port", iso, "10.2.0.1", ProtocolTCP, 80, true},
		{"other port", iso, "10.2.0.1", ProtocolTCP, 81, false},
		{"range start", iso, "10.2.0.1", ProtocolUDP, 1000, true},
		{"range end", iso, "10.2.0.1", ProtocolUDP, 1010, true},
		{"past range", iso, "10.2.0.1", ProtocolUDP, 1011, false},
		{"except", iso, "10.1.0.1", ProtocolTCP, 80, false},
		{"icmp not allowed by port rules", iso, "10.2.0.1", ProtocolICMP, 0, false},
		{"icmp allowed by any-protocol all-ports", iso, "10.9.0.1", ProtocolICMP, 0, true},
		{"icmp not allowed by any-protocol port", iso, "10.8.0.1", ProtocolICMP, 0, false},
		{"any-protocol port on SCTP", iso, "10.8.0.1", ProtocolSCTP, 53, true},
		{"port ignored for icmp", iso, "10.8.0.1", ProtocolICMP, 53, false},
		{"admin deny before namespaced allow", DirectionPolicy{Isolated: true, Allow: []Rule{web},
			Admin: []TierRule{{Priority: 5, Action: ActionDeny, Rule: Rule{CIDR: pfx("10.2.0.0/16")}}}}, "10.2.0.1", ProtocolTCP, 80, false},
		{"admin lower priority first", DirectionPolicy{Admin: []TierRule{
			{Priority: 5, Action: ActionDeny, Rule: Rule{CIDR: pfx("10.2.0.0/16")}},
			{Priority: 1, Action: ActionAccept, Rule: Rule{CIDR: pfx("10.0.0.0/8")}}}}, "10.2.0.1", ProtocolTCP, 80, true},
		{"admin pass goes to namespaced", DirectionPolicy{Isolated: true, Admin: []TierRule{
			{Priority: 1, Action: ActionPass, Rule: Rule{CIDR: pfx("10.0.0.0/8")}},
			{Priority: 2, Action: ActionAccept, Rule: Rule{CIDR: pfx("10.0.0.0/8")}}}}, "10.2.0.1", ProtocolTCP, 80, false},
		{"baseline deny when not isolated", DirectionPolicy{Baseline: []TierRule{
			{Priority: 1, Action: ActionDeny, Rule: Rule{CIDR: pfx("10.0.0.0/8")}}}}, "10.2.0.1", ProtocolTCP, 80, false},
		{"baseline ignored when isolated", DirectionPolicy{Isolated: true, Allow: []Rule{web}, Baseline: []TierRule{
			{Priority: 1, Action: ActionDeny, Rule: Rule{CIDR: pfx("10.0.0.0/8")}}}}, "10.2.0.1", ProtocolTCP, 80, true},
		{"baseline pass allows", DirectionPolicy{Baseline: []TierRule{
			{Priority: 1, Action: ActionPass, Rule: Rule{CIDR: pfx("10.0.0.0/8")}},
			{Priority: 2, Action: ActionDeny, Rule: Rule{CIDR: pfx("10.0.0.0/8")}}}}, "10.2.0.1", ProtocolTCP, 80, true},
		{"v4 rule does not match v6 peer", DirectionPolicy{Isolated: true, Allow: []Rule{{CIDR: pfx("0.0.0.0/0")}}}, "fd00::1", ProtocolTCP, 80, false},
	}
	m := NewMemory()
	for i, c := range cases {
		if got := c.pol.Verdict(ip(c.peer), c.proto, c.port); got != c.want {
			t.Errorf("%s: Verdict = %v, want %v", c.name, got, c.want)
		}
		if _, err := m.Commit(i+1, PodPolicy{Ingress: c.pol}); err != nil {
			t.Fatalf("%s: commit: %v", c.name, err)
		}
		if got := m.Verdict(i+1, Ingress, ip(c.peer), c.proto, c.port); got != c.want {
			t.Errorf("%s: compiled verdict = %v, want %v", c.name, got, c.want)
		}
	}
}

// badPolicies are rejected with ErrInvalidPolicy and an error naming the rule.
func badPolicies() []struct {
	name string
	pol  PodPolicy
	want string
} {
	pfx := netip.MustParsePrefix
	ok := Rule{CIDR: pfx("10.0.0.0/8")}
	tooMany := Rule{CIDR: pfx("10.0.0.0/8")}
	for i := range maxPortRules + 1 {
		tooMany.Ports = append(tooMany.Ports, PortRule{Protocol: ProtocolTCP, Port: int32(100 + 2*i)})
	}
	half := func(base int32) Rule {
		r := Rule{CIDR: pfx("10.0.0.0/8")}
		for i := range maxPortRules/2 + 1 {
			r.Ports = append(r.Ports, PortRule{Protocol: ProtocolUDP, Port: base + int32(2*i)})
		}
		return r
	}
	return []struct {
		name string
		pol  PodPolicy
		want string
	}{
		{"invalid cidr", PodPolicy{Ingress: DirectionPolicy{Isolated: true, Allow: []Rule{ok, {}}}}, "ingress rule 1: cidr"},
		{"invalid except", PodPolicy{Egress: DirectionPolicy{Isolated: true, Allow: []Rule{{CIDR: pfx("10.0.0.0/8"),
			Except: []netip.Prefix{netip.PrefixFrom(netip.MustParseAddr("10.0.0.0"), 33)}}}}}, "egress rule 0: except 0"},
		{"except family", PodPolicy{Egress: DirectionPolicy{Isolated: true, Allow: []Rule{{CIDR: pfx("10.0.0.0/8"),
			Except: []netip.Prefix{pfx("fd00::/8")}}}}}, "egress rule 0: except 0 \"fd00::/8\": address family differs"},
		{"port 0 with end port", PodPolicy{Ingress: DirectionPolicy{Allow: []Rule{{CIDR: pfx("10.0.0.0/8"),
			Ports: []PortRule{{Protocol: ProtocolTCP, EndPort: 80}}}}}}, "ingress rule 0: port 0: port 0: out of range"},
		{"port too big", PodPolicy{Ingress: DirectionPolicy{Allow: []Rule{ok, ok, {CIDR: pfx("10.0.0.0/8"),
			Ports: []PortRule{{Protocol: ProtocolTCP, Port: 80}, {Protocol: ProtocolTCP, Port: 65536}}}}}}, "ingress rule 2: port 1: port 65536"},
		{"negative port", PodPolicy{Ingress: DirectionPolicy{Allow: []Rule{{CIDR: pfx("10.0.0.0/8"),
			Ports: []PortRule{{Protocol: ProtocolTCP, Port: -1}}}}}}, "ingress rule 0: port 0: port -1"},
		{"end port below port", PodPolicy{Ingress: DirectionPolicy{Allow: []Rule{{CIDR: pfx("10.0.0.0/8"),
			Ports: []PortRule{{Protocol: ProtocolTCP, Port: 80, EndPort: 79}}}}}}, "ingress rule 0: port 0: end port 79"},
		{"end port too big", PodPolicy{Ingress: DirectionPolicy{Allow: []Rule{{CIDR: pfx("10.0.0.0/8"),
			Ports: []PortRule{{Protocol: ProtocolTCP, Port: 80, EndPort: 70000}}}}}}, "ingress rule 0: port 0: end port 70000"},
		{"unknown protocol", PodPolicy{Ingress: DirectionPolicy{Allow: []Rule{{CIDR: pfx("10.0.0.0/8"),
			Ports: []PortRule{{Protocol: ProtocolICMP}}}}}}, "ingress rule 0: port 0: protocol 1: unknown protocol"},
		{"unknown action", PodPolicy{Egress: DirectionPolicy{Admin: []TierRule{{Action: ActionAccept, Rule: ok}, {Action: 9, Rule: ok}}}}, "egress admin rule 1: action 9"},
		{"bad baseline rule", PodPolicy{Egress: DirectionPolicy{Baseline: []TierRule{{Action: ActionDeny, Rule: Rule{}}}}}, "egress baseline rule 0: cidr"},
		{"too many port rules in one rule", PodPolicy{Ingress: DirectionPolicy{Isolated: true, Allow: []Rule{tooMany}}}, "ingress rule 0: ports: 10.0.0.0/8 needs 25"},
		{"too many port rules in a union", PodPolicy{Ingress: DirectionPolicy{Isolated: true, Allow: []Rule{half(1000), half(2000)}}}, "ingress rule 1: ports"},
		{"too many port rules in a tier", PodPolicy{Egress: DirectionPolicy{Admin: []TierRule{{Action: ActionPass, Rule: half(1000)}, {Action: ActionDeny, Rule: half(2000)}}}}, "egress admin rule 1: ports"},
	}
}

func TestInvalidPolicyRejectedAndInvisible(t *testing.T) {
	m := NewMemory()
	good := PodPolicy{Ingress: DirectionPolicy{Isolated: true, Allow: []Rule{{CIDR: netip.MustParsePrefix("10.0.0.0/8")}}}}
	if _, err := m.Commit(7, good); err != nil {
		t.Fatal(err)
	}
	before := m.entryCount(Ingress) + m.entryCount(Egress)
	for _, c := range badPolicies() {
		_, err := m.Commit(7, c.pol)
		if !errors.Is(err, ErrInvalidPolicy) {
			t.Errorf("%s: error %v, want ErrInvalidPolicy", c.name, err)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %q does not contain %q", c.name, err, c.want)
		}
		if n := m.entryCount(Ingress) + m.entryCount(Egress); n != before {
			t.Errorf("%s: %d entries after a rejected commit, want %d", c.name, n, before)
		}
		if !m.Verdict(7, Ingress, netip.MustParseAddr("10.1.1.1"), ProtocolTCP, 80) || m.Verdict(7, Ingress, netip.MustParseAddr("11.1.1.1"), ProtocolTCP, 80) {
			t.Errorf("%s: the committed policy changed after a rejected commit", c.name)
		}
	}
}

func TestCapacityExceeded(t *testing.T) {
	m := NewMemoryWithLimits(Limits{Pods: 2, EntriesV4: 10, EntriesV6: 10})
	big := DirectionPolicy{Isolated: true}
	for i := range 6 {
		big.Allow = append(big.Allow, Rule{CIDR: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i), 0, 0}), 16)})
	}
	if _, err := m.Commit(1, PodPolicy{Ingress: big}); err != nil {
		t.Fatal(err)
	}
	// The re-commit writes its 7 entries into the empty second set: 6 + 7 > 10.
	big2 := big
	big2.Allow = append(big2.Allow[:6:6], Rule{CIDR: netip.MustParsePrefix("10.99.0.0/16")})
	_, err := m.Commit(1, PodPolicy{Ingress: big2})
	if !errors.Is(err, ErrCapacity) || !strings.Contains(err.Error(), "ingress IPv4 trie") {
		t.Fatalf("error %v, want ErrCapacity naming the ingress IPv4 trie", err)
	}
	if m.Verdict(1, Ingress, netip.MustParseAddr("10.99.0.1"), ProtocolTCP, 1) {
		t.Fatal("rejected commit is visible")
	}
	if _, err := m.Commit(2, PodPolicy{}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Commit(3, PodPolicy{}); !errors.Is(err, ErrCapacity) {
		t.Fatalf("third pod: error %v, want ErrCapacity", err)
	}
	if got := m.Pods(); len(got) != 2 {
		t.Fatalf("pods %v after a rejected pod", got)
	}
}

func TestUnchangedCommitSkipped(t *testing.T) {
	m := NewMemory()
	g := newPolicyGen(7)
	p := g.pod()
	first, err := m.Commit(3, p)
	if err != nil {
		t.Fatal(err)
	}
	if first.Skipped {
		t.Fatal("first commit skipped")
	}
	again, err := m.Commit(3, p)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Skipped || again.EntriesWritten != 0 || again.EntriesDeleted != 0 {
		t.Fatalf("unchanged commit: %+v", again)
	}
	p.Egress.Isolated = !p.Egress.Isolated
	changed, err := m.Commit(3, p)
	if err != nil {
		t.Fatal(err)
	}
	if changed.Skipped {
		t.Fatal("changed commit skipped")
	}
}
