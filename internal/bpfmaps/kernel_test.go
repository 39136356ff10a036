package bpfmaps

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/npagent/npagent/internal/testenv/netlab"
	"github.com/npagent/npagent/internal/testenv/skip"
)

// Helpers for the tests that need the kernel. They skip, saying why, unless the test
// runs as root on a kernel with bpffs, tcx and BPF_PROG_TEST_RUN.

func TestMain(m *testing.M) {
	if role := os.Getenv(childEnv); role != "" {
		os.Exit(runChild(role))
	}
	before := bpfFDs()
	code := m.Run()
	if after := bpfFDs(); code == 0 && len(after) > len(before) {
		fmt.Fprintf(os.Stderr, "leaked bpf file descriptors: %d before the tests, %d after: %v\n", len(before), len(after), after)
		code = 1
	}
	os.Exit(code)
}

// bpfFDs lists this process's open bpf object descriptors (maps, programs, links).
func bpfFDs() []string {
	ents, _ := os.ReadDir("/proc/self/fd")
	var out []string
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err == nil && strings.HasPrefix(target, "anon_inode:bpf") {
			out = append(out, e.Name()+"="+target)
		}
	}
	return out
}

var kernelChecked struct {
	done   atomic.Bool
	reason string
}

// requireKernel skips the test unless eBPF can be used here.
func requireKernel(t testing.TB) {
	t.Helper()
	if !skip.Root() {
		skip.Unmet(t, "needs root (CAP_BPF to load programs, CAP_NET_ADMIN to attach them): run as root")
	}
	if !kernelChecked.done.Load() {
		netlab.HostBPFFS(t) // the host's part: OpenEBPF never mounts it
		if err := ensureBPFFS(filepath.Join("/sys/fs/bpf", fmt.Sprintf("npagent-probe-%d", os.Getpid()))); err != nil {
			kernelChecked.reason = "bpffs unavailable: " + err.Error()
		}
		_ = os.RemoveAll(filepath.Join("/sys/fs/bpf", fmt.Sprintf("npagent-probe-%d", os.Getpid())))
		kernelChecked.done.Store(true)
	}
	if kernelChecked.reason != "" {
		skip.Unmet(t, "%s", kernelChecked.reason)
	}
}

var pinSeq atomic.Int64

