package bpfmaps

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
)

// countKeys counts a map's entries by walking its keys, independently of Usage.
func countKeys(t testing.TB, m *ebpf.Map) int {
	t.Helper()
	n := 0
	key := make([]byte, m.KeySize())
	var prev any // nil: the first key
	for {
		if err := m.NextKey(prev, &key); err != nil {
			return n
		}
		n++
		prev = append([]byte(nil), key...)
	}
}

// TestEBPFUsageCountsWhatTheMapsHold: Usage reports, per direction and family,
// the entries the kernel tries hold against the sizes asked for, the pods holding
// state, and the connection tables' entries against their sizes. The counts are
// checked against the kernel maps walked key by key, after commits, after
// connections were tracked, and after a removal.
func TestEBPFUsageCountsWhatTheMapsHold(t *testing.T) {
	e := openTestEBPF(t, EBPFOptions{Limits: Limits{Pods: 8, EntriesV4: 1024, EntriesV6: 512}, ConntrackEntries: 2048})
	a, b := dummyInterface(t), dummyInterface(t)
	pol, _ := restartPolicies()
	wide := widePolicy(30, 80)
	wide.Egress = pol.Egress
	for i, p := range map[int]PodPolicy{a: pol, b: wide} {
		if _, err := e.Commit(i, p); err != nil {
			t.Fatal(err)
		}
	}
	// Egress UDP from pod a: replies come back through its isolated ingress, so
	// the connections are tracked.
	for sport := range uint16(5) {
		run(t, e.objs.FromPod, a, packetBytes(podAddrEgress4, netip.MustParseAddr("10.9.0.1"), ProtocolUDP, 40000+sport, 53))
	}
	check := func(stage string, pods int) {
		t.Helper()
		u, err := e.Usage()
		if err != nil {
			t.Fatalf("%s: Usage: %v", stage, err)
		}
		tries := [2][2]*ebpf.Map{{e.objs.NpaInV4, e.objs.NpaInV6}, {e.objs.NpaEgV4, e.objs.NpaEgV6}}
		max := [2]int{1024, 512}
		for d := range tries {
			for fam := range tries[d] {
				want := MapUse{Used: countKeys(t, tries[d][fam]), Max: max[fam]}
				if u.Entries[d][fam] != want {
					t.Errorf("%s: %s family %d: %+v, want %+v (walked in the kernel)", stage, Direction(d), fam, u.Entries[d][fam], want)
				}
			}
		}
		if want := (MapUse{Used: pods, Max: 8}); u.Pods != want {
			t.Errorf("%s: pods %+v, want %+v", stage, u.Pods, want)
		}
		want := MapUse{Max: (2*2048 + 512) * pods} // two connection tables and a fragment table per pod
		for _, m := range e.ctTables {
			want.Used += countKeys(t, m)
		}
		if u.Conntrack != want || want.Used == 0 {
			t.Errorf("%s: connection table %+v, want %+v and some tracked", stage, u.Conntrack, want)
		}
	}
	check("after two commits", 2)
	if u, _ := e.Usage(); u.Entries[Ingress][0].Used < 30 {
		t.Fatalf("ingress IPv4 entries %d after committing 30 CIDRs", u.Entries[Ingress][0].Used)
	}
	if _, err := e.Remove(b); err != nil {
		t.Fatal(err)
	}
	check("after a removal", 1)
}

// TestMemoryUsage: the in-memory backend reports the same accounting (it has no
// connection table).
func TestMemoryUsage(t *testing.T) {
	m := NewMemoryWithLimits(Limits{Pods: 8, EntriesV4: 1024, EntriesV6: 512})
	if _, err := m.Commit(3, widePolicy(30, 80)); err != nil {
		t.Fatal(err)
	}
	u, err := m.Usage()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := u.Entries[Ingress][0], (MapUse{Used: len(m.maps.v4[Ingress]), Max: 1024}); got != want || got.Used < 30 {
		t.Errorf("ingress IPv4 %+v, want %+v", got, want)
	}
	if u.Entries[Ingress][1].Max != 512 || u.Pods != (MapUse{Used: 1, Max: 8}) || u.Conntrack != (MapUse{}) {
		t.Errorf("usage %+v", u)
	}
}

// TestEntriesCountsWhatACommitHolds: Entries, asked before a commit, reports per
// direction and family what the commit then holds (a first commit keeps one entry
// set), for new content, for content a pod committed (shared), and rejects an invalid
// policy as the commit does. In memory: the accounting is the core's, both backends'.
func TestEntriesCountsWhatACommitHolds(t *testing.T) {
	m := NewMemory()
	p := PodPolicy{
		Ingress: DirectionPolicy{Isolated: true, Allow: []Rule{
			{CIDR: netip.MustParsePrefix("10.1.0.0/16"), Except: []netip.Prefix{netip.MustParsePrefix("10.1.2.0/24")}},
			{CIDR: netip.MustParsePrefix("fd00:1::/64")},
		}},
		Egress: DirectionPolicy{Isolated: true, Allow: []Rule{{CIDR: netip.MustParsePrefix("10.9.0.0/16")}}},
	}
	counted, err := m.Entries(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Commit(3, p); err != nil {
		t.Fatal(err)
	}
	u := m.usage()
	for d := range counted {
		for fam := range counted[d] {
			if counted[d][fam] != u.Entries[d][fam].Used {
				t.Errorf("%s family %d: Entries %d, the commit holds %d", Direction(d), fam, counted[d][fam], u.Entries[d][fam].Used)
			}
		}
	}
	if counted == ([2][2]int{}) {
		t.Errorf("Entries counted nothing")
	}
	if again, err := m.Entries(p); err != nil || again != counted {
		t.Errorf("Entries of committed content = %v, %v; want %v", again, err, counted)
	}
	bad := p
	bad.Ingress.Allow = []Rule{{CIDR: netip.MustParsePrefix("10.1.0.0/16"), Except: []netip.Prefix{netip.MustParsePrefix("fd00::/64")}}}
	if _, err := m.Entries(bad); !errors.Is(err, ErrInvalidPolicy) {
		t.Errorf("Entries of an except of another family: %v, want ErrInvalidPolicy", err)
	}
}
