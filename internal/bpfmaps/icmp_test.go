package bpfmaps

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npagent/npagent/internal/testenv/netlab"
)

// icmpError is an IP packet from src to dst: an ICMP error (ICMPv6 for IPv6
// addresses) of type typ and code quoting a packet of proto from qsrc to qdst with
// ports sport → dport (its IP header and first 8 bytes, as routers send). IPv4 uses
// mtu as the next-hop MTU of frag-needed; ICMPv6 as packet too big's MTU.
func icmpError(src, dst netip.Addr, typ, code byte, mtu uint16, qsrc, qdst netip.Addr, proto Protocol, sport, dport uint16) []byte {
	quoted := packetBytes(qsrc, qdst, proto, sport, dport)[14:]
	hlen := 20
	if qsrc.Is6() {
		hlen = 40
	}
	quoted = quoted[:hlen+8]
	icmp := []byte{typ, code, 0, 0, 0, 0, 0, 0}
	if src.Is4() {
		binary.BigEndian.PutUint16(icmp[6:], mtu)
		icmp = append(icmp, quoted...)
		binary.BigEndian.PutUint16(icmp[2:], ^checksum(icmp))
		return fixIPv4(append(packetBytes(src, dst, Protocol(255), 0, 0)[14:34:34], icmp...))
	}
	binary.BigEndian.PutUint32(icmp[4:], uint32(mtu))
	icmp = append(icmp, quoted...)
	return ipv6Chain(src, dst, nil, ProtocolICMPv6, icmp)
}

// fixIPv4 sets an IPv4 packet's protocol to ICMP and its total length.
func fixIPv4(p []byte) []byte {
	if p[0]>>4 == 4 {
		p[9] = byte(ProtocolICMP)
		binary.BigEndian.PutUint16(p[2:], uint16(len(p)))
	}
	return p
}

// checksum is the Internet checksum's one's complement sum of b (not inverted).
func checksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