// testPinPath returns a fresh pin directory removed (unpinning everything) at cleanup.
func testPinPath(t testing.TB) string {
	dir := filepath.Join("/sys/fs/bpf", fmt.Sprintf("npagent-test-%d-%d", os.Getpid(), pinSeq.Add(1)))
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// openTestEBPF opens the kernel backend on a fresh pin path, closed at cleanup.
func openTestEBPF(t testing.TB, opts EBPFOptions) *EBPF {
	t.Helper()
	requireKernel(t)
	if opts.PinPath == "" {
		opts.PinPath = testPinPath(t)
	}
	e, err := OpenEBPF(opts)
	if err != nil {
		if strings.Contains(err.Error(), "not supported") {
			skip.Unmet(t, "kernel lacks a needed eBPF feature: %v", err)
		}
		t.Fatalf("OpenEBPF: %v", err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

var ifaceSeq atomic.Int64

// dummyInterface creates an interface (one end of a veth pair, both ends down) in the
// current network namespace for programs to attach to and for BPF_PROG_TEST_RUN to
// name as the packet's device. No traffic crosses it. Deleted at cleanup.
func dummyInterface(t testing.TB) int {
	t.Helper()
	n := ifaceSeq.Add(1)
	name := fmt.Sprintf("npt%d-%d", os.Getpid()%100000, n)
	peer := fmt.Sprintf("npp%d-%d", os.Getpid()%100000, n)
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer}); err != nil {
		t.Fatalf("create veth interface %s: %v", name, err)
	}
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatalf("find dummy interface %s: %v", name, err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(l) })
	return l.Attrs().Index
}

// skbContext is the head of struct __sk_buff up to ifindex: BPF_PROG_TEST_RUN takes
// the packet's device from it (other fields must be zero).
type skbContext struct {
	Len, PktType, Mark, QueueMapping, Protocol, VlanPresent, VlanTCI, VlanProto uint32
	Priority, IngressIfindex, Ifindex                                           uint32
}

const verdictDrop = 2 // TCX_DROP

// run runs prog on one packet "received on" ifindex and reports whether it passed.
func run(t testing.TB, prog *ebpf.Program, ifindex int, pkt []byte) bool {
	ret, err := prog.Run(&ebpf.RunOptions{Data: pkt, Context: skbContext{Ifindex: uint32(ifindex)}})
	if err != nil {
		t.Fatalf("BPF_PROG_TEST_RUN: %v", err)
	}
	return ret != verdictDrop
}

// packetBytes crafts an Ethernet frame from src to dst. For TCP, UDP and SCTP it
// carries the ports; for ICMP/ICMPv6 an echo request; for other protocols no L4 header.
func packetBytes(src, dst netip.Addr, proto Protocol, sport, dport uint16) []byte {
	var l4 []byte
	switch proto {
	case ProtocolTCP:
		l4 = make([]byte, 20)
		l4[12] = 5 << 4
		l4[13] = 0x02 // SYN
	case ProtocolUDP:
		l4 = make([]byte, 8)
		binary.BigEndian.PutUint16(l4[4:], 8)
	case ProtocolSCTP:
		l4 = make([]byte, 12)
	case ProtocolICMP:
		l4 = []byte{8, 0, 0, 0, 0, 1, 0, 1}
	case ProtocolICMPv6:
		l4 = []byte{128, 0, 0, 0, 0, 1, 0, 1}
	}
	if proto.hasPorts() {
		binary.BigEndian.PutUint16(l4[0:], sport)
		binary.BigEndian.PutUint16(l4[2:], dport)
	}
	eth := []byte{0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2, 0, 0}
	if src.Is4() {
		binary.BigEndian.PutUint16(eth[12:], unix.ETH_P_IP)
		ip := make([]byte, 20)
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(l4)))
		ip[8] = 64
		ip[9] = byte(proto)
		s, d := src.As4(), dst.As4()
		copy(ip[12:], s[:])
		copy(ip[16:], d[:])
		return append(append(eth, ip...), l4...)
	}
	binary.BigEndian.PutUint16(eth[12:], unix.ETH_P_IPV6)
	ip := make([]byte, 40)
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], uint16(len(l4)))
	ip[6] = byte(proto)
	ip[7] = 64
	s, d := src.As16(), dst.As16()
	copy(ip[8:], s[:])
	copy(ip[24:], d[:])
	return append(append(eth, ip...), l4...)
}

// Distinct pod addresses per direction, so that no test packet is ever the reply of
// another direction's connection: the policy tests see policy verdicts only.
var (
	podAddrIngress4 = netip.MustParseAddr("10.255.1.1")
	podAddrEgress4  = netip.MustParseAddr("10.255.2.1")
	podAddrIngress6 = netip.MustParseAddr("fd00:ff::1:1")
	podAddrEgress6  = netip.MustParseAddr("fd00:ff::2:1")
)

var sportSeq atomic.Uint32

// kernelVerdict runs the program of direction d on a packet to or from peer.
func (e *EBPF) kernelVerdict(t testing.TB, ifindex int, d Direction, pkt packet) bool {
	sport := uint16(20000 + sportSeq.Add(1)%10000)
	if d == Ingress {
		pod := podAddrIngress4
		if pkt.peer.Is6() {
			pod = podAddrIngress6
		}
		return run(t, e.objs.ToPod, ifindex, packetBytes(pkt.peer, pod, pkt.proto, sport, pkt.port))
	}
	pod := podAddrEgress4
	if pkt.peer.Is6() {
		pod = podAddrEgress6
	}
	return run(t, e.objs.FromPod, ifindex, packetBytes(pod, pkt.peer, pkt.proto, sport, pkt.port))
}
