package bpfmaps

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// TestConntrackReplies: replies of a connection the pod's egress policy allowed pass its
// isolated ingress; unsolicited packets and connections the policy does not allow from
// the other side do not; replies stop passing after the connection times out.
func TestConntrackReplies(t *testing.T) {
	e := openTestEBPF(t, EBPFOptions{ConntrackTimeout: 300 * time.Millisecond})
	ifindex := dummyInterface(t)
	pod := netip.MustParseAddr("10.255.3.1")
	peer := netip.MustParseAddr("10.1.0.5")
	pod6 := netip.MustParseAddr("fd00:ff::3:1")
	peer6 := netip.MustParseAddr("fd00:1::5")
	pol := PodPolicy{
		Ingress: DirectionPolicy{Isolated: true},
		Egress: DirectionPolicy{Isolated: true, Allow: []Rule{
			{CIDR: netip.MustParsePrefix("10.1.0.0/16"), Ports: []PortRule{{Protocol: ProtocolTCP, Port: 80}}},
			{CIDR: netip.MustParsePrefix("fd00:1::/32"), Ports: []PortRule{{Protocol: ProtocolUDP, Port: 53}}},
		}},
	}
	if _, err := e.Commit(ifindex, pol); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name string
		out  bool // from the pod (egress program) or to it (ingress program)
		pkt  []byte
		want bool
	}{
		{"reply before any request", false, packetBytes(peer, pod, ProtocolTCP, 80, 40000), false},
		{"request allowed by egress policy", true, packetBytes(pod, peer, ProtocolTCP, 40000, 80), true},
		{"reply passes isolated ingress", false, packetBytes(peer, pod, ProtocolTCP, 80, 40000), true},
		{"same peer, other pod port", false, packetBytes(peer, pod, ProtocolTCP, 80, 40001), false},
		{"same ports, other protocol", false, packetBytes(peer, pod, ProtocolUDP, 80, 40000), false},
		{"peer opens a connection to the pod", false, packetBytes(peer, pod, ProtocolTCP, 5555, 80), false},
		{"pod answers it: egress policy denies port 5555", true, packetBytes(pod, peer, ProtocolTCP, 80, 5555), false},
		{"IPv6 request", true, packetBytes(pod6, peer6, ProtocolUDP, 41000, 53), true},
		{"IPv6 reply", false, packetBytes(peer6, pod6, ProtocolUDP, 53, 41000), true},
		{"IPv6 ICMP not allowed out", true, packetBytes(pod6, peer6, ProtocolICMPv6, 0, 0), false},
	}
	for _, s := range steps {
		prog := e.objs.ToPod
		if s.out {
			prog = e.objs.FromPod
		}
		if got := run(t, prog, ifindex, s.pkt); got != s.want {
			t.Errorf("%s: passed=%v, want %v", s.name, got, s.want)
		}
	}
	time.Sleep(400 * time.Millisecond)
	if run(t, e.objs.ToPod, ifindex, packetBytes(peer, pod, ProtocolTCP, 80, 40000)) {
		t.Error("reply passed after the connection timed out")
	}
}

