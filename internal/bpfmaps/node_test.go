package bpfmaps

import (
	"errors"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
)

// nodeTestPolicy denies everything it can: isolated both ways with no allow rules,
// and an admin Deny of every address on top.
func nodeTestPolicy() PodPolicy {
	deny := []TierRule{
		{Action: ActionDeny, Rule: Rule{CIDR: netip.MustParsePrefix("0.0.0.0/0")}},
		{Action: ActionDeny, Rule: Rule{CIDR: netip.MustParsePrefix("::/0")}},
	}
	d := DirectionPolicy{Isolated: true, Admin: deny}
	return PodPolicy{Ingress: d, Egress: d}
}

// nodeCases: peers and whether the node set {192.0.2.10, 2001:db8::10, 198.51.100.0/24,
// fd00:aa::/64} allows them.
var nodeCases = []struct {
	peer string
	node bool
}{
	{"192.0.2.10", true},
	{"192.0.2.11", false},
	{"198.51.100.77", true},
	{"198.51.101.1", false},
	{"2001:db8::10", true},
	{"2001:db8::11", false},
	{"fd00:aa::1234", true},
	{"fd00:ab::1", false},
}

var nodeCaseSet = []netip.Prefix{
	netip.MustParsePrefix("192.0.2.10/32"),
	netip.MustParsePrefix("2001:db8::10/128"),
	netip.MustParsePrefix("198.51.100.9/24"), // masked to /24
	netip.MustParsePrefix("fd00:aa::/64"),
}

// TestNodeAddrsExemptEveryTier: a peer in the node set passes both directions of a pod
// whose policy denies everything, admin Deny included; other peers stay denied. The
// in-memory backend and the kernel program agree; replacing the set drops the old
// prefixes.
func TestNodeAddrsExemptEveryTier(t *testing.T) {
	check := func(t *testing.T, dp Dataplane, verdict func(ifindex int, d Direction, pkt packet) bool, ifindex int) {
		if _, err := dp.Commit(ifindex, nodeTestPolicy()); err != nil {
			t.Fatal(err)
		}
		for _, c := range nodeCases {
			for _, d := range []Direction{Ingress, Egress} {
				pkt := packet{peer: netip.MustParseAddr(c.peer), proto: ProtocolTCP, port: 8080}
				if got := verdict(ifindex, d, pkt); got {
					t.Errorf("%s %s before any node set: allowed", d, c.peer)
				}
			}
		}
		if err := dp.(NodeExemption).SetNodeAddrs(nodeCaseSet); err != nil {
			t.Fatal(err)
		}
		for _, c := range nodeCases {
			for _, d := range []Direction{Ingress, Egress} {
				for _, pkt := range []packet{
					{peer: netip.MustParseAddr(c.peer), proto: ProtocolTCP, port: 8080},
					{peer: netip.MustParseAddr(c.peer), proto: ProtocolUDP, port: 53},
				} {
					if got := verdict(ifindex, d, pkt); got != c.node {
						t.Errorf("%s %s %v/%d: allowed %v, want %v", d, c.peer, pkt.proto, pkt.port, got, c.node)
					}
				}
			}
		}
		// Replace: only 192.0.2.11 now.
		if err := dp.(NodeExemption).SetNodeAddrs([]netip.Prefix{netip.MustParsePrefix("192.0.2.11/32")}); err != nil {
			t.Fatal(err)
		}
		for _, c := range nodeCases {
			pkt := packet{peer: netip.MustParseAddr(c.peer), proto: ProtocolTCP, port: 8080}
			if got, want := verdict(ifindex, Ingress, pkt), c.peer == "192.0.2.11"; got != want {
				t.Errorf("after the replace: %s allowed %v, want %v", c.peer, got, want)
			}
		}
	}
	t.Run("memory", func(t *testing.T) {
		m := NewMemory()
		check(t, m, func(ifindex int, d Direction, pkt packet) bool {
			return m.Verdict(ifindex, d, pkt.peer, pkt.proto, pkt.port)
		}, 1)
	})
	t.Run("kernel", func(t *testing.T) {
		e := openTestEBPF(t, EBPFOptions{})
		check(t, e, func(ifindex int, d Direction, pkt packet) bool {
			return e.kernelVerdict(t, ifindex, d, pkt)
		}, dummyInterface(t))
		got, err := e.NodeAddrs()
		if err != nil || !slices.Equal(got, []netip.Prefix{netip.MustParsePrefix("192.0.2.11/32")}) {
			t.Fatalf("node tries hold %v (%v), want only 192.0.2.11/32", got, err)
		}
	})
}

// TestSetNodeAddrsInput: prefixes are masked, unmapped and deduplicated; invalid
// ones and more than the trie holds are refused.
func TestSetNodeAddrsInput(t *testing.T) {
	got, err := normalizeNodePrefixes([]netip.Prefix{
		netip.MustParsePrefix("::ffff:10.0.0.7/128"),
		netip.MustParsePrefix("10.0.0.7/32"),
		netip.MustParsePrefix("10.1.2.3/16"),
		netip.MustParsePrefix("fe80::1/128"),
		netip.MustParsePrefix("fe80::1/128"),
	})
	want := []netip.Prefix{
		netip.MustParsePrefix("10.0.0.7/32"),
		netip.MustParsePrefix("10.1.0.0/16"),
		netip.MustParsePrefix("fe80::1/128"),
	}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("normalized %v (%v), want %v", got, err, want)
	}
	if _, err := normalizeNodePrefixes([]netip.Prefix{{}}); !errors.Is(err, ErrInvalidPolicy) {
		t.Errorf("zero prefix: %v, want ErrInvalidPolicy", err)
	}
	many := make([]netip.Prefix, MaxNodePrefixes+1)
	for i := range many {
		many[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 9, byte(i >> 8), byte(i)}), 32)
	}
	if _, err := normalizeNodePrefixes(many); !errors.Is(err, ErrCapacity) {
		t.Errorf("%d prefixes: %v, want ErrCapacity", len(many), err)
	}
}

// TestSetNodeAddrsNoWindow: while the node set is replaced again and again by sets
// that all hold 192.0.2.10, a packet from it is never dropped.
func TestSetNodeAddrsNoWindow(t *testing.T) {
	e := openTestEBPF(t, EBPFOptions{})
	ifindex := dummyInterface(t)
	if _, err := e.Commit(ifindex, nodeTestPolicy()); err != nil {
		t.Fatal(err)
	}
	sets := [2][]netip.Prefix{
		{netip.MustParsePrefix("192.0.2.10/32"), netip.MustParsePrefix("198.51.100.0/24")},
		{netip.MustParsePrefix("192.0.2.10/32"), netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("2001:db8::/64")},
	}
	if err := e.SetNodeAddrs(sets[0]); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var dropped, probes atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		pkt := packetBytes(netip.MustParseAddr("192.0.2.10"), podAddrIngress4, ProtocolTCP, 40000, 8080)
		for !stop.Load() {
			if !run(t, e.objs.ToPod, ifindex, pkt) {
				dropped.Add(1)
			}
			probes.Add(1)
		}
	})
	for i := range 300 {
		if err := e.SetNodeAddrs(sets[i%2]); err != nil {
			t.Error(err)
			break
		}
	}
	stop.Store(true)
	wg.Wait()
	if dropped.Load() > 0 {
		t.Fatalf("%d of %d packets from a node address in every set dropped during replaces", dropped.Load(), probes.Load())
	}
	t.Logf("%d packets during 300 replaces, none dropped", probes.Load())
}
