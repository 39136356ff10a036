package bpfmaps

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
)

// IPv6 extension header types the crafted packets use.
const (
	extHop      = 0
	extRouting  = 43
	extFragment = 44
	extAuth     = 51
	extDest     = 60
)

// l4Bytes is the L4 header packetBytes writes for proto.
func l4Bytes(proto Protocol, sport, dport uint16) []byte {
	pkt := packetBytes(netip.IPv6Unspecified(), netip.IPv6Unspecified(), proto, sport, dport)
	return pkt[14+40:]
}

// extHeader is one extension header of type typ whose next header is next: 8 bytes
// (a PadN option for destination and hop-by-hop options, an empty routing header
// with no segments left), 16 for AH (no ICV), 8 for a fragment header with
// fragOffset (in 8-byte units) and the more-fragments flag.
func extHeader(typ, next byte, fragOffset uint16, more bool) []byte {
	switch typ {
	case extFragment:
		h := []byte{next, 0, 0, 0, 0, 0, 0x12, 0x34}
		v := fragOffset << 3
		if more {
			v |= 1
		}
		binary.BigEndian.PutUint16(h[2:], v)
		return h
	case extAuth:
		return []byte{next, 2, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0}
	case extRouting:
		return []byte{next, 0, 4, 0, 0, 0, 0, 0}
	}
	return []byte{next, 0, 1, 4, 0, 0, 0, 0}
}

// ipv6Chain is an IPv6 packet (no Ethernet header) from src to dst whose headers are
// exts (types, in order) then payload of protocol proto.
func ipv6Chain(src, dst netip.Addr, exts []byte, proto Protocol, payload []byte) []byte {
	var chain []byte
	for i, typ := range exts {
		next := byte(proto)
		if i+1 < len(exts) {
			next = exts[i+1]
		}
		chain = append(chain, extHeader(typ, next, 0, false)...)
	}
	first := byte(proto)
	if len(exts) > 0 {
		first = exts[0]
	}
	ip := make([]byte, 40)
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], uint16(len(chain)+len(payload)))
	ip[6] = first
	ip[7] = 64
	s, d := src.As16(), dst.As16()
	copy(ip[8:], s[:])
	copy(ip[24:], d[:])
	return append(append(ip, chain...), payload...)
}

// withEthernet puts an Ethernet header (EtherType of ip's version) before ip.
func withEthernet(ip []byte) []byte {
	eth := []byte{0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2, 0, 0}
	typ := uint16(unix.ETH_P_IPV6)
	if ip[0]>>4 == 4 {
		typ = unix.ETH_P_IP
	}
	binary.BigEndian.PutUint16(eth[12:], typ)
	return append(eth, ip...)
}

// dests is n destination options header types.
func dests(n int) []byte {
	out := make([]byte, n)
	for i := range out {
		out[i] = extDest
	}
	return out
}

// ipv4Fragment is an IPv4 packet of proto with the fragment offset (8-byte units)
// and more-fragments flag, carrying payload.
func ipv4Fragment(src, dst netip.Addr, proto Protocol, offset uint16, more bool, payload []byte) []byte {
	ip := make([]byte, 20)
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(payload)))
	v := offset
	if more {
		v |= 0x2000
	}
	binary.BigEndian.PutUint16(ip[6:], v)
	ip[8] = 64
	ip[9] = byte(proto)
	s, d := src.As4(), dst.As4()
	copy(ip[12:], s[:])
	copy(ip[16:], d[:])
	return append(ip, payload...)
}

// policed is the reference for a packet whose headers cannot be fully parsed
// (Verdict's doc): it is dropped where the direction has any policy, unless its peer
// is in the node set.
func policed(d DirectionPolicy) bool {
	return d.Isolated || len(d.Admin) > 0 || len(d.Baseline) > 0
}