// TestCommitAtomicUnderTraffic flips a pod between two policies while packets stream
// through the program: every verdict must be one of the two policies' verdicts.
func TestCommitAtomicUnderTraffic(t *testing.T) {
	e := openTestEBPF(t, EBPFOptions{})
	ifindex := dummyInterface(t)
	g := newPolicyGen(42)
	type probe struct {
		d        Direction
		pkt      packet
		okA, okB bool
	}
	var a, b PodPolicy
	var probes []probe
	differ := 0
	for differ < 40 { // draw policy pairs until they disagree on enough packets
		a, b = g.pod(), g.pod()
		probes, differ = probes[:0], 0
		for range 200 {
			pkt := g.packet()
			for _, d := range []Direction{Ingress, Egress} {
				p := probe{d: d, pkt: pkt, okA: referenceVerdict(a, d, pkt), okB: referenceVerdict(b, d, pkt)}
				if p.okA != p.okB {
					differ++
				}
				probes = append(probes, p)
			}
		}
	}
	if _, err := e.Commit(ifindex, a); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var runs, bad atomic.Int64
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; !stop.Load(); i++ {
				p := probes[i%len(probes)]
				got := e.kernelVerdict(t, ifindex, p.d, p.pkt)
				if got != p.okA && got != p.okB {
					bad.Add(1)
					t.Errorf("%s %v %v/%d: verdict %v, neither policy gives it", p.d, p.pkt.peer, p.pkt.proto, p.pkt.port, got)
				}
				runs.Add(1)
			}
		}()
	}
	flips := 0
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) && bad.Load() == 0 {
		next := b
		if flips%2 == 1 {
			next = a
		}
		if _, err := e.Commit(ifindex, next); err != nil {
			stop.Store(true)
			wg.Wait()
			t.Fatal(err)
		}
		flips++
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d commits, %d packets (%d probes, %d where the policies differ)", flips, runs.Load(), len(probes), differ)
	if flips < 10 || runs.Load() < int64(len(probes)) {
		t.Fatalf("too little overlap to say anything: %d commits, %d packets", flips, runs.Load())
	}
}

// TestFragmentsFollowTheirFirst: in an isolated direction a later fragment (no
// ports) passes only if the first fragment of its datagram (same addresses,
// protocol and IP ID) passed, within the fragment timeout; IPv4 and IPv6. A
// direction without any policy passes it. Before, a later fragment was judged as
// port 0 by the policy alone.
func TestFragmentsFollowTheirFirst(t *testing.T) {
	e := openTestEBPF(t, EBPFOptions{ConntrackFragmentTimeout: 300 * time.Millisecond})
	ifindex := dummyInterface(t)
	pod4, peer4 := netip.MustParseAddr("10.255.7.1"), netip.MustParseAddr("10.1.0.5")
	pod6, peer6 := netip.MustParseAddr("fd00:ff::7:1"), netip.MustParseAddr("fd00:1::5")
	udp := func(port int32) []PortRule { return []PortRule{{Protocol: ProtocolUDP, Port: port}} }
	pol := PodPolicy{Egress: DirectionPolicy{Isolated: true, Allow: []Rule{
		{CIDR: netip.MustParsePrefix("10.1.0.0/16"), Ports: udp(5353)}, {CIDR: netip.MustParsePrefix("fd00:1::/32"), Ports: udp(5353)},
	}}}
	if _, err := e.Commit(ifindex, pol); err != nil {
		t.Fatal(err)
	}
	v4 := func(id uint16, offset uint16, more bool, port uint16) []byte {
		p := ipv4Fragment(pod4, peer4, ProtocolUDP, offset, more, l4Bytes(ProtocolUDP, 40000, port))
		binary.BigEndian.PutUint16(p[4:], id)
		return withEthernet(p)
	}
	v6 := func(id uint32, offset uint16, more bool, port uint16) []byte {
		p := ipv6Chain(pod6, peer6, nil, ProtocolUDP, nil)
		p[6] = extFragment
		h := extHeader(extFragment, byte(ProtocolUDP), offset, more)
		binary.BigEndian.PutUint32(h[4:], id)
		p = append(append(p, h...), l4Bytes(ProtocolUDP, 40000, port)...)
		binary.BigEndian.PutUint16(p[4:], uint16(len(p)-40))
		return withEthernet(p)
	}
	steps := []struct {
		name string
		pkt  []byte
		want bool
	}{
		{"IPv4 later fragment before its first", v4(7, 3, false, 0), false},
		{"IPv4 first fragment to the allowed port", v4(7, 0, true, 5353), true},
		{"IPv4 its later fragment", v4(7, 3, true, 0), true},
		{"IPv4 its last fragment", v4(7, 6, false, 0), true},
		{"IPv4 later fragment of another datagram", v4(8, 3, false, 0), false},
		{"IPv4 first fragment to a denied port", v4(9, 0, true, 5354), false},
		{"IPv4 its later fragment", v4(9, 3, false, 0), false},
		{"IPv6 first fragment to the allowed port", v6(70000, 0, true, 5353), true},
		{"IPv6 its later fragment", v6(70000, 3, false, 0), true},
		{"IPv6 later fragment of another datagram", v6(70001, 3, false, 0), false},
		{"IPv6 first fragment to a denied port", v6(70002, 0, true, 5354), false},
		{"IPv6 its later fragment", v6(70002, 3, false, 0), false},
	}
	for _, s := range steps {
		if got := run(t, e.objs.FromPod, ifindex, s.pkt); got != s.want {
			t.Errorf("%s: passed=%v, want %v", s.name, got, s.want)
		}
	}
	time.Sleep(400 * time.Millisecond)
	if run(t, e.objs.FromPod, ifindex, v4(7, 3, false, 0)) {
		t.Error("IPv4 later fragment passed after the fragment timeout")
	}
	if !run(t, e.objs.ToPod, ifindex, withEthernet(ipv4Fragment(peer4, pod4, ProtocolUDP, 3, false, make([]byte, 8)))) {
		t.Error("later fragment into the open ingress: dropped, want passed")
	}
}

