package bpfmaps

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npagent/npagent/internal/testenv/netlab"
)

// Real-packet tests of connection tracking (issue 10): the lab of traffic_test.go,
// the programs attached to the pod's host-side veth (and, for the per-pod bound, to
// the peer's as a second pod).

var (
	labPeerNet4 = netip.MustParsePrefix("10.201.2.0/24")
	labPeerNet6 = netip.MustParsePrefix("fd00:201:2::/64")
	labPodNet4  = netip.MustParsePrefix("10.201.1.0/24")
	labPodNet6  = netip.MustParsePrefix("fd00:201:1::/64")
)

func tcpPorts(port int32) []PortRule { return []PortRule{{Protocol: ProtocolTCP, Port: port}} }

// conntrackUsed is the connection tables' live entries (Usage).
func conntrackUsed(t *testing.T, e *EBPF) int {
	t.Helper()
	u, err := e.Usage()
	if err != nil {
		t.Fatal(err)
	}
	return u.Conntrack.Used
}

// ctEntriesByDir counts a pod's connection table entries by the direction that
// allowed their connection (fragment entries apart), walking the tables.
func ctEntriesByDir(t *testing.T, e *EBPF, ifindex int) [2]int {
	t.Helper()
	var n [2]int
	for _, kind := range []ctKind{ctOpenedByIngress, ctOpenedByEgress} {
		var k policyCtKey
		var v policyCtValue
		it := e.ctTables[ctRefOf(uint32(ifindex), kind)].Iterate()
		for it.Next(&k, &v) {
			if k.Dir != uint8(kind) {
				t.Errorf("an entry of direction %d in the table of kind %s", k.Dir, kind)
			}
			n[kind]++
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// TestRealConntrackOnlyWhereRepliesNeedIt: a pod whose ingress is open exchanges
// UDP and TCP, IPv4 and IPv6, with a peer its isolated egress allows. Its requests
// make no entry: the replies pass the open ingress without one. (The replies, which
// the open ingress allows, make entries for the isolated egress, as a connection
// opened to the pod would need.) Once its ingress is isolated too, the requests make
// entries, and the exchanges pass. Usage counts what the table holds. Before, every
// allowed packet made an entry, the requests' four included.
func TestRealConntrackOnlyWhereRepliesNeedIt(t *testing.T) {
	lab := newTrafficLab(t)
	netlab.ServeEcho(t, lab.peer, "udp4", labPeer4+":5353")
	netlab.ServeEcho(t, lab.peer, "udp6", "["+labPeer6+"]:5353")
	netlab.ServeEcho(t, lab.peer, "tcp4", labPeer4+":9000")
	netlab.ServeEcho(t, lab.peer, "tcp6", "["+labPeer6+"]:9000")
	lab.enterNode(t)
	e := openTestEBPF(t, EBPFOptions{})
	egress := DirectionPolicy{Isolated: true, Allow: []Rule{
		{CIDR: labPeerNet4, Ports: []PortRule{{Protocol: ProtocolUDP, Port: 5353}, {Protocol: ProtocolTCP, Port: 9000}}},
		{CIDR: labPeerNet6, Ports: []PortRule{{Protocol: ProtocolUDP, Port: 5353}, {Protocol: ProtocolTCP, Port: 9000}}},
	}}
	exchange := func(stage string) [2]int {
		t.Helper()
		for _, f := range []struct{ network, addr string }{
			{"udp4", labPeer4 + ":5353"}, {"udp6", "[" + labPeer6 + "]:5353"},
			{"tcp4", labPeer4 + ":9000"}, {"tcp6", "[" + labPeer6 + "]:9000"},
		} {
			if err := netlab.Exchange(lab.pod, f.network, f.addr, trafficTimeout); err != nil {
				t.Errorf("%s: pod → peer %s %s: %v", stage, f.network, f.addr, err)
			}
		}
		n := ctEntriesByDir(t, e, lab.hostIfindex)
		if used := conntrackUsed(t, e); used != n[Ingress]+n[Egress] {
			t.Errorf("%s: Usage counts %d live entries, the table holds %v", stage, used, n)
		}
		return n
	}
	if _, err := e.Commit(lab.hostIfindex, PodPolicy{Egress: egress}); err != nil {
		t.Fatal(err)
	}
	if n := exchange("ingress open"); n[Egress] != 0 {
		t.Errorf("ingress open: %d entries for connections the egress allowed, want none (their replies pass the open ingress)", n[Egress])
	}
	if _, err := e.Commit(lab.hostIfindex, PodPolicy{Ingress: DirectionPolicy{Isolated: true}, Egress: egress}); err != nil {
		t.Fatal(err)
	}
	if n := exchange("ingress isolated"); n[Egress] != 4 {
		t.Errorf("ingress isolated: %d entries for connections the egress allowed, want the 4 (their replies need them)", n[Egress])
	}
}

// TestRealConntrackTCPClose: connections from the pod to the peer, IPv4 and IPv6,
// through an isolated ingress. One closed normally (a FIN from each side) leaves
// the live count after the closing timeout; one reset by the pod (SO_LINGER 0: a
// RST) after the default reset timeout (seconds); an idle open one stays, and its
// replies still pass. Before, each stayed for the 5-minute idle timeout.
func TestRealConntrackTCPClose(t *testing.T) {
	lab := newTrafficLab(t)
	netlab.ServeEcho(t, lab.peer, "tcp4", labPeer4+":9000")
	netlab.ServeEcho(t, lab.peer, "tcp6", "["+labPeer6+"]:9000")
	lab.enterNode(t)
	const closing = time.Second
	e := openTestEBPF(t, EBPFOptions{ConntrackClosingTimeout: closing})
	pol := PodPolicy{Ingress: DirectionPolicy{Isolated: true},
		Egress: DirectionPolicy{Isolated: true, Allow: []Rule{{CIDR: labPeerNet4, Ports: tcpPorts(9000)}, {CIDR: labPeerNet6, Ports: tcpPorts(9000)}}}}
	if _, err := e.Commit(lab.hostIfindex, pol); err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct{ network, addr string }{{"tcp4", labPeer4 + ":9000"}, {"tcp6", "[" + labPeer6 + "]:9000"}} {
		dial := func() *net.TCPConn {
			t.Helper()
			c, err := netlab.In(lab.pod, func() (net.Conn, error) { return net.DialTimeout(f.network, f.addr, trafficTimeout) })
			if err != nil {
				t.Fatalf("%s: dial: %v", f.network, err)
			}
			echo(t, c, "hello")
			return c.(*net.TCPConn)
		}
		before := conntrackUsed(t, e)
		fin := dial()
		_ = fin.Close()
		time.Sleep(100 * time.Millisecond) // the peer's FIN and the last ACK
		rst := dial()
		_ = rst.SetLinger(0)
		_ = rst.Close()
		open := dial()
		defer open.Close()
		if n := conntrackUsed(t, e) - before; n != 3 {
			t.Errorf("%s: %d live entries right after the three connections, want 3", f.network, n)
		}
		time.Sleep(closing + 200*time.Millisecond)
		if n := conntrackUsed(t, e) - before; n != 2 {
			t.Errorf("%s: %d live entries %v after a FIN from each side, want 2 (the reset and the open connection)", f.network, n, closing)
		}
		time.Sleep(DefaultConntrackResetTimeout - closing)
		if n := conntrackUsed(t, e) - before; n != 1 {
			t.Errorf("%s: %d live entries %v after the RST, want 1 (the open connection)", f.network, n, DefaultConntrackResetTimeout)
		}
		echo(t, open, "still open")
	}
}

// echo writes msg on c and reads it back.
func echo(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(trafficTimeout))
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len(msg))
	if _, err := c.Read(buf); err != nil || string(buf) != msg {
		t.Fatalf("echo of %q: %q, %v", msg, buf, err)
	}
}

// TestRealConntrackPerPodBound: the peer is a second pod. It holds a TCP connection
// to the first pod's port 9000 that its egress allows; its ingress is isolated, so
// the answers need its entry. With tables of 256 entries, the first pod sends UDP to
// 2000 ports of the peer, four packets each (its egress is open, its ingress isolated: 2000 entries)
// between the peer's request and its answer: the answer still reaches the peer. In
// the shared table of before, the flood evicted the peer's entry and the answer was
// dropped.
func TestRealConntrackPerPodBound(t *testing.T) {
	lab := newTrafficLab(t)
	lab.enterNode(t)
	h2, err := net.InterfaceByName("h2") // the peer's host-side veth
	if err != nil {
		t.Fatal(err)
	}
	e := openTestEBPF(t, EBPFOptions{ConntrackEntries: 256})
	pod := PodPolicy{Ingress: DirectionPolicy{Isolated: true, Allow: []Rule{{CIDR: labPeerNet4, Ports: tcpPorts(9000)}, {CIDR: labPeerNet6, Ports: tcpPorts(9000)}}}}
	peer := PodPolicy{Ingress: DirectionPolicy{Isolated: true},
		Egress: DirectionPolicy{Isolated: true, Allow: []Rule{{CIDR: labPodNet4, Ports: tcpPorts(9000)}, {CIDR: labPodNet6, Ports: tcpPorts(9000)}}}}
	if _, err := e.Commit(lab.hostIfindex, pod); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Commit(h2.Index, peer); err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct {
		network, pod, peer string
	}{{"4", labPod4, labPeer4}, {"6", labPod6, labPeer6}} {
		ln, err := netlab.In(lab.pod, func() (net.Listener, error) {
			return net.Listen("tcp"+f.network, net.JoinHostPort(f.pod, "9000"))
		})
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		accepted := make(chan net.Conn, 1)
		go func() {
			c, err := ln.Accept()
			if err == nil {
				accepted <- c
			}
		}()
		client, err := netlab.In(lab.peer, func() (net.Conn, error) {
			return net.DialTimeout("tcp"+f.network, net.JoinHostPort(f.pod, "9000"), trafficTimeout)
		})
		if err != nil {
			t.Fatalf("IPv%s: peer → pod TCP 9000: %v", f.network, err)
		}
		defer client.Close()
		server := <-accepted
		defer server.Close()
		if _, err := client.Write([]byte("request")); err != nil {
			t.Fatal(err)
		}
		_ = server.SetReadDeadline(time.Now().Add(trafficTimeout))
		if _, err := server.Read(make([]byte, 7)); err != nil {
			t.Fatalf("IPv%s: request: %v", f.network, err)
		}

		flood, err := netlab.In(lab.pod, func() (net.PacketConn, error) { return net.ListenPacket("udp"+f.network, net.JoinHostPort(f.pod, "0")) })
		if err != nil {
			t.Fatal(err)
		}
		// Four packets per flow: the kernel's LRU keeps an entry that was used again
		// (the peer's) ahead of ones used once.
		for port := 1000; port < 3000; port++ {
			dst := &net.UDPAddr{IP: net.ParseIP(f.peer), Port: port}
			for range 4 {
				if _, err := flood.WriteTo([]byte("x"), dst); err != nil {
					t.Fatalf("IPv%s: flood: %v", f.network, err)
				}
			}
		}
		_ = flood.Close()

		if _, err := server.Write([]byte("answer")); err != nil {
			t.Fatal(err)
		}
		_ = client.SetReadDeadline(time.Now().Add(2 * trafficTimeout))
		buf := make([]byte, 6)
		if _, err := client.Read(buf); err != nil || string(buf) != "answer" {
			t.Errorf("IPv%s: the answer after the other pod's 2000 flows: %q, %v; want it to reach the peer", f.network, buf, err)
		}
	}
}

// serveBigEcho echoes UDP datagrams of up to 64 KiB on addr in namespace ns.
func serveBigEcho(t *testing.T, ns, network, addr string) {
	t.Helper()
	pc, err := netlab.In(ns, func() (net.PacketConn, error) { return net.ListenPacket(network, addr) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pc.Close() })
	go func() {
		buf := make([]byte, 65536)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(buf[:n], from)
		}
	}()
}

