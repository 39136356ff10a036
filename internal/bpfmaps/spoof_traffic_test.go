package bpfmaps

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npagent/npagent/internal/testenv/netlab"
)

// Real-packet tests of issue 24 (hardened enforcement): frames a pod (CAP_NET_RAW)
// or a neighbour crafts on a packet socket, through the lab of traffic_test.go.

var (
	labPodAddrs = []netip.Addr{netip.MustParseAddr(labPod4), netip.MustParseAddr(labPod6)}
	// Addresses nobody holds, in the pod's and the peer's subnets.
	labForged4 = netip.MustParseAddr("10.201.2.77")
	labForged6 = netip.MustParseAddr("fd00:201:2::77")
)

// labWire sends crafted frames from a lab namespace's eth0 to the node.
type labWire struct {
	fd       int
	ifindex  int
	mac, dst net.HardwareAddr // eth0's, and the node side's of the veth
}

// wire opens a packet socket on ns's eth0 whose frames go to host (the node side).
func (l *trafficLab) wire(t *testing.T, ns, host string) *labWire {
	t.Helper()
	ifc, err := netlab.In(ns, func() (*net.Interface, error) { return net.InterfaceByName("eth0") })
	if err != nil {
		t.Fatal(err)
	}
	h, err := netlab.In(l.node, func() (*net.Interface, error) { return net.InterfaceByName(host) })
	if err != nil {
		t.Fatal(err)
	}
	fd := rawSocket(t, ns, unix.AF_PACKET, unix.SOCK_RAW, 0, time.Second)
	return &labWire{fd: fd, ifindex: ifc.Index, mac: ifc.HardwareAddr, dst: h.HardwareAddr}
}

// send sends ip (an IPv4 or IPv6 packet, or any payload with ethertype typ) after
// VLAN tags of VID 0 with the given TPIDs, outermost first.
func (w *labWire) send(t *testing.T, typ uint16, payload []byte, tpids ...uint16) {
	t.Helper()
	frame := append(append([]byte{}, w.dst...), w.mac...)
	for _, tp := range tpids {
		frame = binary.BigEndian.AppendUint16(frame, tp)
		frame = append(frame, 0, 0) // PCP 0, VID 0
	}
	frame = binary.BigEndian.AppendUint16(frame, typ)
	frame = append(frame, payload...)
	if err := unix.Sendto(w.fd, frame, 0, &unix.SockaddrLinklayer{Ifindex: w.ifindex}); err != nil && !errors.Is(err, unix.ENOBUFS) {
		t.Fatal(err)
	}
}

func (w *labWire) sendIP(t *testing.T, ip []byte, tpids ...uint16) {
	t.Helper()
	typ := uint16(unix.ETH_P_IPV6)
	if ip[0]>>4 == 4 {
		typ = unix.ETH_P_IP
	}
	w.send(t, typ, ip, tpids...)
}

// labListener reads the frames arriving at a lab namespace's eth0 (not those it sends).
type labListener struct{ fd int }

func (l *trafficLab) listen(t *testing.T, ns string) *labListener {
	t.Helper()
	ifc, err := netlab.In(ns, func() (*net.Interface, error) { return net.InterfaceByName("eth0") })
	if err != nil {
		t.Fatal(err)
	}
	fd := rawSocket(t, ns, unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL)), 50*time.Millisecond)
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifc.Index}); err != nil {
		t.Fatal(err)
	}
	return &labListener{fd: fd}
}

// arrived reports whether a frame arrives, within trafficTimeout, whose ethertype is
// typ and whose payload (after the Ethernet header) match accepts.
func (l *labListener) arrived(typ uint16, match func(payload []byte) bool) bool {
	buf := make([]byte, 4096)
	for deadline := time.Now().Add(trafficTimeout); time.Now().Before(deadline); {
		n, from, err := unix.Recvfrom(l.fd, buf, 0)
		if err != nil {
			continue
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		if n >= 14 && binary.BigEndian.Uint16(buf[12:]) == typ && match(buf[14:n]) {
			return true
		}
	}
	return false
}

// arrivedIP reports whether an IP packet from src to dst of proto arrives whose
// first L4 bytes (ports, or ICMP type and code) are l4.
func (l *labListener) arrivedIP(src, dst netip.Addr, proto Protocol, l4 []byte) bool {
	typ, hlen := uint16(unix.ETH_P_IP), 20
	if src.Is6() {
		typ, hlen = unix.ETH_P_IPV6, 40
	}
	return l.arrived(typ, func(ip []byte) bool {
		if len(ip) < hlen+len(l4) {
			return false
		}
		var s, d netip.Addr
		var p byte
		if src.Is4() {
			s, d, p = netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20])), ip[9]
		} else {
			s, d, p = netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40])), ip[6]
		}
		return s == src && d == dst && Protocol(p) == proto && string(ip[hlen:hlen+len(l4)]) == string(l4)
	})
}

