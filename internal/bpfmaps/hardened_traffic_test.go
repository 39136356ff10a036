package bpfmaps

import (
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npagent/npagent/internal/testenv/netlab"
)

// Real-packet tests of issue 24 that need no forged source: what the datapath does
// with frames it cannot judge as IP, ICMP errors and neighbour discovery.

// TestForeignEthertypeFromPod runs from_pod on frames that are neither IP nor ARP:
// from a pod whose addresses are known they are dropped even without any policy (the
// node may turn them into IP with a forged source: stacked VLAN tags); a pod without
// addresses or policy passes them; ARP passes with the pod's own sender address
// (TestARPFromPod). Before the fix all passed.
func TestForeignEthertypeFromPod(t *testing.T) {
	e := openTestEBPF(t, EBPFOptions{})
	ifindex := dummyInterface(t)
	pod4 := netip.MustParseAddr("10.255.7.1")
	if _, err := e.Commit(ifindex, PodPolicy{}); err != nil {
		t.Fatal(err)
	}
	foreign := append([]byte{0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2, 0x88, 0xb5}, make([]byte, 46)...)
	if !run(t, e.objs.FromPod, ifindex, foreign) {
		t.Error("ethertype 0x88b5 from a pod without addresses or policy: dropped")
	}
	if _, err := e.Commit(ifindex, PodPolicy{Addrs: []netip.Addr{pod4}}); err != nil {
		t.Fatal(err)
	}
	if run(t, e.objs.FromPod, ifindex, foreign) {
		t.Error("ethertype 0x88b5 from a pod whose addresses are known: passed")
	}
	if !run(t, e.objs.FromPod, ifindex, arpFrame(arpRequest(podMAC, pod4, netip.MustParseAddr("10.255.7.254")))) {
		t.Error("ARP from a pod whose addresses are known: dropped")
	}
}

var podMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 2}