// TestRealFragments: every link has an MTU of 1280, so the 3000-byte UDP datagrams
// travel as fragments. The pod's egress allows UDP to the peer on all ports but an
// admin-tier Deny names UDP 5354; its ingress is isolated. A datagram to 5353 and its
// echo arrive whole (the echo's later fragments follow its first, which passed as a
// reply), IPv4 and IPv6; of a datagram to 5354 no fragment reaches the peer. With
// an allow rule for UDP 5353 only, the echo still arrives whole. Before, later
// fragments were judged as port 0: the denied datagram's passed the Deny (which
// names a port), and with the rule naming 5353 the allowed datagram's were dropped. (With fragment entries that expire at once, the echo fails:
// the fragments do cross the programs.)
func TestRealFragments(t *testing.T) {
	lab := newTrafficLab(t)
	for _, l := range []struct{ ns, dev string }{{lab.node, "h1"}, {lab.node, "h2"}, {lab.pod, "eth0"}, {lab.peer, "eth0"}} {
		netlab.Run(t, "ip", "-n", l.ns, "link", "set", l.dev, "mtu", "1280")
	}
	for _, port := range []string{"5353", "5354"} {
		serveBigEcho(t, lab.peer, "udp4", labPeer4+":"+port)
		serveBigEcho(t, lab.peer, "udp6", "["+labPeer6+"]:"+port)
	}
	lab.enterNode(t)
	e := openTestEBPF(t, EBPFOptions{})
	udp := []PortRule{{Protocol: ProtocolUDP}}
	deny := []PortRule{{Protocol: ProtocolUDP, Port: 5354}}
	pol := PodPolicy{Ingress: DirectionPolicy{Isolated: true},
		Egress: DirectionPolicy{Isolated: true, Allow: []Rule{{CIDR: labPeerNet4, Ports: udp}, {CIDR: labPeerNet6, Ports: udp}},
			Admin: []TierRule{
				{Priority: 1, Action: ActionDeny, Rule: Rule{CIDR: labPeerNet4, Ports: deny}},
				{Priority: 1, Action: ActionDeny, Rule: Rule{CIDR: labPeerNet6, Ports: deny}},
			}}}
	if _, err := e.Commit(lab.hostIfindex, pol); err != nil {
		t.Fatal(err)
	}
	peerIf, err := netlab.In(lab.peer, func() (*net.Interface, error) { return net.InterfaceByName("eth0") })
	if err != nil {
		t.Fatal(err)
	}
	payload := bytes.Repeat([]byte("0123456789abcdef"), 3000/16)
	// echoWhole sends a 3000-byte datagram from the pod to peer's UDP 5353 and wants
	// its echo back whole.
	echoWhole := func(network, peer, what string) {
		t.Helper()
		c, err := netlab.In(lab.pod, func() (net.Conn, error) { return net.Dial(network, net.JoinHostPort(peer, "5353")) })
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(2 * trafficTimeout))
		buf := make([]byte, 65536)
		if _, err := c.Write(payload); err != nil {
			t.Fatal(err)
		}
		if n, err := c.Read(buf); err != nil || !bytes.Equal(buf[:n], payload) {
			t.Errorf("%s: 3000-byte datagram %s: echo of %d bytes, %v; want it whole", network, what, n, err)
		}
	}
	for _, f := range []struct {
		network, peer string
		pod           netip.Addr
		ethType       uint16
	}{{"udp4", labPeer4, netip.MustParseAddr(labPod4), unix.ETH_P_IP}, {"udp6", labPeer6, netip.MustParseAddr(labPod6), unix.ETH_P_IPV6}} {
		echoWhole(f.network, f.peer, "to the allowed port 5353")

		listen := rawSocket(t, lab.peer, unix.AF_PACKET, unix.SOCK_RAW, int(htons(f.ethType)), 50*time.Millisecond)
		if err := unix.Bind(listen, &unix.SockaddrLinklayer{Protocol: htons(f.ethType), Ifindex: peerIf.Index}); err != nil {
			t.Fatal(err)
		}
		denied, err := netlab.In(lab.pod, func() (net.Conn, error) { return net.Dial(f.network, net.JoinHostPort(f.peer, "5354")) })
		if err != nil {
			t.Fatal(err)
		}
		defer denied.Close()
		if _, err := denied.Write(payload); err != nil {
			t.Fatal(err)
		}
		fragmentFromPod := func(b []byte) bool {
			ip := b[14:]
			if f.pod.Is4() {
				return len(ip) >= 20 && netip.AddrFrom4([4]byte(ip[12:16])) == f.pod && binary.BigEndian.Uint16(ip[6:])&0x3fff != 0
			}
			return len(ip) >= 40 && netip.AddrFrom16([16]byte(ip[8:24])) == f.pod && ip[6] == extFragment
		}
		if awaitPacket(listen, trafficTimeout, fragmentFromPod) {
			t.Errorf("%s: a fragment of the datagram to the denied port 5354 reached the peer", f.network)
		}
	}

	// An allow rule naming the port: the later fragments, which carry none, pass
	// with their first.
	pol.Egress = DirectionPolicy{Isolated: true, Allow: []Rule{
		{CIDR: labPeerNet4, Ports: []PortRule{{Protocol: ProtocolUDP, Port: 5353}}},
		{CIDR: labPeerNet6, Ports: []PortRule{{Protocol: ProtocolUDP, Port: 5353}}},
	}}
	if _, err := e.Commit(lab.hostIfindex, pol); err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct{ network, peer string }{{"udp4", labPeer4}, {"udp6", labPeer6}} {
		echoWhole(f.network, f.peer, "allowed to UDP 5353 only")
	}
}