// TestConntrackTCPStates: an entry's timeout follows the TCP flags seen both ways.
// After a RST (from either side) or a FIN from each side, replies stop passing once
// the short timeout passed; a FIN from one side only (half-closed) keeps the idle
// timeout; a new SYN on the same ports starts afresh. Before, every entry lived for
// the idle timeout whatever the flags.
func TestConntrackTCPStates(t *testing.T) {
	const short = 200 * time.Millisecond
	e := openTestEBPF(t, EBPFOptions{ConntrackClosingTimeout: short, ConntrackResetTimeout: short})
	ifindex := dummyInterface(t)
	pod, peer := netip.MustParseAddr("10.255.8.1"), netip.MustParseAddr("10.1.0.5")
	pol := PodPolicy{Ingress: DirectionPolicy{Isolated: true},
		Egress: DirectionPolicy{Isolated: true, Allow: []Rule{{CIDR: netip.MustParsePrefix("10.1.0.0/16"), Ports: []PortRule{{Protocol: ProtocolTCP, Port: 80}}}}}}
	if _, err := e.Commit(ifindex, pol); err != nil {
		t.Fatal(err)
	}
	const syn, ack, fin, rst = 0x02, 0x10, 0x01, 0x04
	seg := func(out bool, sport uint16, flags byte) bool {
		t.Helper()
		if out {
			p := packetBytes(pod, peer, ProtocolTCP, sport, 80)
			p[14+20+13] = flags
			return run(t, e.objs.FromPod, ifindex, p)
		}
		p := packetBytes(peer, pod, ProtocolTCP, 80, sport)
		p[14+20+13] = flags
		return run(t, e.objs.ToPod, ifindex, p)
	}
	// Four connections: reset by the peer, closed both ways, half-closed, reset then
	// opened again on the same ports.
	for _, sport := range []uint16{41000, 41001, 41002, 41003} {
		if !seg(true, sport, syn) || !seg(false, sport, syn|ack) || !seg(true, sport, ack) {
			t.Fatalf("port %d: handshake did not pass", sport)
		}
	}
	seg(false, 41000, rst|ack)
	seg(true, 41001, fin|ack)
	seg(false, 41001, fin|ack)
	seg(true, 41002, fin|ack)
	seg(true, 41003, rst)
	if !seg(true, 41003, syn) || !seg(false, 41003, syn|ack) {
		t.Fatal("port 41003: the new handshake did not pass")
	}
	time.Sleep(short + 100*time.Millisecond)
	for _, c := range []struct {
		name  string
		sport uint16
		want  bool
	}{
		{"reset by the peer", 41000, false},
		{"FIN from each side", 41001, false},
		{"FIN from the pod only (half-closed)", 41002, true},
		{"reset, then a new SYN on the same ports", 41003, true},
	} {
		if got := seg(false, c.sport, ack); got != c.want {
			t.Errorf("%s: a reply %v later passed=%v, want %v", c.name, short+100*time.Millisecond, got, c.want)
		}
	}
}