// ipPacket is an IP packet (no Ethernet header) of proto from src to dst with the
// L4 header packetBytes writes (TCP: a SYN, checksum 0), its IPv4 header checksum set.
func ipPacket(src, dst netip.Addr, proto Protocol, sport, dport uint16) []byte {
	return ipv4Checksum(packetBytes(src, dst, proto, sport, dport)[14:])
}

// ipv4Checksum sets an IPv4 packet's header checksum (the node drops a wrong one).
func ipv4Checksum(ip []byte) []byte {
	if ip[0]>>4 == 4 {
		ip[10], ip[11] = 0, 0
		binary.BigEndian.PutUint16(ip[10:], ^checksum(ip[:20]))
	}
	return ip
}

func ports(sport, dport uint16) []byte {
	return binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(nil, sport), dport)
}

// labSysctl sets sysctls in the lab's node namespace.
func (l *trafficLab) sysctl(t *testing.T, kv ...string) {
	t.Helper()
	netlab.Run(t, append([]string{"ip", "netns", "exec", l.node, "sysctl", "-qw"}, kv...)...)
}

// TestRealAntiSpoofing (finding 1): a pod whose egress allows its own subnet and UDP
// 5353 to the peer, but not TCP 9000, and whose ingress is open. Its packets with a
// source that is not its own never leave, whatever its egress policy (none at all
// included), and it cannot poison its own connection table: a forged "reply" from
// the peer's TCP 9000 to itself (hairpinned by the node) does not let its SYN from
// that port to the peer's TCP 9000 out. Its genuine packets pass. Before the fix the
// forged packets reached the peer and the SYN passed as a reply.
func TestRealAntiSpoofing(t *testing.T) {
	lab := newTrafficLab(t)
	lab.sysctl(t, "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0", "net.ipv4.conf.h1.rp_filter=0")
	lab.enterNode(t)
	e := openTestEBPF(t, EBPFOptions{})
	wire := lab.wire(t, lab.pod, "h1")
	atPeer := lab.listen(t, lab.peer)
	udp5353 := []PortRule{{Protocol: ProtocolUDP, Port: 5353}}
	guarded := PodPolicy{Egress: DirectionPolicy{Isolated: true, Allow: []Rule{
		{CIDR: labPodNet4}, {CIDR: labPodNet6}, {CIDR: labPeerNet4, Ports: udp5353}, {CIDR: labPeerNet6, Ports: udp5353},
	}}, Addrs: labPodAddrs}
	open := PodPolicy{Addrs: labPodAddrs}
	sport := uint16(41000)
	for _, fam := range []struct {
		name              string
		pod, peer, forged netip.Addr
	}{
		{"IPv4", netip.MustParseAddr(labPod4), netip.MustParseAddr(labPeer4), labForged4},
		{"IPv6", netip.MustParseAddr(labPod6), netip.MustParseAddr(labPeer6), labForged6},
	} {
		for _, pol := range []struct {
			name string
			p    PodPolicy
		}{{"egress policy", guarded}, {"no policy", open}} {
			if _, err := e.Commit(lab.hostIfindex, pol.p); err != nil {
				t.Fatal(err)
			}
			for _, src := range []netip.Addr{fam.pod, fam.forged} {
				sport++
				wire.sendIP(t, ipPacket(src, fam.peer, ProtocolUDP, sport, 5353))
				got := atPeer.arrivedIP(src, fam.peer, ProtocolUDP, ports(sport, 5353))
				if want := src == fam.pod; got != want {
					t.Errorf("%s, %s: UDP to the peer's 5353 from %s: arrived=%v, want %v", fam.name, pol.name, src, got, want)
				}
			}
		}

		// The poisoning: a forged ACK from the peer's TCP 9000 to the pod (bad
		// checksum: the pod's kernel stays silent), then the pod's SYN from that port.
		if _, err := e.Commit(lab.hostIfindex, guarded); err != nil {
			t.Fatal(err)
		}
		sport++
		forged := ipPacket(fam.peer, fam.pod, ProtocolTCP, 9000, sport)
		forged[len(forged)-20+13] = 0x10 // ACK
		wire.sendIP(t, forged)
		time.Sleep(50 * time.Millisecond)
		wire.sendIP(t, ipPacket(fam.pod, fam.peer, ProtocolTCP, sport, 9000))
		if atPeer.arrivedIP(fam.pod, fam.peer, ProtocolTCP, ports(sport, 9000)) {
			t.Errorf("%s: after a forged reply from the peer's TCP 9000, the pod's SYN to it passed its egress policy", fam.name)
		}
		if n := ctEntriesByDir(t, e, lab.hostIfindex); n[Ingress] != 0 {
			t.Errorf("%s: %d ingress connection entries after the forged reply, want 0", fam.name, n[Ingress])
		}
	}
}

