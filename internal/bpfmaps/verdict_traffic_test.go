package bpfmaps

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npagent/npagent/internal/testenv/netlab"
)

// verdictTally is a snapshot of the verdict counters by what they credit.
type verdictTally map[string]uint64

// verdictName names a count: direction, reason, and the rule or sources credited.
func verdictName(c VerdictCount) string {
	s := fmt.Sprintf("%s %s", c.Direction, c.Reason)
	if c.Rule != (Origin{}) {
		s += fmt.Sprintf(" rule %s#%d", c.Rule.Name, c.Rule.Index)
	}
	for _, o := range c.Sources {
		s += " by " + o.Name
	}
	if c.Audited {
		s += " audited"
	}
	if !c.Attributed {
		s += " unattributed"
	}
	return s
}

func readTally(t *testing.T, e *EBPF, ifindex int) verdictTally {
	t.Helper()
	vc, err := e.Verdicts()
	if err != nil {
		t.Fatal(err)
	}
	if vc.Lost != 0 {
		t.Errorf("%d packets' verdicts lost", vc.Lost)
	}
	out := verdictTally{}
	for _, c := range vc.Counts {
		if c.Ifindex == ifindex {
			out[verdictName(c)] += c.Packets
		}
	}
	return out
}

// settleVerdicts waits until the pod's counters stay still for a second: the lab's
// fresh interfaces send IPv6 multicast listener reports (judged by the policy: the
// isolated directions deny them) for a few seconds after they come up.
func settleVerdicts(t *testing.T, e *EBPF, ifindex int) {
	t.Helper()
	last := readTally(t, e, ifindex)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		time.Sleep(time.Second)
		now := readTally(t, e, ifindex)
		if len(now.sub(last)) == 0 {
			return
		}
		last = now
	}
	t.Fatal("the pod's verdict counters did not settle within 10s")
}