// TestICMPErrorsRelated: an ICMP or ICMPv6 error from an address no policy allows
// (a router) passes an isolated direction when it quotes a connection the connection
// table tracks — one the pod opened (the quoted packet is its request) or one opened
// to it (the quoted packet is its reply) — and is dropped when it quotes an untracked
// flow, a timed-out one, or is not an error. An error the pod sends about a
// connection opened to it passes its isolated egress. Before the fix the errors were
// judged as ICMP from the router and dropped.
func TestICMPErrorsRelated(t *testing.T) {
	e := openTestEBPF(t, EBPFOptions{ConntrackTimeout: 300 * time.Millisecond})
	ifindex := dummyInterface(t)
	pod4, peer4, router4 := netip.MustParseAddr("10.255.6.1"), netip.MustParseAddr("10.1.0.5"), netip.MustParseAddr("10.9.0.1")
	pod6, peer6, router6 := netip.MustParseAddr("fd00:ff::6:1"), netip.MustParseAddr("fd00:1::5"), netip.MustParseAddr("fd00:9::1")
	tcp := func(port int32) []PortRule { return []PortRule{{Protocol: ProtocolTCP, Port: port}} }
	pol := PodPolicy{
		Ingress: DirectionPolicy{Isolated: true, Allow: []Rule{
			{CIDR: netip.MustParsePrefix("10.1.0.0/16"), Ports: tcp(8080)}, {CIDR: netip.MustParsePrefix("fd00:1::/32"), Ports: tcp(8080)},
		}},
		Egress: DirectionPolicy{Isolated: true, Allow: []Rule{
			{CIDR: netip.MustParsePrefix("10.1.0.0/16"), Ports: tcp(80)}, {CIDR: netip.MustParsePrefix("fd00:1::/32"), Ports: tcp(80)},
		}},
	}
	if _, err := e.Commit(ifindex, pol); err != nil {
		t.Fatal(err)
	}
	const (
		unreach4, fragNeeded, timeExceeded4, echo4 = 3, 4, 11, 8
		unreach6, tooBig, timeExceeded6            = 1, 2, 3
	)
	type step struct {
		name string
		out  bool // from the pod (egress program) or to it (ingress program)
		pkt  []byte
		want bool
	}
	steps := []step{
		{"frag-needed quoting a flow before it exists", false, fixIPv4(icmpError(router4, pod4, unreach4, fragNeeded, 1200, pod4, peer4, ProtocolTCP, 40000, 80)), false},
		{"PTB quoting a flow before it exists", false, icmpError(router6, pod6, tooBig, 0, 1280, pod6, peer6, ProtocolTCP, 40000, 80), false},
		{"pod opens TCP 80 (IPv4)", true, withoutEthernet(packetBytes(pod4, peer4, ProtocolTCP, 40000, 80)), true},
		{"pod opens TCP 80 (IPv6)", true, withoutEthernet(packetBytes(pod6, peer6, ProtocolTCP, 40000, 80)), true},
		{"frag-needed from a router quoting it", false, fixIPv4(icmpError(router4, pod4, unreach4, fragNeeded, 1200, pod4, peer4, ProtocolTCP, 40000, 80)), true},
		{"time exceeded quoting it", false, fixIPv4(icmpError(router4, pod4, timeExceeded4, 0, 0, pod4, peer4, ProtocolTCP, 40000, 80)), true},
		{"frag-needed from the peer itself", false, fixIPv4(icmpError(peer4, pod4, unreach4, fragNeeded, 1200, pod4, peer4, ProtocolTCP, 40000, 80)), true},
		{"PTB from a router quoting it", false, icmpError(router6, pod6, tooBig, 0, 1280, pod6, peer6, ProtocolTCP, 40000, 80), true},
		{"ICMPv6 time exceeded quoting it", false, icmpError(router6, pod6, timeExceeded6, 0, 0, pod6, peer6, ProtocolTCP, 40000, 80), true},
		{"frag-needed quoting another port (untracked)", false, fixIPv4(icmpError(router4, pod4, unreach4, fragNeeded, 1200, pod4, peer4, ProtocolTCP, 40001, 80)), false},
		{"PTB quoting another port (untracked)", false, icmpError(router6, pod6, tooBig, 0, 1280, pod6, peer6, ProtocolTCP, 40001, 80), false},
		{"frag-needed quoting UDP on the same ports", false, fixIPv4(icmpError(router4, pod4, unreach4, fragNeeded, 1200, pod4, peer4, ProtocolUDP, 40000, 80)), false},
		{"frag-needed quoting the flow reversed (a packet the pod received)", false, fixIPv4(icmpError(router4, pod4, unreach4, fragNeeded, 1200, peer4, pod4, ProtocolTCP, 80, 40000)), false},
		{"echo request from the router (not an error)", false, withoutEthernet(packetBytes(router4, pod4, ProtocolICMP, 0, 0)), false},
		// A connection opened to the pod: errors about its replies reach the pod.
		{"peer opens TCP 8080 to the pod", false, withoutEthernet(packetBytes(peer4, pod4, ProtocolTCP, 5555, 8080)), true},
		{"peer opens TCP 8080 to the pod (IPv6)", false, withoutEthernet(packetBytes(peer6, pod6, ProtocolTCP, 5555, 8080)), true},
		{"frag-needed quoting the pod's reply", false, fixIPv4(icmpError(router4, pod4, unreach4, fragNeeded, 1200, pod4, peer4, ProtocolTCP, 8080, 5555)), true},
		{"PTB quoting the pod's reply", false, icmpError(router6, pod6, tooBig, 0, 1280, pod6, peer6, ProtocolTCP, 8080, 5555), true},
		{"pod's port unreachable about the peer's packet", true, fixIPv4(icmpError(pod4, peer4, unreach4, 3, 0, peer4, pod4, ProtocolTCP, 5555, 8080)), true},
		{"pod's ICMPv6 unreachable about the peer's packet", true, icmpError(pod6, peer6, unreach6, 4, 0, peer6, pod6, ProtocolTCP, 5555, 8080), true},
		{"pod's port unreachable about an untracked packet", true, fixIPv4(icmpError(pod4, peer4, unreach4, 3, 0, peer4, pod4, ProtocolTCP, 5556, 8080)), false},
	}
	for _, s := range steps {
		prog := e.objs.ToPod
		if s.out {
			prog = e.objs.FromPod
		}
		if got := run(t, prog, ifindex, withEthernet(s.pkt)); got != s.want {
			t.Errorf("%s: passed=%v, want %v", s.name, got, s.want)
		}
	}
	time.Sleep(400 * time.Millisecond)
	if run(t, e.objs.ToPod, ifindex, withEthernet(fixIPv4(icmpError(router4, pod4, unreach4, fragNeeded, 1200, pod4, peer4, ProtocolTCP, 40000, 80)))) {
		t.Error("frag-needed passed after its connection timed out")
	}
}

func withoutEthernet(frame []byte) []byte { return frame[14:] }