// TestAntiSpoofingExceptions runs from_pod on crafted packets: with the pod's
// addresses known, only the narrow exceptions leave from another source — IPv6 ::
// for neighbour discovery (DAD), an IPv6 link-local source toward link-local or
// ff02::/16 destinations, IPv4 0.0.0.0 for DHCP — whatever the direction's policy;
// a pod committed without addresses is not checked. The in-memory backend decides
// the same. Before the fix every source passed.
func TestAntiSpoofingExceptions(t *testing.T) {
	e := openTestEBPF(t, EBPFOptions{})
	ifindex := dummyInterface(t)
	pod4, pod6 := netip.MustParseAddr("10.255.7.1"), netip.MustParseAddr("fd00:ff::7:1")
	other4, other6 := netip.MustParseAddr("10.255.7.2"), netip.MustParseAddr("fd00:ff::7:2")
	ll, llPeer := netip.MustParseAddr("fe80::7:1"), netip.MustParseAddr("fe80::1")
	snm, global := netip.MustParseAddr("ff02::1:ff07:1"), netip.MustParseAddr("fd00:1::5")
	unspec6, unspec4, bcast := netip.IPv6Unspecified(), netip.IPv4Unspecified(), netip.MustParseAddr("255.255.255.255")
	icmp6 := func(src, dst netip.Addr, typ byte) []byte {
		return withEthernet(ipv6Chain(src, dst, nil, ProtocolICMPv6, []byte{typ, 0, 0, 0, 0, 0, 0, 0}))
	}
	udp := func(src, dst netip.Addr, sport, dport uint16) []byte {
		return packetBytes(src, dst, ProtocolUDP, sport, dport)
	}
	cases := []struct {
		name    string
		frame   []byte
		src     netip.Addr
		dst     netip.Addr
		proto   Protocol
		sport   uint16
		dport   uint16
		icmpv6  uint8
		allowed bool
	}{
		{"own IPv4", udp(pod4, other4, 1000, 53), pod4, other4, ProtocolUDP, 1000, 53, 0, true},
		{"own IPv6", udp(pod6, other6, 1000, 53), pod6, other6, ProtocolUDP, 1000, 53, 0, true},
		{"another IPv4 source", udp(other4, pod4, 1000, 53), other4, pod4, ProtocolUDP, 1000, 53, 0, false},
		{"another IPv6 source", udp(other6, pod6, 1000, 53), other6, pod6, ProtocolUDP, 1000, 53, 0, false},
		{"DHCP from 0.0.0.0", udp(unspec4, bcast, 68, 67), unspec4, bcast, ProtocolUDP, 68, 67, 0, true},
		{"other UDP from 0.0.0.0", udp(unspec4, bcast, 68, 68), unspec4, bcast, ProtocolUDP, 68, 68, 0, false},
		{"NS from :: (DAD)", icmp6(unspec6, snm, 135), unspec6, snm, ProtocolICMPv6, 0, 0, 135, true},
		{"MLD report from ::", icmp6(unspec6, netip.MustParseAddr("ff02::16"), 143), unspec6, netip.MustParseAddr("ff02::16"), ProtocolICMPv6, 0, 0, 143, true},
		{"echo request from ::", icmp6(unspec6, global, 128), unspec6, global, ProtocolICMPv6, 0, 0, 128, false},
		{"UDP from ::", udp(unspec6, global, 1000, 53), unspec6, global, ProtocolUDP, 1000, 53, 0, false},
		{"link-local to link-local", udp(ll, llPeer, 1000, 53), ll, llPeer, ProtocolUDP, 1000, 53, 0, true},
		{"link-local to ff02::", icmp6(ll, snm, 135), ll, snm, ProtocolICMPv6, 0, 0, 135, true},
		{"link-local to a global address", udp(ll, global, 1000, 53), ll, global, ProtocolUDP, 1000, 53, 0, false},
	}
	mem := NewMemory()
	for _, pol := range []struct {
		name string
		p    PodPolicy
	}{
		{"no policy", PodPolicy{Addrs: []netip.Addr{pod4, pod6}}},
		{"egress allows all", PodPolicy{Egress: DirectionPolicy{Isolated: true, Allow: []Rule{
			{CIDR: netip.MustParsePrefix("0.0.0.0/0")}, {CIDR: netip.MustParsePrefix("::/0")}}}, Addrs: []netip.Addr{pod6, pod4}}},
	} {
		for _, dp := range []Dataplane{e, mem} {
			if _, err := dp.Commit(ifindex, pol.p); err != nil {
				t.Fatal(err)
			}
		}
		for _, c := range cases {
			if got := run(t, e.objs.FromPod, ifindex, c.frame); got != c.allowed {
				t.Errorf("%s: %s: kernel passed=%v, want %v", pol.name, c.name, got, c.allowed)
			}
			if got := mem.SourceAllowed(ifindex, c.src, c.dst, c.proto, c.sport, c.dport, c.icmpv6); got != c.allowed {
				t.Errorf("%s: %s: Memory allowed=%v, want %v", pol.name, c.name, got, c.allowed)
			}
		}
	}
	// Without addresses: not checked (a caller that knows none).
	for _, dp := range []Dataplane{e, mem} {
		if _, err := dp.Commit(ifindex, PodPolicy{}); err != nil {
			t.Fatal(err)
		}
	}
	if !run(t, e.objs.FromPod, ifindex, udp(other4, pod4, 1000, 53)) || !mem.SourceAllowed(ifindex, other4, pod4, ProtocolUDP, 1000, 53, 0) {
		t.Error("a pod committed without addresses: a packet from another source was dropped")
	}
}

