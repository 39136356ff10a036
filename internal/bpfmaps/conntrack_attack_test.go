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

// Real-packet tests of attacks on a pod's connection table from outside (issue 24,
// findings 6 and 11): forged RSTs and SYN floods sent by the peer namespace.

// tcpSegment is a 20-byte TCP header from src to dst; its checksum is right when
// good is set, and wrong otherwise (the receiving kernel drops it, the datapath sees it).
func tcpSegment(src, dst netip.Addr, sport, dport uint16, seq, ack uint32, flags byte, win uint16, good bool) []byte {
	h := make([]byte, 20)
	binary.BigEndian.PutUint16(h[0:], sport)
	binary.BigEndian.PutUint16(h[2:], dport)
	binary.BigEndian.PutUint32(h[4:], seq)
	binary.BigEndian.PutUint32(h[8:], ack)
	h[12] = 5 << 4
	h[13] = flags
	binary.BigEndian.PutUint16(h[14:], win)
	pseudo := append(append([]byte{}, src.AsSlice()...), dst.AsSlice()...)
	pseudo = append(pseudo, 0, byte(ProtocolTCP), 0, 20)
	sum := ^checksum(append(pseudo, h...))
	if !good {
		sum ^= 0x5a5a
	}
	binary.BigEndian.PutUint16(h[16:], sum)
	return h
}

// tcpRawSocket is a raw TCP socket in ns (the kernel writes the IP header, not the
// TCP checksum) for the family of a.
func tcpRawSocket(t *testing.T, ns string, a netip.Addr) int {
	domain := unix.AF_INET
	if a.Is6() {
		domain = unix.AF_INET6
	}
	return rawSocket(t, ns, domain, unix.SOCK_RAW, unix.IPPROTO_TCP, time.Second)
}

// sendRaw sends a TCP segment on fd to dst.
func sendRaw(t *testing.T, fd int, dst netip.Addr, seg []byte) {
	t.Helper()
	if err := unix.Sendto(fd, seg, 0, labSockaddr(dst)); err != nil && !errors.Is(err, unix.ENOBUFS) {
		t.Fatalf("send a crafted TCP segment to %v: %v", dst, err)
	}
}

// lastAckFrom reads the frames of a packet socket until none arrives for its read
// timeout and returns the acknowledgement number of the last TCP segment from
// pod:port among them.
func lastAckFrom(fd int, pod netip.Addr, port uint16) (uint32, bool) {
	buf := make([]byte, 2048)
	var ack uint32
	found := false
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return ack, found
		}
		ip := buf[14:n]
		var tcp []byte
		switch {
		case pod.Is4() && len(ip) >= 20 && ip[9] == byte(ProtocolTCP) && netip.AddrFrom4([4]byte(ip[12:16])) == pod:
			tcp = ip[(ip[0]&0xf)*4:]
		case pod.Is6() && len(ip) >= 40 && ip[6] == byte(ProtocolTCP) && netip.AddrFrom16([16]byte(ip[8:24])) == pod:
			tcp = ip[40:]
		}
		if len(tcp) >= 20 && binary.BigEndian.Uint16(tcp) == port && tcp[13]&0x10 != 0 {
			ack, found = binary.BigEndian.Uint32(tcp[8:]), true
		}
	}
}

// dialPeer connects the pod to a listener on the peer and returns both ends after
// one exchange each way.
func dialPeer(t *testing.T, lab *trafficLab, ln net.Listener, network, addr string) (client, server net.Conn) {
	t.Helper()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	client, err := netlab.In(lab.pod, func() (net.Conn, error) { return net.DialTimeout(network, addr, trafficTimeout) })
	if err != nil {
		t.Fatalf("pod → peer %s %s: %v", network, addr, err)
	}
	t.Cleanup(func() { _ = client.Close() })
	select {
	case server = <-accepted:
	case <-time.After(trafficTimeout):
		t.Fatalf("pod → peer %s %s: not accepted", network, addr)
	}
	t.Cleanup(func() { _ = server.Close() })
	transfer(t, client, server, "request")
	transfer(t, server, client, "answer")
	return client, server
}