// TestConntrackEntryRefreshedAfterNow: an entry another CPU refreshed after this
// packet's program read the clock (its last_seen_ns later than the program's now) is
// live. The unsigned difference made it 2^64 ns old: a busy connection's reply was
// dropped now and then.
func TestConntrackEntryRefreshedAfterNow(t *testing.T) {
	e := openTestEBPF(t, EBPFOptions{})
	ifindex := dummyInterface(t)
	pod, peer := netip.MustParseAddr("10.255.9.1"), netip.MustParseAddr("10.1.0.5")
	pol := PodPolicy{Ingress: DirectionPolicy{Isolated: true},
		Egress: DirectionPolicy{Isolated: true, Allow: []Rule{{CIDR: netip.MustParsePrefix("10.1.0.0/16"), Ports: []PortRule{{Protocol: ProtocolTCP, Port: 80}}}}}}
	if _, err := e.Commit(ifindex, pol); err != nil {
		t.Fatal(err)
	}
	if !run(t, e.objs.FromPod, ifindex, packetBytes(pod, peer, ProtocolTCP, 42000, 80)) {
		t.Fatal("the request did not pass")
	}
	e.mu.Lock()
	table := e.ctTables[ctRefOf(uint32(ifindex), ctOpenedByEgress)]
	e.mu.Unlock()
	var (
		key    policyCtKey
		val    policyCtValue
		cursor ebpf.MapBatchCursor
		keys   = make([]policyCtKey, ctBatch)
		vals   = make([]policyCtValue, ctBatch)
	)
	n, err := table.BatchLookup(&cursor, keys, vals, nil)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("%d entries after one request, want 1", n)
	}
	key, val = keys[0], vals[0]
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	val.LastSeenNs = uint64(ts.Nano()) + uint64(time.Second) // refreshed "after" the reply's now
	if err := table.Put(&key, &val); err != nil {
		t.Fatal(err)
	}
	if !run(t, e.objs.ToPod, ifindex, packetBytes(peer, pod, ProtocolTCP, 80, 42000)) {
		t.Error("the reply was dropped: an entry refreshed after the program read the clock counted as timed out")
	}
	use, err := e.conntrackUse()
	if err != nil {
		t.Fatal(err)
	}
	if use.Used != 1 {
		t.Errorf("conntrack use counts %d live entries, want 1", use.Used)
	}
}

// TestOpenRemovesLegacyConntrack: the connection state older builds pinned (the
// shared table, the one-table-per-pod map of maps and its tables, whose values are
// 16 bytes where this build's are 24) is removed at open rather than adopted (the
// per-pod tables would not fit this build's map of maps); a pod committed afterwards
// gets its three tables, and Usage counts their capacity.
func TestOpenRemovesLegacyConntrack(t *testing.T) {
	requireKernel(t)
	pin := testPinPath(t)
	if err := os.MkdirAll(filepath.Join(pin, "ct"), 0o700); err != nil {
		t.Fatal(err)
	}
	table := &ebpf.MapSpec{Type: ebpf.LRUHash, KeySize: 48, ValueSize: 16, MaxEntries: 16}
	for _, name := range []string{"npa_ct", "ct/7"} {
		m, err := ebpf.NewMap(table)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Pin(filepath.Join(pin, name)); err != nil {
			t.Fatal(err)
		}
		_ = m.Close()
	}
	outer, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.HashOfMaps, KeySize: 4, MaxEntries: 4, InnerMap: table})
	if err != nil {
		t.Fatal(err)
	}
	if err := outer.Pin(filepath.Join(pin, "npa_ct_pods")); err != nil {
		t.Fatal(err)
	}
	_ = outer.Close()
	e := openTestEBPF(t, EBPFOptions{PinPath: pin, ConntrackEntries: 64})
	for _, name := range legacyConntrackPins {
		if _, err := os.Stat(filepath.Join(pin, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s of an older build still pinned (%v)", name, err)
		}
	}
	ifindex := dummyInterface(t)
	if _, err := e.Commit(ifindex, PodPolicy{Ingress: DirectionPolicy{Isolated: true}}); err != nil {
		t.Fatal(err)
	}
	for _, k := range ctKinds {
		if _, err := os.Stat(ctPinPath(pin, ctRefOf(uint32(ifindex), k))); err != nil {
			t.Errorf("%s table: %v", k, err)
		}
	}
	if u, err := e.Usage(); err != nil || u.Conntrack.Max != 64+64+16 {
		t.Errorf("Usage: conntrack %+v, %v; want a capacity of 64+64+16", u.Conntrack, err)
	}
}