// TestRealHairpinMakesNoState (finding 1, the second half): a packet from the pod to
// itself through the node (source and destination its own address) reaches it but
// makes no connection entry, though its egress is isolated (so replies to it would
// need one). Before the fix it made one.
func TestRealHairpinMakesNoState(t *testing.T) {
	lab := newTrafficLab(t)
	lab.sysctl(t, "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.h1.rp_filter=0")
	lab.enterNode(t)
	e := openTestEBPF(t, EBPFOptions{})
	pol := PodPolicy{Egress: DirectionPolicy{Isolated: true, Allow: []Rule{{CIDR: labPodNet4}, {CIDR: labPodNet6}}}, Addrs: labPodAddrs}
	if _, err := e.Commit(lab.hostIfindex, pol); err != nil {
		t.Fatal(err)
	}
	wire := lab.wire(t, lab.pod, "h1")
	atPod := lab.listen(t, lab.pod)
	for i, pod := range labPodAddrs {
		sport := uint16(42000 + i)
		wire.sendIP(t, ipPacket(pod, pod, ProtocolUDP, sport, 6000))
		if !atPod.arrivedIP(pod, pod, ProtocolUDP, ports(sport, 6000)) {
			t.Fatalf("%s: the hairpinned packet did not come back to the pod", pod)
		}
	}
	if n := ctEntriesByDir(t, e, lab.hostIfindex); n[Ingress] != 0 {
		t.Errorf("%d ingress connection entries after packets from the pod to itself, want 0", n[Ingress])
	}
}