// transfer writes msg on from and reports whether to reads it.
func transfer(t *testing.T, from, to net.Conn, msg string) bool {
	t.Helper()
	if _, err := from.Write([]byte(msg)); err != nil {
		t.Fatalf("write %q: %v", msg, err)
	}
	_ = to.SetReadDeadline(time.Now().Add(2 * trafficTimeout))
	buf := make([]byte, len(msg))
	n, err := to.Read(buf)
	return err == nil && string(buf[:n]) == msg
}

// TestRealConntrackForgedRST: the pod's connection to the peer's TCP 9000 through its
// isolated ingress, IPv4 and IPv6, reset timeout 300 ms. A RST "from the peer" with a
// sequence number outside the pod's window and a bad checksum (the pod's kernel drops
// it) does not shorten the entry: a push from the peer after the reset timeout still
// reaches the pod. One inside the window (at the pod's last ACK) does, as a genuine
// RST would: the push after the timeout is dropped. And one inside the window
// followed by a packet of the pod (the connection lives on) is lifted: the push
// reaches the pod. Before, any RST moved the entry to the reset timeout for good.
func TestRealConntrackForgedRST(t *testing.T) {
	lab := newTrafficLab(t)
	lab.enterNode(t)
	const reset = 300 * time.Millisecond
	e := openTestEBPF(t, EBPFOptions{ConntrackResetTimeout: reset})
	pol := PodPolicy{Ingress: DirectionPolicy{Isolated: true},
		Egress: DirectionPolicy{Isolated: true, Allow: []Rule{{CIDR: labPeerNet4, Ports: tcpPorts(9000)}, {CIDR: labPeerNet6, Ports: tcpPorts(9000)}}}}
	if _, err := e.Commit(lab.hostIfindex, pol); err != nil {
		t.Fatal(err)
	}
	peerIf, err := netlab.In(lab.peer, func() (*net.Interface, error) { return net.InterfaceByName("eth0") })
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct {
		network   string
		pod, peer netip.Addr
		ethType   uint16
	}{
		{"tcp4", netip.MustParseAddr(labPod4), netip.MustParseAddr(labPeer4), unix.ETH_P_IP},
		{"tcp6", netip.MustParseAddr(labPod6), netip.MustParseAddr(labPeer6), unix.ETH_P_IPV6},
	} {
		ln, err := netlab.In(lab.peer, func() (net.Listener, error) {
			return net.Listen(f.network, net.JoinHostPort(f.peer.String(), "9000"))
		})
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		forge := tcpRawSocket(t, lab.peer, f.peer)
		for _, c := range []struct {
			name     string
			inWindow bool // the RST's sequence number: the pod's last ACK, or half the space away
			podSends bool // the pod sends data after the RST
			want     bool // the push after the reset timeout reaches the pod
		}{
			{"RST outside the window", false, false, true},
			{"RST inside the window", true, false, false},
			{"RST inside the window, then the pod sends", true, true, true},
		} {
			capture := rawSocket(t, lab.peer, unix.AF_PACKET, unix.SOCK_RAW, int(htons(f.ethType)), 150*time.Millisecond)
			if err := unix.Bind(capture, &unix.SockaddrLinklayer{Protocol: htons(f.ethType), Ifindex: peerIf.Index}); err != nil {
				t.Fatal(err)
			}
			client, server := dialPeer(t, lab, ln, f.network, net.JoinHostPort(f.peer.String(), "9000"))
			lport := uint16(client.LocalAddr().(*net.TCPAddr).Port)
			ack, ok := lastAckFrom(capture, f.pod, lport)
			if !ok {
				t.Fatalf("%s: %s: no ACK of the pod's seen at the peer", f.network, c.name)
			}
			seq := ack
			if !c.inWindow {
				seq += 1 << 31
			}
			sendRaw(t, forge, f.pod, tcpSegment(f.peer, f.pod, 9000, lport, seq, 0, 0x04, 0, false))
			time.Sleep(50 * time.Millisecond)
			if c.podSends && !transfer(t, client, server, "still here") {
				t.Fatalf("%s: %s: the pod's data after the RST did not reach the peer", f.network, c.name)
			}
			time.Sleep(reset + 200*time.Millisecond)
			if got := transfer(t, server, client, "push"); got != c.want {
				t.Errorf("%s: %s (bad checksum): the peer's push %v later reached the pod=%v, want %v",
					f.network, c.name, reset+200*time.Millisecond, got, c.want)
			}
		}
	}
}