// TestRealICMPv6ErrorQuotingExtensionHeaders: with a connection from the pod to the
// peer open, an ICMPv6 Packet Too Big from the node (a router the policy does not
// allow) quoting the connection's packet with one or two Destination Options headers
// before its TCP header reaches the pod, as one quoting it without them does; one
// quoting a port of no tracked connection does not. Before, the quoted header's
// protocol was taken as 60 (destination options) and the error was dropped.
func TestRealICMPv6ErrorQuotingExtensionHeaders(t *testing.T) {
	lab := newTrafficLab(t)
	netlab.ServeEcho(t, lab.peer, "tcp6", "["+labPeer6+"]:9000")
	lab.enterNode(t)
	e := openTestEBPF(t, EBPFOptions{})
	pol := PodPolicy{Ingress: DirectionPolicy{Isolated: true},
		Egress: DirectionPolicy{Isolated: true, Allow: []Rule{{CIDR: labPeerNet6, Ports: tcpPorts(9000)}}}}
	if _, err := e.Commit(lab.hostIfindex, pol); err != nil {
		t.Fatal(err)
	}
	pod6, peer6 := netip.MustParseAddr(labPod6), netip.MustParseAddr(labPeer6)
	conn, err := netlab.In(lab.pod, func() (net.Conn, error) {
		return net.DialTimeout("tcp6", net.JoinHostPort(labPeer6, "9000"), trafficTimeout)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	echo(t, conn, "x")
	lport := uint16(conn.LocalAddr().(*net.TCPAddr).Port)

	listen := rawSocket(t, lab.pod, unix.AF_INET6, unix.SOCK_RAW, unix.IPPROTO_ICMPV6, 50*time.Millisecond)
	send := rawSocket(t, lab.node, unix.AF_INET6, unix.SOCK_RAW, unix.IPPROTO_ICMPV6, time.Second)
	const tooBig = 2
	for _, c := range []struct {
		exts  int
		sport uint16
		want  bool
	}{{0, lport, true}, {1, lport, true}, {2, lport, true}, {1, lport + 1, false}} {
		quoted := ipv6Chain(pod6, peer6, dests(c.exts), ProtocolTCP, l4Bytes(ProtocolTCP, c.sport, 9000)[:8])
		msg := append([]byte{tooBig, 0, 0, 0, 0, 0, 0x05, 0x00}, quoted...) // MTU 1280; the kernel fills the checksum
		if err := unix.Sendto(send, msg, 0, &unix.SockaddrInet6{Addr: pod6.As16()}); err != nil && !errors.Is(err, unix.ENOBUFS) {
			t.Fatal(err)
		}
		at := 8 + 40 + 8*c.exts
		got := awaitPacket(listen, trafficTimeout, func(b []byte) bool {
			return len(b) >= at+4 && b[0] == tooBig && binary.BigEndian.Uint16(b[at:]) == c.sport && binary.BigEndian.Uint16(b[at+2:]) == 9000
		})
		if got != c.want {
			what := "the open connection"
			if c.sport != lport {
				what = "an untracked port"
			}
			t.Errorf("Packet Too Big quoting %s after %d destination options headers: reached the pod=%v, want %v", what, c.exts, got, c.want)
		}
	}
}

// echoMessage is an ICMP (v6: ICMPv6) echo message of type typ with identifier id; an
// ICMPv6 raw socket fills in the checksum itself.
func echoMessage(v6 bool, typ byte, id, seq uint16) []byte {
	m := []byte{typ, 0, 0, 0, byte(id >> 8), byte(id), byte(seq >> 8), byte(seq), 'n', 'p', 'a', 'e'}
	if !v6 {
		binary.BigEndian.PutUint16(m[2:], ^checksum(m))
	}
	return m
}

// TestRealConntrackICMPEcho, IPv4 and IPv6, with real echoes (raw sockets) through
// the node. The pod's ingress is isolated, its egress allows the peer: the pod's echo
// request gets the peer's own echo reply through, and an echo reply with its
// identifier sent by the peer passes too; an echo request the peer sends the pod with
// that identifier, and an echo reply with another identifier, are dropped. The same
// the other way round (egress isolated, ingress allows the peer, the peer pings the
// pod): the pod's reply reaches the peer, the pod's own echo request with that
// identifier and its echo reply with another do not. Before the fix ICMP was tracked
// by address pair, so both passed for the entry's idle timeout.
func TestRealConntrackICMPEcho(t *testing.T) {
	lab := newTrafficLab(t)
	lab.enterNode(t)
	e := openTestEBPF(t, EBPFOptions{})
	peers := []Rule{{CIDR: labPeerNet4}, {CIDR: labPeerNet6}}
	for _, side := range []struct {
		name             string
		pol              PodPolicy
		pinger, target   string // namespaces
		toPinger, toTarg func(v6 bool) netip.Addr
		id, otherID      uint16
	}{
		{"pod pings peer", PodPolicy{Ingress: DirectionPolicy{Isolated: true}, Egress: DirectionPolicy{Isolated: true, Allow: peers}},
			lab.pod, lab.peer, labAddr(labPod4, labPod6), labAddr(labPeer4, labPeer6), 0x4e50, 0x4e51},
		{"peer pings pod", PodPolicy{Ingress: DirectionPolicy{Isolated: true, Allow: peers}, Egress: DirectionPolicy{Isolated: true}},
			lab.peer, lab.pod, labAddr(labPeer4, labPeer6), labAddr(labPod4, labPod6), 0x4e60, 0x4e61},
	} {
		if _, err := e.Commit(lab.hostIfindex, side.pol); err != nil {
			t.Fatal(err)
		}
		for _, fam := range []struct {
			name                string
			v6                  bool
			domain, proto       int
			request, reply, hdr byte // echo types; bytes of IP header a raw socket's read starts with (IPv4 only)
		}{
			{"IPv4", false, unix.AF_INET, unix.IPPROTO_ICMP, 8, 0, 20},
			{"IPv6", true, unix.AF_INET6, unix.IPPROTO_ICMPV6, 128, 129, 0},
		} {
			pinger, target := side.toPinger(fam.v6), side.toTarg(fam.v6)
			listen := rawSocket(t, side.pinger, fam.domain, unix.SOCK_RAW, fam.proto, 50*time.Millisecond)
			fromPinger := rawSocket(t, side.pinger, fam.domain, unix.SOCK_RAW, fam.proto, time.Second)
			fromTarget := rawSocket(t, side.target, fam.domain, unix.SOCK_RAW, fam.proto, time.Second)
			steps := []struct {
				what          string
				fd            int
				to            netip.Addr
				send, arrives byte // the type sent, the type awaited at the pinger
				id            uint16
				want          bool
			}{
				{"the echo request: the target's own reply", fromPinger, target, fam.request, fam.reply, side.id, true},
				{"an echo reply with the request's identifier", fromTarget, pinger, fam.reply, fam.reply, side.id, true},
				{"the target's echo request with that identifier", fromTarget, pinger, fam.request, fam.request, side.id, false},
				{"an echo reply with another identifier", fromTarget, pinger, fam.reply, fam.reply, side.otherID, false},
			}
			for i, s := range steps {
				seq := uint16(i + 1)
				if err := unix.Sendto(s.fd, echoMessage(fam.v6, s.send, s.id, seq), 0, labSockaddr(s.to)); err != nil && !errors.Is(err, unix.ENOBUFS) {
					t.Fatalf("%s, %s: send echo type %d: %v", side.name, fam.name, s.send, err)
				}
				got := awaitPacket(listen, trafficTimeout, func(b []byte) bool {
					b = b[min(int(fam.hdr), len(b)):]
					return len(b) >= 8 && b[0] == s.arrives && binary.BigEndian.Uint16(b[4:]) == s.id && binary.BigEndian.Uint16(b[6:]) == seq
				})
				if got != s.want {
					t.Errorf("%s, %s: %s: arrived=%v, want %v", side.name, fam.name, s.what, got, s.want)
				}
			}
		}
	}
}

// labAddr returns the IPv4 or IPv6 address of a lab namespace.
func labAddr(v4, v6 string) func(v6 bool) netip.Addr {
	return func(is6 bool) netip.Addr {
		if is6 {
			return netip.MustParseAddr(v6)
		}
		return netip.MustParseAddr(v4)
	}
}

// labSockaddr is a raw socket's destination address.
func labSockaddr(a netip.Addr) unix.Sockaddr {
	if a.Is4() {
		return &unix.SockaddrInet4{Addr: a.As4()}
	}
	return &unix.SockaddrInet6{Addr: a.As16()}
}