// TestRealICMPErrorsRelated: a pod's ingress is isolated and allows only TCP 8080
// from the peer; its egress allows TCP 9000 to the peer. With a connection from the
// pod to the peer open, an ICMPv4 frag-needed and an ICMPv6 Packet Too Big quoting it
// reach the pod (a raw socket in the pod sees them) from the node's router address
// and from the peer, neither of which the policy allows ICMP from; the same errors
// quoting a port of no tracked connection do not. Before the fix, none reached it.
func TestRealICMPErrorsRelated(t *testing.T) {
	lab := newTrafficLab(t)
	netlab.ServeEcho(t, lab.peer, "tcp4", labPeer4+":9000")
	netlab.ServeEcho(t, lab.peer, "tcp6", "["+labPeer6+"]:9000")
	lab.enterNode(t)
	e := openTestEBPF(t, EBPFOptions{})
	peerNet4, peerNet6 := netip.MustParsePrefix("10.201.2.0/24"), netip.MustParsePrefix("fd00:201:2::/64")
	tcp := func(port int32) []PortRule { return []PortRule{{Protocol: ProtocolTCP, Port: port}} }
	pol := PodPolicy{
		Ingress: DirectionPolicy{Isolated: true, Allow: []Rule{{CIDR: peerNet4, Ports: tcp(8080)}, {CIDR: peerNet6, Ports: tcp(8080)}}},
		Egress:  DirectionPolicy{Isolated: true, Allow: []Rule{{CIDR: peerNet4, Ports: tcp(9000)}, {CIDR: peerNet6, Ports: tcp(9000)}}},
	}
	if _, err := e.Commit(lab.hostIfindex, pol); err != nil {
		t.Fatal(err)
	}
	pod4, peer4, pod6, peer6 := netip.MustParseAddr(labPod4), netip.MustParseAddr(labPeer4), netip.MustParseAddr(labPod6), netip.MustParseAddr(labPeer6)
	for _, fam := range []struct {
		name, network  string
		pod, peer      netip.Addr
		domain, proto  int
		typ, code      byte
		mtu            uint16
		ipHeader, hlen int // IP header bytes a raw socket's read starts with; quoted IP header
	}{
		{"ICMPv4 frag-needed", "tcp4", pod4, peer4, unix.AF_INET, unix.IPPROTO_ICMP, 3, 4, 1200, 20, 20},
		{"ICMPv6 packet too big", "tcp6", pod6, peer6, unix.AF_INET6, unix.IPPROTO_ICMPV6, 2, 0, 1280, 0, 40},
	} {
		// An established connection from the pod.
		conn, err := netlab.In(lab.pod, func() (net.Conn, error) {
			return net.DialTimeout(fam.network, net.JoinHostPort(fam.peer.String(), "9000"), trafficTimeout)
		})
		if err != nil {
			t.Fatalf("%s: pod → peer TCP 9000: %v", fam.name, err)
		}
		defer conn.Close()
		if _, err := conn.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(trafficTimeout))
		if _, err := conn.Read(make([]byte, 1)); err != nil {
			t.Fatalf("%s: echo over the connection: %v", fam.name, err)
		}
		lport := uint16(conn.LocalAddr().(*net.TCPAddr).Port)

		listen := rawSocket(t, lab.pod, fam.domain, unix.SOCK_RAW, fam.proto, 50*time.Millisecond)
		quoting := func(sport uint16) func([]byte) bool {
			return func(b []byte) bool {
				off := fam.ipHeader + 8 + fam.hlen
				return len(b) >= off+4 && b[fam.ipHeader] == fam.typ && b[fam.ipHeader+1] == fam.code &&
					binary.BigEndian.Uint16(b[off:]) == sport && binary.BigEndian.Uint16(b[off+2:]) == 9000
			}
		}
		for _, from := range []struct{ name, ns string }{{"router (node namespace)", lab.node}, {"peer", lab.peer}} {
			send := rawSocket(t, from.ns, fam.domain, unix.SOCK_RAW, fam.proto, time.Second)
			for _, c := range []struct {
				what  string
				sport uint16
				want  bool
			}{
				{"an untracked flow", lport + 1, false},
				{"the established flow", lport, true},
			} {
				// The source address is the sender's: icmpError's is only a placeholder.
				msg := icmpError(fam.peer, fam.pod, fam.typ, fam.code, fam.mtu, fam.pod, fam.peer, ProtocolTCP, c.sport, 9000)
				msg = msg[map[bool]int{true: 20, false: 40}[fam.pod.Is4()]:]
				var sa unix.Sockaddr
				if fam.pod.Is4() {
					sa = &unix.SockaddrInet4{Addr: fam.pod.As4()}
				} else {
					sa = &unix.SockaddrInet6{Addr: fam.pod.As16()}
				}
				// A packet the node's own stack sends and the program drops fails the
				// send with ENOBUFS (the tcx egress drop): that is a verdict, not an error.
				if err := unix.Sendto(send, msg, 0, sa); err != nil && !errors.Is(err, unix.ENOBUFS) {
					t.Fatalf("%s from %s: send: %v", fam.name, from.name, err)
				}
				if got := awaitPacket(listen, trafficTimeout, quoting(c.sport)); got != c.want {
					t.Errorf("%s from the %s quoting %s: reached the pod=%v, want %v", fam.name, from.name, c.what, got, c.want)
				}
			}
		}
	}
}