// TestRealNodeAddressForged (finding 5): the peer namespace, a pod npagent does not
// manage, sends UDP to the pod with the node's address as source (IPv4 and IPv6);
// the pod's ingress denies everything. The node's own packets to the pod pass (node
// exemption), the forged ones, forwarded by the node, do not. Before the fix the
// forged ones passed.
func TestRealNodeAddressForged(t *testing.T) {
	lab := newTrafficLab(t)
	// The IPv4 node would drop a packet with its own address as source arriving on
	// h2 (a martian); accept_local lets it through, as IPv6 always does.
	lab.sysctl(t, "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.h2.rp_filter=0", "net.ipv4.conf.all.accept_local=1", "net.ipv4.conf.h2.accept_local=1")
	lab.enterNode(t)
	e := openTestEBPF(t, EBPFOptions{})
	node4, node6 := netip.MustParseAddr("10.201.1.1"), netip.MustParseAddr("fd00:201:1::1")
	if err := e.SetNodeAddrs([]netip.Prefix{netip.PrefixFrom(node4, 32), netip.PrefixFrom(node6, 128),
		netip.MustParsePrefix("10.201.2.1/32"), netip.MustParsePrefix("fd00:201:2::1/128")}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Commit(lab.hostIfindex, PodPolicy{Ingress: DirectionPolicy{Isolated: true}, Addrs: labPodAddrs}); err != nil {
		t.Fatal(err)
	}
	wire := lab.wire(t, lab.peer, "h2")
	atPod := lab.listen(t, lab.pod)
	for i, fam := range []struct {
		network  string
		node     netip.Addr
		pod      netip.Addr
		podLabel string
	}{{"udp4", node4, netip.MustParseAddr(labPod4), labPod4}, {"udp6", node6, netip.MustParseAddr(labPod6), "[" + labPod6 + "]"}} {
		sport := uint16(43000 + i)
		wire.sendIP(t, ipPacket(fam.node, fam.pod, ProtocolUDP, sport, 7000))
		if atPod.arrivedIP(fam.node, fam.pod, ProtocolUDP, ports(sport, 7000)) {
			t.Errorf("%s: a packet from the peer with the node's address %s as source passed the pod's isolated ingress", fam.network, fam.node)
		}
		c, err := netlab.In(lab.node, func() (net.Conn, error) { return net.Dial(fam.network, fam.podLabel+":7001") })
		if err != nil {
			t.Fatal(err)
		}
		lport := uint16(c.LocalAddr().(*net.UDPAddr).Port)
		_, _ = c.Write([]byte("node"))
		_ = c.Close()
		if !atPod.arrivedIP(fam.node, fam.pod, ProtocolUDP, ports(lport, 7001)) {
			t.Errorf("%s: the node's own packet did not reach the pod", fam.network)
		}
	}
}

// TestRealForgedReplyFromPeer ports the AWS network policy agent's conntrack
// poisoning specs: a peer pod sends the pod, whose ingress denies everything,
// forged "replies" (TCP SYN-ACK and ACK from ports 80, 443, 8080, UDP from 53 and
// 5353, IPv4 and IPv6) as if the pod had opened connections to it. None reaches the
// pod, none makes a connection entry, and the peer's real connections to the pod
// stay denied.
func TestRealForgedReplyFromPeer(t *testing.T) {
	lab := newTrafficLab(t)
	netlab.ServeEcho(t, lab.pod, "tcp4", labPod4+":8080")
	netlab.ServeEcho(t, lab.pod, "tcp6", "["+labPod6+"]:8080")
	netlab.ServeEcho(t, lab.pod, "udp4", labPod4+":5353")
	netlab.ServeEcho(t, lab.pod, "udp6", "["+labPod6+"]:5353")
	lab.enterNode(t)
	e := openTestEBPF(t, EBPFOptions{})
	if _, err := e.Commit(lab.hostIfindex, PodPolicy{Ingress: DirectionPolicy{Isolated: true}, Addrs: labPodAddrs}); err != nil {
		t.Fatal(err)
	}
	wire := lab.wire(t, lab.peer, "h2")
	atPod := lab.listen(t, lab.pod)
	for _, fam := range []struct {
		tcp, udp  string
		pod, peer netip.Addr
	}{
		{"tcp4", "udp4", netip.MustParseAddr(labPod4), netip.MustParseAddr(labPeer4)},
		{"tcp6", "udp6", netip.MustParseAddr(labPod6), netip.MustParseAddr(labPeer6)},
	} {
		for _, f := range []struct {
			proto        Protocol
			sport, dport uint16
			flags        byte
		}{
			{ProtocolTCP, 80, 8080, 0x12}, {ProtocolTCP, 443, 8080, 0x12}, {ProtocolTCP, 8080, 8080, 0x10},
			{ProtocolTCP, 80, 40000, 0x10}, {ProtocolUDP, 53, 5353, 0}, {ProtocolUDP, 5353, 40001, 0},
		} {
			pkt := ipPacket(fam.peer, fam.pod, f.proto, f.sport, f.dport)
			if f.proto == ProtocolTCP {
				pkt[len(pkt)-20+13] = f.flags
			}
			wire.sendIP(t, pkt)
			if atPod.arrivedIP(fam.peer, fam.pod, f.proto, ports(f.sport, f.dport)) {
				t.Errorf("%s: a forged reply %v %d → %d reached the pod", fam.tcp, f.proto, f.sport, f.dport)
			}
		}
		for _, c := range []struct{ network, addr string }{
			{fam.tcp, netip.AddrPortFrom(fam.pod, 8080).String()}, {fam.udp, netip.AddrPortFrom(fam.pod, 5353).String()},
		} {
			if err := netlab.Exchange(lab.peer, c.network, c.addr, trafficTimeout); err == nil {
				t.Errorf("%s %s: the peer reached the pod's denied ingress after forged replies", c.network, c.addr)
			}
		}
	}
	if n := ctEntriesByDir(t, e, lab.hostIfindex); n != [2]int{} {
		t.Errorf("connection entries after forged replies: %v, want none", n)
	}
}

// arpRequest is an ARP request (IPv4 over Ethernet) from sha and spa asking for tpa.
func arpRequest(sha net.HardwareAddr, spa, tpa netip.Addr) []byte {
	b := []byte{0, 1, 8, 0, 6, 4, 0, 1}
	b = append(b, sha...)
	b = append(b, spa.AsSlice()...)
	b = append(b, make([]byte, 6)...)
	return append(b, tpa.AsSlice()...)
}

// TestRealARPSender: a pod whose addresses are known sends ARP requests for its
// gateway (the node's 10.201.1.1) crafted on a packet socket. With its own address as
// sender, or 0.0.0.0 (an RFC 5227 probe), the node answers; claiming the peer pod's
// address or one nobody holds, the request never reaches the node: no answer, and no
// neighbour entry for the claimed address on the node (the poisoning a gratuitous ARP
// would do). The pod's kernel still resolves its gateway and the node the pod: TCP
// to the peer works after both neighbour tables are flushed. Before the fix every
// ARP packet passed.
func TestRealARPSender(t *testing.T) {
	lab := newTrafficLab(t)
	lab.sysctl(t, "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0", "net.ipv4.conf.h1.rp_filter=0")
	netlab.ServeEcho(t, lab.peer, "tcp4", labPeer4+":9000")
	lab.enterNode(t)
	e := openTestEBPF(t, EBPFOptions{})
	if _, err := e.Commit(lab.hostIfindex, PodPolicy{Addrs: labPodAddrs}); err != nil {
		t.Fatal(err)
	}
	wire := lab.wire(t, lab.pod, "h1")
	atPod := lab.listen(t, lab.pod)
	gw := netip.MustParseAddr("10.201.1.1")
	for _, c := range []struct {
		name string
		spa  netip.Addr
		want bool
	}{
		{"the pod's own address", netip.MustParseAddr(labPod4), true},
		{"the peer pod's address", netip.MustParseAddr(labPeer4), false},
		{"an address nobody holds", netip.MustParseAddr("10.201.1.77"), false},
		{"0.0.0.0 (a probe)", netip.IPv4Unspecified(), true},
	} {
		netlab.Run(t, "ip", "-n", lab.node, "neigh", "flush", "dev", "h1")
		wire.send(t, unix.ETH_P_ARP, arpRequest(wire.mac, c.spa, gw))
		answered := atPod.arrived(unix.ETH_P_ARP, func(a []byte) bool {
			return len(a) >= 28 && a[7] == 2 && netip.AddrFrom4([4]byte(a[14:18])) == gw && netip.AddrFrom4([4]byte(a[24:28])) == c.spa
		})
		if answered != c.want {
			t.Errorf("ARP request for the gateway from %s (%s): answered=%v, want %v", c.spa, c.name, answered, c.want)
		}
		if c.spa.IsUnspecified() {
			continue
		}
		out, err := exec.Command("ip", "-n", lab.node, "neigh", "show", c.spa.String(), "dev", "h1").CombinedOutput()
		if err != nil {
			t.Fatalf("ip neigh show: %v: %s", err, out)
		}
		if learned := strings.TrimSpace(string(out)) != ""; learned != c.want {
			t.Errorf("ARP request from %s (%s): the node learned a neighbour entry %v, want %v (%s)", c.spa, c.name, learned, c.want, out)
		}
	}
	for _, ns := range []string{lab.node, lab.pod} {
		netlab.Run(t, "ip", "-n", ns, "neigh", "flush", "all")
	}
	if err := netlab.Exchange(lab.pod, "tcp4", labPeer4+":9000", time.Second); err != nil {
		t.Errorf("pod → peer TCP after flushing the neighbour tables (ARP from the pod's own address): %v", err)
	}
}
