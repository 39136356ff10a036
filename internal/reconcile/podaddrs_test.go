package reconcile

import (
	"net/netip"
	"testing"

	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/podif"
)

// listingResolver is a lookupTableResolver that also lists each interface's host
// addresses (podif.AddrLister), as the route resolver does.
type listingResolver struct {
	*lookupTableResolver
	addrs map[int][]netip.Addr
	dumps int // HostAddrsByInterface calls
}

func (r *listingResolver) HostAddrsByInterface() (map[int][]netip.Addr, error) {
	r.dumps++
	return r.addrs, nil
}

var _ podif.AddrLister = (*listingResolver)(nil)

// TestCommitPassesPodAddrs: a commit names the pod's own addresses (anti-spoofing),
// so the dataplane lets the pod send from them and from nothing else. With a resolver
// that lists the interface's host routes, the first commit of a dual-stack pod's IPv4
// address already allows its IPv6 one; without, the addresses committed to the
// interface are its own, both once both are committed; the isolation of a pod whose
// policy could not be committed names them too.
func TestCommitPassesPodAddrs(t *testing.T) {
	pod4, pod6, other := netip.MustParseAddr("10.1.0.5"), netip.MustParseAddr("fd00::5"), netip.MustParseAddr("10.1.0.6")
	const ifindex = 7
	policy := bpfmaps.PodPolicy{Ingress: bpfmaps.DirectionPolicy{Isolated: true}}
	allowed := func(mem *bpfmaps.Memory, src netip.Addr) bool {
		dst := netip.MustParseAddr("10.2.0.1")
		if src.Is6() {
			dst = netip.MustParseAddr("fd00:2::1")
		}
		return mem.SourceAllowed(ifindex, src, dst, bpfmaps.ProtocolUDP, 1000, 53, 0)
	}
	check := func(t *testing.T, mem *bpfmaps.Memory, want map[netip.Addr]bool) {
		t.Helper()
		for src, w := range want {
			if got := allowed(mem, src); got != w {
				t.Errorf("source %s: allowed %v, want %v", src, got, w)
			}
		}
	}
	lookup := func() *lookupTableResolver {
		return newLookupTableResolver(pod4.String(), ifindex, pod6.String(), ifindex)
	}

	t.Run("listing resolver", func(t *testing.T) {
		mem := bpfmaps.NewMemory()
		r := &listingResolver{lookupTableResolver: lookup(), addrs: map[int][]netip.Addr{ifindex: {pod4, pod6}}}
		pt := newPodTable(mem, r, &counters{}, testLogger(t), nil, 0)
		res := pt.lock()
		if err := pt.commitPod(&res, pod4, &policy); err != nil {
			t.Fatal(err)
		}
		pt.mu.Unlock()
		check(t, mem, map[netip.Addr]bool{pod4: true, pod6: true, other: false})

		res = pt.lock()
		if _, err := pt.commitDeny(&res, pod4, ifindex, true, true); err != nil {
			t.Fatal(err)
		}
		pt.mu.Unlock()
		check(t, mem, map[netip.Addr]bool{pod4: true, pod6: true, other: false})
	})
	t.Run("lookup resolver", func(t *testing.T) {
		mem := bpfmaps.NewMemory()
		pt := newPodTable(mem, lookup(), &counters{}, testLogger(t), nil, 0)
		res := pt.lock()
		if err := pt.commitPod(&res, pod4, &policy); err != nil {
			t.Fatal(err)
		}
		check(t, mem, map[netip.Addr]bool{pod4: true, other: false})
		if err := pt.commitPod(&res, pod6, &policy); err != nil {
			t.Fatal(err)
		}
		if err := pt.commitPod(&res, pod4, &policy); err != nil {
			t.Fatal(err)
		}
		pt.mu.Unlock()
		check(t, mem, map[netip.Addr]bool{pod4: true, pod6: true, other: false})
	})
}

// TestPodAddrsOneDumpPerRound: a round committing a dual-stack pod's two IPs and
// another pod lists the host routes once (podif.AddrLister's dump serves every pod
// and both families); a pod whose address the round's dump lacks (its host route
// came later) makes it list again, and gets the new addresses. Each round lists
// afresh. Before, every pod IP's commit dumped the routes.
func TestPodAddrsOneDumpPerRound(t *testing.T) {
	pod4, pod6, other, late := netip.MustParseAddr("10.1.0.5"), netip.MustParseAddr("fd00::5"), netip.MustParseAddr("10.1.0.6"), netip.MustParseAddr("10.1.0.7")
	r := &listingResolver{
		lookupTableResolver: newLookupTableResolver(pod4.String(), 7, pod6.String(), 7, other.String(), 8, late.String(), 9),
		addrs:               map[int][]netip.Addr{7: {pod4, pod6}, 8: {other}},
	}
	mem := bpfmaps.NewMemory()
	pt := newPodTable(mem, r, &counters{}, testLogger(t), nil, 0)
	policy := bpfmaps.PodPolicy{Ingress: bpfmaps.DirectionPolicy{Isolated: true}}
	res := pt.lock()
	for _, pod := range []netip.Addr{pod4, pod6, other} {
		if err := pt.commitPod(&res, pod, &policy); err != nil {
			t.Fatal(err)
		}
	}
	if r.dumps != 1 {
		t.Errorf("a round of a dual-stack pod's two IPs and another pod: %d route dumps, want 1", r.dumps)
	}
	r.addrs = map[int][]netip.Addr{7: {pod4, pod6}, 8: {other}, 9: {late}}
	if err := pt.commitPod(&res, late, &policy); err != nil {
		t.Fatal(err)
	}
	pt.mu.Unlock()
	if r.dumps != 2 {
		t.Errorf("a pod the round's dump lacks: %d route dumps in all, want 2", r.dumps)
	}
	if !mem.SourceAllowed(9, late, netip.MustParseAddr("10.2.0.1"), bpfmaps.ProtocolUDP, 1000, 53, 0) ||
		!mem.SourceAllowed(7, pod6, netip.MustParseAddr("fd00:2::1"), bpfmaps.ProtocolUDP, 1000, 53, 0) {
		t.Error("a pod's own address refused as source")
	}
	res = pt.lock()
	if err := pt.commitPod(&res, pod4, &policy); err != nil {
		t.Fatal(err)
	}
	pt.mu.Unlock()
	if r.dumps != 3 {
		t.Errorf("a new round: %d route dumps in all, want 3", r.dumps)
	}
}