// withEchoID sets the type and identifier of the ICMP echo at off in pkt (an IP packet
// from packetBytes or icmpError); the programs read no ICMP checksum.
func withEchoID(pkt []byte, off int, typ byte, id uint16) []byte {
	pkt[off] = typ
	binary.BigEndian.PutUint16(pkt[off+4:], id)
	return pkt
}

// TestICMPErrorsQuotingEchoRelated: ICMP echoes are tracked by their identifier, and an
// ICMP or ICMPv6 error from a router passes the pod's isolated ingress when it quotes
// the echo request the pod sent (same identifier), not when it quotes one with another
// identifier or an echo reply the pod sent (a reply makes no entry). Before the fix the
// quoted echo's identifier was not read: any echo to the peer matched.
func TestICMPErrorsQuotingEchoRelated(t *testing.T) {
	e := openTestEBPF(t, EBPFOptions{})
	ifindex := dummyInterface(t)
	pod4, peer4, router4 := netip.MustParseAddr("10.255.7.1"), netip.MustParseAddr("10.1.0.5"), netip.MustParseAddr("10.9.0.1")
	pod6, peer6, router6 := netip.MustParseAddr("fd00:ff::7:1"), netip.MustParseAddr("fd00:1::5"), netip.MustParseAddr("fd00:9::1")
	pol := PodPolicy{
		Ingress: DirectionPolicy{Isolated: true},
		Egress: DirectionPolicy{Isolated: true, Allow: []Rule{
			{CIDR: netip.MustParsePrefix("10.1.0.0/16")}, {CIDR: netip.MustParsePrefix("fd00:1::/32")},
		}},
	}
	if _, err := e.Commit(ifindex, pol); err != nil {
		t.Fatal(err)
	}
	const unreach4, hostUnreach, timeExceeded6 = 3, 1, 3
	// The quoted echo's ICMP header: after the error's IP and ICMP headers and the
	// quoted IP header.
	const quoted4, quoted6 = 20 + 8 + 20, 40 + 8 + 40
	err4 := func(typ byte, id uint16) []byte {
		return withEchoID(fixIPv4(icmpError(router4, pod4, unreach4, hostUnreach, 0, pod4, peer4, ProtocolICMP, 0, 0)), quoted4, typ, id)
	}
	err6 := func(typ byte, id uint16) []byte {
		return withEchoID(icmpError(router6, pod6, timeExceeded6, 0, 0, pod6, peer6, ProtocolICMPv6, 0, 0), quoted6, typ, id)
	}
	steps := []struct {
		name string
		out  bool // from the pod (egress program) or to it (ingress program)
		pkt  []byte
		want bool
	}{
		{"pod's echo request id 7", true, withEchoID(withoutEthernet(packetBytes(pod4, peer4, ProtocolICMP, 0, 0)), 20, 8, 7), true},
		{"pod's ICMPv6 echo request id 7", true, withEchoID(withoutEthernet(packetBytes(pod6, peer6, ProtocolICMPv6, 0, 0)), 40, 128, 7), true},
		{"host unreachable quoting it", false, err4(8, 7), true},
		{"ICMPv6 time exceeded quoting it", false, err6(128, 7), true},
		{"host unreachable quoting an echo request id 8", false, err4(8, 8), false},
		{"ICMPv6 time exceeded quoting an echo request id 8", false, err6(128, 8), false},
		{"host unreachable quoting an echo reply id 7 from the pod", false, err4(0, 7), false},
		{"ICMPv6 time exceeded quoting an echo reply id 7 from the pod", false, err6(129, 7), false},
	}
	for _, s := range steps {
		prog := e.objs.ToPod
		if s.out {
			prog = e.objs.FromPod
		}
		if got := run(t, prog, ifindex, withEthernet(s.pkt)); got != s.want {
			t.Errorf("%s: passed=%v, want %v", s.name, got, s.want)
		}
	}
}