// TestParseNeverMisjudges: with an admin-tier Deny for TCP 8080 to a peer (egress,
// not isolated), a SYN to 8080 is dropped whatever IPv6 extension headers come before
// its TCP header: 0 to 8 destination options headers (judged by their ports, as
// Verdict), a mixed chain with hop-by-hop, routing and AH, and chains longer than the
// walk (9, 12: not judged, dropped as the direction has a policy). Fragments: the
// first one is judged by its ports; a later one, carrying none, follows its first
// (TestFragmentsFollowTheirFirst): the one here shares its IP ID with the first
// fragment to 8081, which passed; a first fragment cut before its ports, and a
// truncated chain, are dropped. The old parser walked 4 headers and judged the rest as "protocol 60,
// port 0": 5, 6 and 8 destination options headers passed the Deny.
func TestParseNeverMisjudges(t *testing.T) {
	e := openTestEBPF(t, EBPFOptions{})
	ifindex := dummyInterface(t)
	pod4, peer4 := netip.MustParseAddr("10.255.5.1"), netip.MustParseAddr("10.1.0.5")
	pod6, peer6 := netip.MustParseAddr("fd00:ff::5:1"), netip.MustParseAddr("fd00:1::5")
	node6 := netip.MustParseAddr("fd00:99::1")
	deny := []PortRule{{Protocol: ProtocolTCP, Port: 8080}}
	pol := PodPolicy{Egress: DirectionPolicy{Admin: []TierRule{
		{Priority: 1, Action: ActionDeny, Rule: Rule{CIDR: netip.MustParsePrefix("10.1.0.0/16"), Ports: deny}},
		{Priority: 1, Action: ActionDeny, Rule: Rule{CIDR: netip.MustParsePrefix("fd00:1::/32"), Ports: deny}},
	}}}
	if _, err := e.Commit(ifindex, pol); err != nil {
		t.Fatal(err)
	}
	if err := e.SetNodeAddrs([]netip.Prefix{netip.PrefixFrom(node6, 128)}); err != nil {
		t.Fatal(err)
	}
	syn := func(port uint16) []byte { return l4Bytes(ProtocolTCP, 40000, port) }
	type step struct {
		name string
		pkt  []byte // an IP packet from the pod
		want bool
	}
	var steps []step
	for n := 0; n <= 8; n++ {
		steps = append(steps,
			step{"TCP 8080 after " + itoa(n) + " destination options headers", ipv6Chain(pod6, peer6, dests(n), ProtocolTCP, syn(8080)), false},
			step{"TCP 8081 after " + itoa(n) + " destination options headers", ipv6Chain(pod6, peer6, dests(n), ProtocolTCP, syn(8081)), true})
	}
	for _, n := range []int{9, 12} {
		steps = append(steps,
			step{"TCP 8080 after " + itoa(n) + " destination options headers (not judged)", ipv6Chain(pod6, peer6, dests(n), ProtocolTCP, syn(8080)), false},
			step{"TCP 8081 after " + itoa(n) + " destination options headers (not judged)", ipv6Chain(pod6, peer6, dests(n), ProtocolTCP, syn(8081)), false},
			step{"to a node address after " + itoa(n) + " headers (node traffic)", ipv6Chain(pod6, node6, dests(n), ProtocolTCP, syn(8080)), true})
	}
	mixed := []byte{extHop, extRouting, extAuth, extDest}
	steps = append(steps,
		step{"TCP 8080 after hop-by-hop, routing, AH, destination options", ipv6Chain(pod6, peer6, mixed, ProtocolTCP, syn(8080)), false},
		step{"TCP 8081 after hop-by-hop, routing, AH, destination options", ipv6Chain(pod6, peer6, mixed, ProtocolTCP, syn(8081)), true},
		step{"UDP 8080 after AH (the Deny names TCP)", ipv6Chain(pod6, peer6, []byte{extAuth}, ProtocolUDP, l4Bytes(ProtocolUDP, 40000, 8080)), true})

	// Fragments.
	frag := func(offset uint16, more bool, payload []byte) []byte {
		p := ipv6Chain(pod6, peer6, []byte{extDest}, ProtocolTCP, nil)
		p[6] = extFragment
		p = append(p[:40], extHeader(extFragment, extDest, offset, more)...)
		p = append(p, extHeader(extDest, byte(ProtocolTCP), 0, false)...)
		p = append(p, payload...)
		binary.BigEndian.PutUint16(p[4:], uint16(len(p)-40))
		return p
	}
	steps = append(steps,
		step{"IPv6 first fragment of TCP 8080", frag(0, true, syn(8080)), false},
		step{"IPv6 first fragment of TCP 8081", frag(0, true, syn(8081)), true},
		step{"IPv6 later fragment of the datagram to 8081", frag(2, false, make([]byte, 16)), true},
		step{"IPv6 first fragment cut before its ports", frag(0, true, syn(8080)[:2]), false},
		step{"IPv6 chain cut inside a header", ipv6Chain(pod6, peer6, dests(3), ProtocolTCP, nil)[:40+20], false},
		step{"IPv4 first fragment of TCP 8080", ipv4Fragment(pod4, peer4, ProtocolTCP, 0, true, syn(8080)), false},
		step{"IPv4 first fragment of TCP 8081", ipv4Fragment(pod4, peer4, ProtocolTCP, 0, true, syn(8081)), true},
		step{"IPv4 later fragment of the datagram to 8081", ipv4Fragment(pod4, peer4, ProtocolTCP, 3, false, make([]byte, 16)), true},
		step{"IPv4 first fragment cut before its ports", ipv4Fragment(pod4, peer4, ProtocolTCP, 0, true, syn(8080)[:2]), false},
	)
	for _, s := range steps {
		if got := run(t, e.objs.FromPod, ifindex, withEthernet(s.pkt)); got != s.want {
			t.Errorf("%s: passed=%v, want %v", s.name, got, s.want)
		}
	}

	// A direction without any policy passes what it cannot parse: nothing in it
	// could deny the packet. An isolated one drops it even from an allowed peer.
	long := withEthernet(ipv6Chain(peer6, pod6, dests(9), ProtocolTCP, syn(8080)))
	if got, want := run(t, e.objs.ToPod, ifindex, long), !policed(pol.Ingress); got != want {
		t.Errorf("unparseable packet, ingress without policy: passed=%v, want %v", got, want)
	}
	open := PodPolicy{Ingress: DirectionPolicy{Isolated: true, Allow: []Rule{{CIDR: netip.MustParsePrefix("fd00:1::/32")}}}}
	if _, err := e.Commit(ifindex, open); err != nil {
		t.Fatal(err)
	}
	if got, want := run(t, e.objs.ToPod, ifindex, long), !policed(open.Ingress); got != want {
		t.Errorf("unparseable packet, isolated ingress allowing its peer: passed=%v, want %v", got, want)
	}
	if !run(t, e.objs.ToPod, ifindex, withEthernet(ipv6Chain(peer6, pod6, dests(8), ProtocolTCP, syn(8080)))) {
		t.Error("8 destination options headers from an allowed peer: dropped, want passed")
	}
}

func itoa(n int) string {
	if n >= 10 {
		return itoa(n/10) + string(rune('0'+n%10))
	}
	return string(rune('0' + n))
}

// kernelVerdictExt is kernelVerdict with, for an IPv6 packet, 0 to 8 destination
// options headers (varying with the source port) between the IPv6 and the L4 header:
// the datapath must judge it exactly as Verdict judges the packet without them.
func (e *EBPF) kernelVerdictExt(t testing.TB, ifindex int, d Direction, pkt packet) bool {
	if pkt.peer.Is4() {
		return e.kernelVerdict(t, ifindex, d, pkt)
	}
	sport := uint16(20000 + sportSeq.Add(1)%10000)
	exts := dests(int(sport % 9))
	l4 := l4Bytes(pkt.proto, sport, pkt.port)
	if d == Ingress {
		return run(t, e.objs.ToPod, ifindex, withEthernet(ipv6Chain(pkt.peer, podAddrIngress6, exts, pkt.proto, l4)))
	}
	return run(t, e.objs.FromPod, ifindex, withEthernet(ipv6Chain(podAddrEgress6, pkt.peer, exts, pkt.proto, l4)))
}