// TestRealConntrackSYNFlood: tables of 256 entries; the pod's ingress allows TCP
// 8080 from the peer network (the pod listens there), its egress TCP 9000 to it. The
// pod holds a connection to the peer's 9000. The peer then sends 2000 SYNs (four each,
// as retransmissions; half with a bad checksum, which the pod never answers) from as
// many ports to the pod's 8080, IPv4 and IPv6: the peer's
// push on the pod's connection afterwards still reaches the pod (its entry is in the
// table of connections the pod opened, which the flood's entries never enter), and
// once the unreplied timeout (1 s) has passed the flood's entries are no longer live.
// Before, they shared the pod's one table, evicted the pod's entry (the push was
// dropped) and lived for the 5-minute idle timeout.
func TestRealConntrackSYNFlood(t *testing.T) {
	lab := newTrafficLab(t)
	lab.enterNode(t)
	const unreplied = time.Second
	// The peer's kernel answers the pod's SYN-ACKs with RSTs: the reset timeout
	// applies to those entries.
	e := openTestEBPF(t, EBPFOptions{ConntrackEntries: 256, ConntrackUnrepliedTimeout: unreplied, ConntrackResetTimeout: unreplied / 2})
	pol := PodPolicy{
		Ingress: DirectionPolicy{Isolated: true, Allow: []Rule{{CIDR: labPeerNet4, Ports: tcpPorts(8080)}, {CIDR: labPeerNet6, Ports: tcpPorts(8080)}}},
		Egress:  DirectionPolicy{Isolated: true, Allow: []Rule{{CIDR: labPeerNet4, Ports: tcpPorts(9000)}, {CIDR: labPeerNet6, Ports: tcpPorts(9000)}}}}
	if _, err := e.Commit(lab.hostIfindex, pol); err != nil {
		t.Fatal(err)
	}
	netlab.ServeEcho(t, lab.pod, "tcp4", labPod4+":8080")
	netlab.ServeEcho(t, lab.pod, "tcp6", "["+labPod6+"]:8080")
	for i, f := range []struct {
		network   string
		pod, peer netip.Addr
	}{
		{"tcp4", netip.MustParseAddr(labPod4), netip.MustParseAddr(labPeer4)},
		{"tcp6", netip.MustParseAddr(labPod6), netip.MustParseAddr(labPeer6)},
	} {
		ln, err := netlab.In(lab.peer, func() (net.Listener, error) {
			return net.Listen(f.network, net.JoinHostPort(f.peer.String(), "9000"))
		})
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		client, server := dialPeer(t, lab, ln, f.network, net.JoinHostPort(f.peer.String(), "9000"))
		own := conntrackUsed(t, e)

		flood := tcpRawSocket(t, lab.peer, f.peer)
		for port := uint16(20000); port < 22000; port++ {
			// Half with a bad checksum: the pod's kernel never answers those.
			syn := tcpSegment(f.peer, f.pod, port, 8080, uint32(port)<<16, 0, 0x02, 64240, port < 21000)
			for range 4 {
				sendRaw(t, flood, f.pod, syn)
			}
		}
		time.Sleep(100 * time.Millisecond)
		if n := conntrackUsed(t, e); n <= own {
			t.Fatalf("%s: %d live entries after the flood, %d before: the SYNs made none", f.network, n, own)
		}
		if !transfer(t, server, client, "push") {
			t.Errorf("%s: the peer's push on the pod's connection after 2000 SYNs to the pod's 8080 did not reach the pod", f.network)
		}
		time.Sleep(unreplied + 200*time.Millisecond)
		if n := conntrackUsed(t, e); n > i+1 {
			t.Errorf("%s: %d live entries %v after the flood, want at most %d: the pod's connections (unanswered SYNs' entries time out)", f.network, n, unreplied, i+1)
		}
		if !transfer(t, server, client, "push again") {
			t.Errorf("%s: the peer's push after the flood's entries timed out did not reach the pod", f.network)
		}
	}
}
