package bpfmaps

import (
	"encoding/binary"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/npagent/npagent/internal/testenv/netlab"
)

// enterNode moves the calling goroutine's thread into the lab's node namespace until
// the test ends (programs attach to interfaces of the caller's namespace).
func (l *trafficLab) enterNode(t *testing.T) {
	t.Helper()
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	node, err := netns.GetFromName(l.node)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	if err := netns.Set(node); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = netns.Set(orig)
		orig.Close()
		runtime.UnlockOSThread()
	})
}

// rawSocket opens a socket in namespace ns whose reads time out after timeout.
func rawSocket(t *testing.T, ns string, domain, typ, proto int, timeout time.Duration) int {
	t.Helper()
	fd, err := netlab.In(ns, func() (int, error) { return unix.Socket(domain, typ|unix.SOCK_CLOEXEC, proto) })
	if err != nil {
		t.Fatalf("socket in %s: %v", ns, err)
	}
	t.Cleanup(func() { _ = unix.Close(fd) })
	tv := unix.NsecToTimeval(timeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	return fd
}

// awaitPacket reads fd until match accepts a packet or timeout passes.
func awaitPacket(fd int, timeout time.Duration, match func([]byte) bool) bool {
	buf := make([]byte, 2048)
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			continue // EAGAIN at the read timeout
		}
		if match(buf[:n]) {
			return true
		}
	}
	return false
}

// TestRealIPv6ExtensionHeaders: the pod's egress has an admin-tier Deny for TCP 8080
// to the peer. SYNs the pod sends (crafted on a packet socket) with 0 to 8
// destination options headers before the TCP header never reach the peer on port
// 8080 and do on 8081; with 9 or 12 headers (more than the datapath walks) neither
// does: such a packet is not judged, it is dropped. Before the fix, 5 to 12 headers
// took a SYN to 8080 through the Deny.
func TestRealIPv6ExtensionHeaders(t *testing.T) {
	lab := newTrafficLab(t)
	lab.enterNode(t)
	e := openTestEBPF(t, EBPFOptions{})
	pol := PodPolicy{Egress: DirectionPolicy{Admin: []TierRule{{Priority: 1, Action: ActionDeny,
		Rule: Rule{CIDR: netip.MustParsePrefix("fd00:201:2::/64"), Ports: []PortRule{{Protocol: ProtocolTCP, Port: 8080}}}}}}}
	if _, err := e.Commit(lab.hostIfindex, pol); err != nil {
		t.Fatal(err)
	}
	h1, err := net.InterfaceByName("h1") // the node namespace's side of the pod's veth
	if err != nil {
		t.Fatal(err)
	}
	podIf, err := netlab.In(lab.pod, func() (*net.Interface, error) { return net.InterfaceByName("eth0") })
	if err != nil {
		t.Fatal(err)
	}
	peerIf, err := netlab.In(lab.peer, func() (*net.Interface, error) { return net.InterfaceByName("eth0") })
	if err != nil {
		t.Fatal(err)
	}
	proto := int(htons(unix.ETH_P_IPV6))
	send := rawSocket(t, lab.pod, unix.AF_PACKET, unix.SOCK_RAW, proto, time.Second)
	listen := rawSocket(t, lab.peer, unix.AF_PACKET, unix.SOCK_RAW, proto, 50*time.Millisecond)
	if err := unix.Bind(listen, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IPV6), Ifindex: peerIf.Index}); err != nil {
		t.Fatal(err)
	}
	pod6, peer6 := netip.MustParseAddr(labPod6), netip.MustParseAddr(labPeer6)
	sport := uint16(33000)
	for _, n := range []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 12} {
		for _, port := range []uint16{8080, 8081} {
			sport++
			ip := ipv6Chain(pod6, peer6, dests(n), ProtocolTCP, l4Bytes(ProtocolTCP, sport, port))
			frame := append(append(append([]byte{}, h1.HardwareAddr...), podIf.HardwareAddr...), 0x86, 0xdd)
			frame = append(frame, ip...)
			if err := unix.Sendto(send, frame, 0, &unix.SockaddrLinklayer{Ifindex: podIf.Index, Protocol: htons(unix.ETH_P_IPV6)}); err != nil {
				t.Fatal(err)
			}
			tcpAt := 14 + 40 + 8*n
			got := awaitPacket(listen, trafficTimeout, func(b []byte) bool {
				return len(b) >= tcpAt+4 && netip.AddrFrom16([16]byte(b[14+8:14+24])) == pod6 &&
					binary.BigEndian.Uint16(b[tcpAt:]) == sport && binary.BigEndian.Uint16(b[tcpAt+2:]) == port
			})
			want := port != 8080 && n <= 8
			if got != want {
				t.Errorf("SYN to TCP %d after %d destination options headers: reached the peer=%v, want %v", port, n, got, want)
			}
		}
	}
	if t.Failed() {
		t.Logf("policy: %+v", pol)
	}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
