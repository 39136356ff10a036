package bpfmaps

import (
	"errors"
	"net/netip"
	"slices"
	"testing"
)

// podAddrKeys is what the kernel's address map holds for a pod: its addresses and
// whether its marker is there.
func (e *EBPF) podAddrKeys(t *testing.T, ifindex int) (addrs []netip.Addr, marker bool) {
	t.Helper()
	var k policyAddrKey
	var v uint8
	it := e.objs.NpaPodAddrs.Iterate()
	for it.Next(&k, &v) {
		if k.Ifindex != uint32(ifindex) {
			continue
		}
		if a := addrOf(k); a.IsValid() {
			addrs = append(addrs, a)
		} else {
			marker = true
		}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	return addrs, marker
}

// TestCommitAddrs: a pod's addresses are part of what a commit compares (a change
// alone recommits and writes only them; the same set in another order is skipped),
// are validated, land in the kernel's address map with the pod's marker, survive a
// restart (an unchanged re-commit after it is skipped) and go with Remove.
func TestCommitAddrs(t *testing.T) {
	a4, b4 := netip.MustParseAddr("10.1.0.1"), netip.MustParseAddr("10.1.0.2")
	a6 := netip.MustParseAddr("fd00::1")
	pol := PodPolicy{Ingress: DirectionPolicy{Isolated: true}}
	with := func(addrs ...netip.Addr) PodPolicy { p := pol; p.Addrs = addrs; return p }
	steps := []struct {
		what    string
		p       PodPolicy
		skipped bool
		want    []netip.Addr
	}{
		{"first", with(a6, a4), false, []netip.Addr{a4, a6}},
		{"same, other order, v4-mapped", with(netip.AddrFrom16(a4.As16()), a6, a4), true, []netip.Addr{a4, a6}},
		{"one more", with(a4, a6, b4), false, []netip.Addr{a4, b4, a6}},
		{"one less", with(b4), false, []netip.Addr{b4}},
		{"none", pol, false, nil},
		{"again", with(a4), false, []netip.Addr{a4}},
	}
	pin := testPinPath(t)
	e := openTestEBPF(t, EBPFOptions{PinPath: pin})
	ifindex := dummyInterface(t)
	for _, dp := range []Dataplane{NewMemory(), e} {
		for _, s := range steps {
			res, err := dp.Commit(ifindex, s.p)
			if err != nil {
				t.Fatalf("%T %s: %v", dp, s.what, err)
			}
			if res.Skipped != s.skipped {
				t.Errorf("%T %s: skipped=%v, want %v", dp, s.what, res.Skipped, s.skipped)
			}
			if s.skipped == false && s.what != "first" && res.EntriesWritten != 0 {
				t.Errorf("%T %s: %d entries written for an address change", dp, s.what, res.EntriesWritten)
			}
			if k, ok := dp.(*EBPF); ok {
				got, marker := k.podAddrKeys(t, ifindex)
				if !slices.Equal(got, s.want) || marker != (len(s.want) > 0) {
					t.Errorf("%s: address map holds %v (marker %v), want %v", s.what, got, marker, s.want)
				}
			}
		}
		for _, bad := range [][]netip.Addr{
			{netip.IPv4Unspecified()}, {netip.MustParseAddr("ff02::1")}, {{}},
			{a4, b4, a6, netip.MustParseAddr("10.1.0.3"), netip.MustParseAddr("10.1.0.4"), netip.MustParseAddr("10.1.0.5"),
				netip.MustParseAddr("10.1.0.6"), netip.MustParseAddr("10.1.0.7"), netip.MustParseAddr("10.1.0.8")},
		} {
			if _, err := dp.Commit(ifindex, with(bad...)); !errors.Is(err, ErrInvalidPolicy) {
				t.Errorf("%T addresses %v: %v, want ErrInvalidPolicy", dp, bad, err)
			}
		}
	}

	// A restart adopts the addresses: the same commit is skipped.
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e2 := openTestEBPF(t, EBPFOptions{PinPath: pin})
	if res, err := e2.Commit(ifindex, with(a4)); err != nil || !res.Skipped {
		t.Errorf("after a restart, the same commit: skipped=%v, %v; want skipped", res.Skipped, err)
	}
	if _, err := e2.Remove(ifindex); err != nil {
		t.Fatal(err)
	}
	if got, marker := e2.podAddrKeys(t, ifindex); len(got) > 0 || marker {
		t.Errorf("after Remove the address map holds %v (marker %v)", got, marker)
	}
}