// sub returns what t counted since before, for the names that changed.
func (t verdictTally) sub(before verdictTally) verdictTally {
	out := verdictTally{}
	for k, v := range t {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// TestRealTrafficVerdictCounts sends real packets (UDP, TCP, ICMP; IPv4 and IPv6)
// between a pod and a peer through the node and checks that each is counted once,
// under the reason, rule and objects that decided it: a namespaced allow (credited
// to the direction's objects), an admin Accept and Deny (credited to the rule), the
// default deny (credited to the isolating objects), and the replies that passed the
// isolated egress by connection state.
func TestRealTrafficVerdictCounts(t *testing.T) {
	lab := newTrafficLab(t)
	for _, a := range []struct{ network, addr string }{
		{"udp4", labPod4 + ":5353"}, {"udp6", "[" + labPod6 + "]:5353"},
		{"udp4", labPod4 + ":5355"}, {"udp6", "[" + labPod6 + "]:5355"},
		{"tcp4", labPod4 + ":8080"}, {"tcp6", "[" + labPod6 + "]:8080"},
	} {
		netlab.ServeEcho(t, lab.pod, a.network, a.addr)
	}
	lab.enterNode(t)
	e := openTestEBPF(t, EBPFOptions{})
	peers := func(ports ...PortRule) []Rule {
		return []Rule{{CIDR: labPeerNet4, Ports: ports}, {CIDR: labPeerNet6, Ports: ports}}
	}
	udp := func(port int32) PortRule { return PortRule{Protocol: ProtocolUDP, Port: port} }
	objA := Origin{UID: "uid-a", Kind: "PolicyEndpoint", Namespace: "ns", Name: "a", Index: -1}
	admin := Origin{UID: "uid-c", Kind: "ClusterPolicyEndpoint", Name: "c"}
	adminDeny, adminAccept := admin, admin
	adminDeny.Index, adminAccept.Index = 0, 1
	pol := PodPolicy{
		Ingress: DirectionPolicy{
			Isolated: true, Sources: []Origin{objA},
			Allow: peers(udp(5353), PortRule{Protocol: ProtocolTCP, Port: 8080}),
			Admin: []TierRule{
				// Given out of priority order: ids follow the priority order.
				{Priority: 20, Action: ActionAccept, Rule: Rule{CIDR: netip.MustParsePrefix("::/0"), Ports: []PortRule{udp(5355)}}, Origin: adminAccept},
				{Priority: 10, Action: ActionDeny, Rule: Rule{CIDR: netip.MustParsePrefix("0.0.0.0/0"), Ports: []PortRule{udp(5354)}}, Origin: adminDeny},
				{Priority: 10, Action: ActionDeny, Rule: Rule{CIDR: netip.MustParsePrefix("::/0"), Ports: []PortRule{udp(5354)}}, Origin: adminDeny},
				{Priority: 20, Action: ActionAccept, Rule: Rule{CIDR: netip.MustParsePrefix("0.0.0.0/0"), Ports: []PortRule{udp(5355)}}, Origin: adminAccept},
			},
		},
		Egress: DirectionPolicy{Isolated: true, Sources: []Origin{objA}},
	}
	if _, err := e.Commit(lab.hostIfindex, pol); err != nil {
		t.Fatal(err)
	}
	settleVerdicts(t, e, lab.hostIfindex)
	const n = 3
	for _, fam := range []struct {
		name, pod, udp, tcp string
		v6                  bool
	}{
		{"IPv4", labPod4, "udp4", "tcp4", false},
		{"IPv6", "[" + labPod6 + "]", "udp6", "tcp6", true},
	} {
		exchange := func(network string, port int, want bool) {
			t.Helper()
			err := netlab.Exchange(lab.peer, network, fmt.Sprintf("%s:%d", fam.pod, port), trafficTimeout)
			if (err == nil) != want {
				t.Fatalf("%s %s %d: exchange error %v, want passed=%v", fam.name, network, port, err, want)
			}
		}
		phase := func(what string, send func(), want verdictTally) {
			t.Helper()
			before := readTally(t, e, lab.hostIfindex)
			send()
			got := readTally(t, e, lab.hostIfindex).sub(before)
			for k, v := range want {
				if got[k] != v {
					t.Errorf("%s, %s: %q counted %d, want %d (all: %v)", fam.name, what, k, got[k], v, got)
				}
			}
			for k := range got {
				if _, ok := want[k]; !ok && k != "egress ndp" && k != "ingress ndp" && k != "egress arp" && k != "ingress arp" {
					t.Errorf("%s, %s: unexpected count %q: %d (all: %v)", fam.name, what, k, got[k], got)
				}
			}
		}
		phase("UDP allowed by a namespaced rule", func() {
			for range n {
				exchange(fam.udp, 5353, true)
			}
		}, verdictTally{"ingress policy_allow by a": n, "egress conntrack_reply": n})
		phase("UDP denied by an admin rule", func() {
			for range n {
				exchange(fam.udp, 5354, false)
			}
		}, verdictTally{"ingress admin_deny rule c#0": n})
		phase("UDP accepted by an admin rule", func() {
			for range n {
				exchange(fam.udp, 5355, true)
			}
		}, verdictTally{"ingress admin_accept rule c#1": n, "egress conntrack_reply": n})
		phase("UDP denied by default", func() {
			for range n {
				exchange(fam.udp, 5356, false)
			}
		}, verdictTally{"ingress default_deny by a": n})
		// One SYN per attempt: the timeout is shorter than the first retransmission.
		phase("TCP denied by default", func() { exchange(fam.tcp, 8081, false) }, verdictTally{"ingress default_deny by a": 1})
		phase("ICMP echo denied by default", func() {
			domain, proto, typ := unix.AF_INET, unix.IPPROTO_ICMP, byte(8)
			if fam.v6 {
				domain, proto, typ = unix.AF_INET6, unix.IPPROTO_ICMPV6, 128
			}
			fd := rawSocket(t, lab.peer, domain, unix.SOCK_RAW, proto, time.Second)
			for i := range n {
				if err := unix.Sendto(fd, echoMessage(fam.v6, typ, 0x4e70, uint16(i)), 0, labSockaddr(labAddr(labPod4, labPod6)(fam.v6))); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(100 * time.Millisecond)
		}, verdictTally{"ingress default_deny by a": n})
		// TCP allowed: every packet of the connection toward the pod counted as allowed,
		// every packet back as a reply; how many depends on the stacks.
		before := readTally(t, e, lab.hostIfindex)
		exchange(fam.tcp, 8080, true)
		time.Sleep(100 * time.Millisecond)
		got := readTally(t, e, lab.hostIfindex).sub(before)
		if got["ingress policy_allow by a"] < 3 || got["egress conntrack_reply"] < 2 {
			t.Errorf("%s TCP allowed: counted %v, want a connection's packets under policy_allow and conntrack_reply", fam.name, got)
		}
		delete(got, "ingress policy_allow by a")
		delete(got, "egress conntrack_reply")
		for k := range got {
			if k != "egress ndp" && k != "ingress ndp" && k != "egress arp" && k != "ingress arp" {
				t.Errorf("%s TCP allowed: unexpected count %q: %d", fam.name, k, got[k])
			}
		}
	}
	// A removed pod's counts go with it: a later pod on its ifindex starts at zero.
	if _, err := e.Remove(lab.hostIfindex); err != nil {
		t.Fatal(err)
	}
	if got := readTally(t, e, lab.hostIfindex); len(got) != 0 {
		t.Errorf("after Remove: counts %v, want none", got)
	}
}

// TestRealTrafficVerdictsAcrossCommit streams UDP datagrams to the pod while a commit
// replaces the allowing object by one that does not allow them. Every datagram is
// counted exactly once, under the commit that judged it: those the pod received as
// allowed by the first object, the others as denied by the second object's default
// deny — none credited to the commit that did not judge it, none lost or counted
// twice.
func TestRealTrafficVerdictsAcrossCommit(t *testing.T) {
	lab := newTrafficLab(t)
	lab.enterNode(t)
	e := openTestEBPF(t, EBPFOptions{})
	for _, fam := range []struct {
		name, network, pod string
	}{
		{"IPv4", "udp4", labPod4 + ":6000"},
		{"IPv6", "udp6", "[" + labPod6 + "]:6000"},
	} {
		objA := Origin{UID: "uid-a-" + fam.name, Kind: "PolicyEndpoint", Namespace: "ns", Name: "a", Index: -1}
		objB := Origin{UID: "uid-b-" + fam.name, Kind: "PolicyEndpoint", Namespace: "ns", Name: "b", Index: -1}
		allowing := PodPolicy{Ingress: DirectionPolicy{Isolated: true, Sources: []Origin{objA},
			Allow: []Rule{{CIDR: labPeerNet4, Ports: []PortRule{{Protocol: ProtocolUDP, Port: 6000}}}, {CIDR: labPeerNet6, Ports: []PortRule{{Protocol: ProtocolUDP, Port: 6000}}}}}}
		denying := PodPolicy{Ingress: DirectionPolicy{Isolated: true, Sources: []Origin{objB},
			Allow: []Rule{{CIDR: labPeerNet4, Ports: []PortRule{{Protocol: ProtocolUDP, Port: 6001}}}, {CIDR: labPeerNet6, Ports: []PortRule{{Protocol: ProtocolUDP, Port: 6001}}}}}}
		if _, err := e.Commit(lab.hostIfindex, allowing); err != nil {
			t.Fatal(err)
		}
		settleVerdicts(t, e, lab.hostIfindex)
		pc, err := netlab.In(lab.pod, func() (net.PacketConn, error) { return net.ListenPacket(fam.network, fam.pod) })
		if err != nil {
			t.Fatal(err)
		}
		var received atomic.Int64
		done := make(chan struct{})
		go func() {
			defer close(done)
			buf := make([]byte, 64)
			for {
				if _, _, err := pc.ReadFrom(buf); err != nil {
					return
				}
				received.Add(1)
			}
		}()
		c, err := netlab.In(lab.peer, func() (net.Conn, error) { return net.Dial(fam.network, fam.pod) })
		if err != nil {
			t.Fatal(err)
		}
		before := readTally(t, e, lab.hostIfindex)
		sent := 0
		send := func(k int) {
			for range k {
				if _, err := c.Write([]byte("npagent")); err != nil {
					if !errors.Is(err, unix.ECONNREFUSED) {
						t.Error(err)
						return
					}
					continue // an earlier error reported: this datagram was not sent
				}
				sent++
				time.Sleep(20 * time.Microsecond)
			}
		}
		send(200)
		stop := make(chan struct{})
		go func() { // keep streaming while the commit switches
			defer close(stop)
			send(400)
		}()
		time.Sleep(2 * time.Millisecond)
		if _, err := e.Commit(lab.hostIfindex, denying); err != nil {
			t.Fatal(err)
		}
		<-stop
		send(200)
		time.Sleep(200 * time.Millisecond)
		_ = c.Close()
		_ = pc.Close()
		<-done
		got := readTally(t, e, lab.hostIfindex).sub(before)
		allowed, denied := got["ingress policy_allow by a"], got["ingress default_deny by b"]
		if allowed != uint64(received.Load()) {
			t.Errorf("%s: %d datagrams counted as allowed by a, the pod received %d (all: %v)", fam.name, allowed, received.Load(), got)
		}
		if allowed+denied != uint64(sent) {
			t.Errorf("%s: %d allowed by a + %d denied by b, want the %d sent (all: %v)", fam.name, allowed, denied, sent, got)
		}
		if allowed < 200 || denied < 200 {
			t.Errorf("%s: %d allowed, %d denied: want at least the 200 sent before and after the commit each", fam.name, allowed, denied)
		}
		// The first commit's keys are folded into user space and deleted once they
		// held still for a read: the totals stay as they were, and the map keeps only
		// the commit in force.
		after := readTally(t, e, lab.hostIfindex)
		if again := readTally(t, e, lab.hostIfindex); !maps.Equal(after, again) {
			t.Errorf("%s: totals moved while folding: %v, then %v", fam.name, after, again)
		}
		cur := uint32(e.pods[uint32(lab.hostIfindex)].state.Dir[Ingress])
		var k policyVerdictKey
		var vals []policyVerdictValue
		for it := e.objs.NpaVerdicts.Iterate(); it.Next(&k, &vals); {
			if int(k.Ifindex) == lab.hostIfindex && k.Dir == uint8(Ingress) && k.Gen != cur {
				t.Errorf("%s: a key of a retired commit is still in the map after two reads: %+v", fam.name, k)
			}
		}
		for k, v := range got {
			if k != "ingress policy_allow by a" && k != "ingress default_deny by b" && k != "ingress ndp" && k != "egress ndp" &&
				k != "ingress arp" && k != "egress arp" && k != "egress no_policy" {
				t.Errorf("%s: unexpected count %q: %d", fam.name, k, v)
			}
		}
	}
}

// TestRealTrafficAuditMode: in audit mode a packet the policy denies passes and is
// counted as a would-be denial under what denied it; the packets it allows are
// counted as usual. Opening the dataplane again without it (an agent restart without
// --audit-mode) enforces at once: the same packets are dropped and counted as denied.
func TestRealTrafficAuditMode(t *testing.T) {
	lab := newTrafficLab(t)
	for _, a := range []struct{ network, addr string }{
		{"udp4", labPod4 + ":5353"}, {"udp4", labPod4 + ":5354"}, {"udp6", "[" + labPod6 + "]:5354"},
	} {
		netlab.ServeEcho(t, lab.pod, a.network, a.addr)
	}
	lab.enterNode(t)
	pin := testPinPath(t)
	e := openTestEBPF(t, EBPFOptions{PinPath: pin, Audit: true})
	objA := Origin{UID: "uid-a", Kind: "PolicyEndpoint", Namespace: "ns", Name: "a", Index: -1}
	pol := PodPolicy{Ingress: DirectionPolicy{Isolated: true, Sources: []Origin{objA},
		Allow: []Rule{{CIDR: labPeerNet4, Ports: []PortRule{{Protocol: ProtocolUDP, Port: 5353}}}}}}
	if _, err := e.Commit(lab.hostIfindex, pol); err != nil {
		t.Fatal(err)
	}
	settleVerdicts(t, e, lab.hostIfindex)
	exchange := func(network, addr string, want bool) {
		t.Helper()
		if err := netlab.Exchange(lab.peer, network, addr, trafficTimeout); (err == nil) != want {
			t.Fatalf("%s %s: exchange error %v, want passed=%v", network, addr, err, want)
		}
	}
	before := readTally(t, e, lab.hostIfindex)
	const n = 3
	for range n {
		exchange("udp4", labPod4+":5354", true) // denied by the policy: passes
		exchange("udp6", "["+labPod6+"]:5354", true)
		exchange("udp4", labPod4+":5353", true) // allowed
	}
	got := readTally(t, e, lab.hostIfindex).sub(before)
	if got["ingress default_deny by a audited"] != 2*n || got["ingress policy_allow by a"] != n || got["ingress default_deny by a"] != 0 {
		t.Errorf("audit mode: counted %v, want %d would-be denials and %d allowed", got, 2*n, n)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}

	e = openTestEBPF(t, EBPFOptions{PinPath: pin})
	if _, err := e.Commit(lab.hostIfindex, pol); err != nil { // unchanged: names what it credits
		t.Fatal(err)
	}
	before = readTally(t, e, lab.hostIfindex)
	exchange("udp4", labPod4+":5354", false)
	exchange("udp6", "["+labPod6+"]:5354", false)
	exchange("udp4", labPod4+":5353", true)
	got = readTally(t, e, lab.hostIfindex).sub(before)
	if got["ingress default_deny by a"] != 2 || got["ingress default_deny by a audited"] != 0 || got["ingress policy_allow by a"] != 1 {
		t.Errorf("audit mode off: counted %v, want 2 denied and 1 allowed", got)
	}
}