// arpFrame is an ARP packet in a broadcast Ethernet frame from podMAC, padded to 60 bytes.
func arpFrame(arp []byte) []byte {
	f := append([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, podMAC...)
	f = append(append(f, 0x08, 0x06), arp...)
	return append(f, make([]byte, max(0, 60-len(f)))...)
}

// TestARPFromPod runs from_pod and to_pod on ARP frames (finding: ARP sender
// spoofing). From a pod whose addresses are known, only ARP with one of its IPv4
// addresses or 0.0.0.0 (an RFC 5227 probe) as sender passes: another pod's or the
// node's address (a gratuitous ARP that would poison neighbours), or a frame that is
// not IPv4-over-Ethernet ARP or is cut short, is dropped. A pod committed without
// addresses, and ARP toward a pod, are not checked. Before the fix every ARP passed.
func TestARPFromPod(t *testing.T) {
	e := openTestEBPF(t, EBPFOptions{})
	ifindex := dummyInterface(t)
	pod4, other, gw := netip.MustParseAddr("10.255.7.1"), netip.MustParseAddr("10.255.7.2"), netip.MustParseAddr("10.255.7.254")
	gratuitous := func(spa netip.Addr) []byte { return arpRequest(podMAC, spa, spa) }
	reply := func(spa netip.Addr) []byte {
		a := arpRequest(podMAC, spa, gw)
		a[7] = 2
		return a
	}
	ipv6ptype := arpRequest(podMAC, pod4, gw)
	ipv6ptype[2], ipv6ptype[3] = 0x86, 0xdd
	if _, err := e.Commit(ifindex, PodPolicy{Addrs: []netip.Addr{pod4, netip.MustParseAddr("fd00:ff::7:1")}}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		arp  []byte
		want bool
	}{
		{"request from its own address", arpRequest(podMAC, pod4, gw), true},
		{"reply from its own address", reply(pod4), true},
		{"gratuitous ARP for its own address", gratuitous(pod4), true},
		{"probe from 0.0.0.0", arpRequest(podMAC, netip.IPv4Unspecified(), gw), true},
		{"request from another pod's address", arpRequest(podMAC, other, gw), false},
		{"reply from the gateway's address", reply(gw), false},
		{"gratuitous ARP for another pod's address", gratuitous(other), false},
		{"protocol type IPv6", ipv6ptype, false},
		{"cut short before the sender address", arpRequest(podMAC, pod4, gw)[:16], false},
	} {
		frame := arpFrame(c.arp)
		if len(c.arp) < 18 {
			frame = frame[:14+len(c.arp)]
		}
		if got := run(t, e.objs.FromPod, ifindex, frame); got != c.want {
			t.Errorf("%s: passed=%v, want %v", c.name, got, c.want)
		}
	}
	if !run(t, e.objs.ToPod, ifindex, arpFrame(gratuitous(other))) {
		t.Error("ARP toward the pod from another address: dropped")
	}
	if _, err := e.Commit(ifindex, PodPolicy{}); err != nil {
		t.Fatal(err)
	}
	if !run(t, e.objs.FromPod, ifindex, arpFrame(gratuitous(other))) {
		t.Error("a pod committed without addresses: ARP from another address dropped")
	}
}

// TestRealStackedVLANAndEthertype (finding 2): the pod's egress allows UDP 5354 to the
// peer, not 5353. Untagged and with one VID-0 tag, 5353 is dropped and 5354 passes;
// with two VID-0 tags (802.1ad or 802.1Q outer, 802.1Q inner), which the program sees
// as ethertype 0x8100, both are dropped (the node would strip both tags and route
// the packet). Toward the pod, whose ingress is isolated, a frame of a foreign
// ethertype the node sends is dropped. Before the fix the stacked tags took UDP 5353
// to the peer and the foreign frame reached the pod.
func TestRealStackedVLANAndEthertype(t *testing.T) {
	lab := newTrafficLab(t)
	lab.enterNode(t)
	e := openTestEBPF(t, EBPFOptions{})
	udp5354 := []PortRule{{Protocol: ProtocolUDP, Port: 5354}}
	pol := PodPolicy{
		Ingress: DirectionPolicy{Isolated: true},
		Egress:  DirectionPolicy{Isolated: true, Allow: []Rule{{CIDR: labPeerNet4, Ports: udp5354}, {CIDR: labPeerNet6, Ports: udp5354}}},
		Addrs:   labPodAddrs,
	}
	if _, err := e.Commit(lab.hostIfindex, pol); err != nil {
		t.Fatal(err)
	}
	wire := lab.wire(t, lab.pod, "h1")
	atPeer := lab.listen(t, lab.peer)
	sport := uint16(44000)
	for _, fam := range []struct{ pod, peer netip.Addr }{
		{netip.MustParseAddr(labPod4), netip.MustParseAddr(labPeer4)},
		{netip.MustParseAddr(labPod6), netip.MustParseAddr(labPeer6)},
	} {
		for _, tags := range []struct {
			name  string
			tpids []uint16
		}{
			{"untagged", nil},
			{"one 802.1Q tag", []uint16{unix.ETH_P_8021Q}},
			{"802.1ad and 802.1Q tags", []uint16{unix.ETH_P_8021AD, unix.ETH_P_8021Q}},
			{"two 802.1Q tags", []uint16{unix.ETH_P_8021Q, unix.ETH_P_8021Q}},
		} {
			for _, port := range []uint16{5353, 5354} {
				sport++
				wire.sendIP(t, ipPacket(fam.pod, fam.peer, ProtocolUDP, sport, port), tags.tpids...)
				got := atPeer.arrivedIP(fam.pod, fam.peer, ProtocolUDP, ports(sport, port))
				if want := port == 5354 && len(tags.tpids) < 2; got != want {
					t.Errorf("%s, %s: UDP to the peer's %d: arrived=%v, want %v", fam.peer, tags.name, port, got, want)
				}
			}
		}
	}

	// Toward the pod: the node sends a frame of ethertype 0x88b5 to the pod's MAC.
	podIf, err := netlab.In(lab.pod, func() (*net.Interface, error) { return net.InterfaceByName("eth0") })
	if err != nil {
		t.Fatal(err)
	}
	h1, err := net.InterfaceByName("h1")
	if err != nil {
		t.Fatal(err)
	}
	fromNode := rawSocket(t, lab.node, unix.AF_PACKET, unix.SOCK_RAW, 0, time.Second)
	atPod := lab.listen(t, lab.pod)
	for _, c := range []struct {
		typ  uint16
		want bool
	}{{0x88b5, false}, {unix.ETH_P_ARP, true}} {
		payload := append([]byte("npagent-foreign"), make([]byte, 40)...)
		frame := append(append(append([]byte{}, podIf.HardwareAddr...), h1.HardwareAddr...), byte(c.typ>>8), byte(c.typ))
		frame = append(frame, payload...)
		// ENOBUFS: the program dropped it on the way out.
		if err := unix.Sendto(fromNode, frame, 0, &unix.SockaddrLinklayer{Ifindex: h1.Index}); err != nil && !errors.Is(err, unix.ENOBUFS) {
			t.Fatal(err)
		}
		got := atPod.arrived(c.typ, func(b []byte) bool { return len(b) >= 15 && string(b[:15]) == "npagent-foreign" })
		if got != c.want {
			t.Errorf("ethertype %#04x from the node to the pod (isolated ingress): arrived=%v, want %v", c.typ, got, c.want)
		}
	}
}

// TestRealICMPErrorAddresses (finding 3): after an allowed UDP exchange from the pod
// to the peer's 5353 (egress allows only that, ingress nothing), ICMP errors quoting
// it pass only between the quoted flow's endpoints. From the pod: the error about the
// peer's reply reaches the peer, not another peer address (a denied destination), nor
// from another address of the pod. Toward the pod: a router's error (any source)
// about the pod's request reaches the pod's address that sent it, not its other
// address. Before the fix all of them passed.
func TestRealICMPErrorAddresses(t *testing.T) {
	lab := newTrafficLab(t)
	pod4b, pod6b := netip.MustParseAddr("10.201.1.3"), netip.MustParseAddr("fd00:201:1::3")
	peer4b, peer6b := netip.MustParseAddr("10.201.2.3"), netip.MustParseAddr("fd00:201:2::3")
	netlab.Run(t, "ip", "-n", lab.pod, "addr", "add", pod4b.String()+"/32", "dev", "eth0")
	netlab.Run(t, "ip", "-n", lab.pod, "addr", "add", pod6b.String()+"/128", "dev", "eth0", "nodad")
	netlab.Run(t, "ip", "-n", lab.peer, "addr", "add", peer4b.String()+"/32", "dev", "eth0")
	netlab.Run(t, "ip", "-n", lab.peer, "addr", "add", peer6b.String()+"/128", "dev", "eth0", "nodad")
	lab.sysctl(t, "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.h1.rp_filter=0", "net.ipv4.conf.h2.rp_filter=0")
	netlab.ServeEcho(t, lab.peer, "udp4", labPeer4+":5353")
	netlab.ServeEcho(t, lab.peer, "udp6", "["+labPeer6+"]:5353")
	lab.enterNode(t)
	e := openTestEBPF(t, EBPFOptions{})
	udp5353 := []PortRule{{Protocol: ProtocolUDP, Port: 5353}}
	pol := PodPolicy{
		Ingress: DirectionPolicy{Isolated: true},
		Egress:  DirectionPolicy{Isolated: true, Allow: []Rule{{CIDR: labPeerNet4, Ports: udp5353}, {CIDR: labPeerNet6, Ports: udp5353}}},
		Addrs:   append([]netip.Addr{pod4b, pod6b}, labPodAddrs...),
	}
	if _, err := e.Commit(lab.hostIfindex, pol); err != nil {
		t.Fatal(err)
	}
	fromPod, fromPeer := lab.wire(t, lab.pod, "h1"), lab.wire(t, lab.peer, "h2")
	atPod, atPeer := lab.listen(t, lab.pod), lab.listen(t, lab.peer)
	for i, fam := range []struct {
		network            string
		pod, podB          netip.Addr
		peer, peerB        netip.Addr
		proto              Protocol
		icmpType, icmpCode byte // port unreachable
	}{
		{"udp4", netip.MustParseAddr(labPod4), pod4b, netip.MustParseAddr(labPeer4), peer4b, ProtocolICMP, 3, 3},
		{"udp6", netip.MustParseAddr(labPod6), pod6b, netip.MustParseAddr(labPeer6), peer6b, ProtocolICMPv6, 1, 4},
	} {
		lport := uint16(45000 + i)
		c, err := netlab.In(lab.pod, func() (net.Conn, error) {
			d := net.Dialer{LocalAddr: &net.UDPAddr{IP: fam.pod.AsSlice(), Port: int(lport)}}
			return d.Dial(fam.network, netip.AddrPortFrom(fam.peer, 5353).String())
		})
		if err != nil {
			t.Fatal(err)
		}
		echo(t, c, "dns")
		_ = c.Close()
		code := fam.icmpCode
		for _, s := range []struct {
			what     string
			w        *labWire
			at       *labListener
			src, dst netip.Addr
			q        [2]netip.Addr // quoted source, destination
			qs, qd   uint16
			want     bool
		}{
			{"from the pod, about the peer's reply, to the peer", fromPod, atPeer, fam.pod, fam.peer, [2]netip.Addr{fam.peer, fam.pod}, 5353, lport, true},
			{"from the pod, about the peer's reply, to another address", fromPod, atPeer, fam.pod, fam.peerB, [2]netip.Addr{fam.peer, fam.pod}, 5353, lport, false},
			{"from the pod's other address, to the peer", fromPod, atPeer, fam.podB, fam.peer, [2]netip.Addr{fam.peer, fam.pod}, 5353, lport, false},
			{"from a router, about the pod's request, to the pod", fromPeer, atPod, fam.peerB, fam.pod, [2]netip.Addr{fam.pod, fam.peer}, lport, 5353, true},
			{"from a router, about the pod's request, to the pod's other address", fromPeer, atPod, fam.peerB, fam.podB, [2]netip.Addr{fam.pod, fam.peer}, lport, 5353, false},
		} {
			msg := ipv4Checksum(icmpError(s.src, s.dst, fam.icmpType, code, 0, s.q[0], s.q[1], ProtocolUDP, s.qs, s.qd))
			s.w.sendIP(t, msg)
			if got := s.at.arrivedIP(s.src, s.dst, fam.proto, []byte{fam.icmpType, code}); got != s.want {
				t.Errorf("%s: port unreachable %s: arrived=%v, want %v", fam.network, s.what, got, s.want)
			}
		}
	}
}

// neighbourMessage is an ICMPv6 neighbour solicitation (135) or advertisement (136)
// for target from src to dst, hop limit 255 (the ICMPv6 checksum is left 0).
func neighbourMessage(typ byte, src, dst, target netip.Addr) []byte {
	body := []byte{typ, 0, 0, 0, 0, 0, 0, 0}
	if typ == 136 {
		body[4] = 0x60 // solicited, override
	}
	tg := target.As16()
	ip := ipv6Chain(src, dst, nil, ProtocolICMPv6, append(body, tg[:]...))
	ip[7] = 255
	return ip
}

// TestRealNDPScope (finding 4): neighbour discovery passes without policy only at
// link scope (hop limit 255, a link-local or ff02::/16 peer, or the node at the other
// end): with the pod's neighbour caches flushed, its IPv6 exchange with the peer
// (allowed) still works, but a neighbour advertisement or solicitation the pod sends
// to the peer's global address is judged by its egress policy (dropped), and one the
// peer sends to the pod's global address by its ingress policy (dropped). Before the
// fix they passed in every tier.
func TestRealNDPScope(t *testing.T) {
	lab := newTrafficLab(t)
	netlab.ServeEcho(t, lab.peer, "udp6", "["+labPeer6+"]:5353")
	lab.enterNode(t)
	e := openTestEBPF(t, EBPFOptions{})
	udp5353 := []PortRule{{Protocol: ProtocolUDP, Port: 5353}}
	pol := PodPolicy{
		Ingress: DirectionPolicy{Isolated: true},
		Egress:  DirectionPolicy{Isolated: true, Allow: []Rule{{CIDR: labPeerNet6, Ports: udp5353}}},
		Addrs:   labPodAddrs,
	}
	if _, err := e.Commit(lab.hostIfindex, pol); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{lab.pod, lab.node} {
		netlab.Run(t, "ip", "-n", ns, "-6", "neigh", "flush", "all")
	}
	if err := netlab.Exchange(lab.pod, "udp6", "["+labPeer6+"]:5353", 2*time.Second); err != nil {
		t.Errorf("IPv6 exchange after flushing the neighbour caches: %v", err)
	}
	pod6, peer6 := netip.MustParseAddr(labPod6), netip.MustParseAddr(labPeer6)
	fromPod, fromPeer := lab.wire(t, lab.pod, "h1"), lab.wire(t, lab.peer, "h2")
	atPod, atPeer := lab.listen(t, lab.pod), lab.listen(t, lab.peer)
	for _, s := range []struct {
		what     string
		w        *labWire
		at       *labListener
		typ      byte
		src, dst netip.Addr
	}{
		{"advertisement from the pod to the peer's global address", fromPod, atPeer, 136, pod6, peer6},
		{"solicitation from the pod to the peer's global address", fromPod, atPeer, 135, pod6, peer6},
		{"advertisement from the peer to the pod's global address", fromPeer, atPod, 136, peer6, pod6},
	} {
		s.w.sendIP(t, neighbourMessage(s.typ, s.src, s.dst, s.src))
		if s.at.arrivedIP(s.src, s.dst, ProtocolICMPv6, []byte{s.typ, 0}) {
			t.Errorf("neighbour %s: passed the isolated policy", s.what)
		}
	}
}