// ctCount counts the entries of a pod's table of kind k.
func ctCount(t *testing.T, e *EBPF, ifindex int, k ctKind) (n int, states []uint32) {
	t.Helper()
	var key policyCtKey
	var v policyCtValue
	it := e.ctTables[ctRefOf(uint32(ifindex), k)].Iterate()
	for it.Next(&key, &v) {
		n++
		states = append(states, v.State)
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n, states
}

// TestConntrackAnswersOpenNothing: both directions isolated, the ingress allowing TCP
// 8080 from the peers, the egress allowing everything to them. Connections peers
// open (a SYN each) make entries in the pod's table of connections its ingress
// allowed; the pod's answers, which its egress allows too (SYN-ACK, data, and a RST
// to a port nothing listens on), make none in its table of connections it opened
// (they would evict its own flows), and the answers mark the peers' entries
// answered. Before, every packet the egress allowed made an entry there.
func TestConntrackAnswersOpenNothing(t *testing.T) {
	e := openTestEBPF(t, EBPFOptions{})
	ifindex := dummyInterface(t)
	pod, peer := netip.MustParseAddr("10.255.10.1"), netip.MustParseAddr("10.1.0.5")
	peers := netip.MustParsePrefix("10.1.0.0/16")
	pol := PodPolicy{Ingress: DirectionPolicy{Isolated: true, Allow: []Rule{{CIDR: peers, Ports: []PortRule{{Protocol: ProtocolTCP, Port: 8080}}}}},
		Egress: DirectionPolicy{Isolated: true, Allow: []Rule{{CIDR: peers}}}}
	if _, err := e.Commit(ifindex, pol); err != nil {
		t.Fatal(err)
	}
	const syn, ack, rst = 0x02, 0x10, 0x04
	seg := func(out bool, sport, dport uint16, flags byte) bool {
		src, dst, prog := peer, pod, e.objs.ToPod
		if out {
			src, dst, prog = pod, peer, e.objs.FromPod
		}
		p := packetBytes(src, dst, ProtocolTCP, sport, dport)
		p[14+20+13] = flags
		return run(t, prog, ifindex, p)
	}
	for port := uint16(30000); port < 30010; port++ {
		if !seg(false, port, 8080, syn) || !seg(true, 8080, port, syn|ack) || !seg(true, 8080, port, ack) {
			t.Fatalf("port %d: the peer's SYN or the pod's answers did not pass", port)
		}
	}
	if !seg(true, 9999, 30100, rst|ack) {
		t.Fatal("the pod's RST did not pass")
	}
	if n, _ := ctCount(t, e, ifindex, ctOpenedByEgress); n != 0 {
		t.Errorf("%d entries in the table of connections the pod opened, want 0: answers open nothing", n)
	}
	n, states := ctCount(t, e, ifindex, ctOpenedByIngress)
	if n != 10 {
		t.Errorf("%d entries in the table of connections peers opened, want the 10 SYNs'", n)
	}
	for _, st := range states {
		if st&ctReplied == 0 {
			t.Errorf("a peer's entry in state %#x: the pod's answer did not mark it answered", st)
		}
	}
}
