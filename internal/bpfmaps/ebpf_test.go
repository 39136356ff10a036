package bpfmaps

import (
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// TestStateMapLayout: the commit's switch relies on the state words living in an
// array user space maps into memory and stores into atomically (policy.c), found
// through an ifindex → slot hash.
func TestStateMapLayout(t *testing.T) {
	spec, err := loadPolicy()
	if err != nil {
		t.Fatal(err)
	}
	const mmapable = 1 << 10 // BPF_F_MMAPABLE
	if ms := spec.Maps[policyMapNpaSlotState]; ms.Type != ebpf.Array || ms.Flags&mmapable == 0 || int(ms.ValueSize) != podStateSize {
		t.Errorf("state map is a %v with flags %#x and %d-byte values, want an mmapable array of %d-byte pod_state", ms.Type, ms.Flags, ms.ValueSize, podStateSize)
	}
	if ms := spec.Maps[policyMapNpaPodSlot]; ms.Type != ebpf.Hash || ms.KeySize != 4 || ms.ValueSize != 4 {
		t.Errorf("slot map is a %v with %d-byte keys and %d-byte values, want a hash from u32 to u32", ms.Type, ms.KeySize, ms.ValueSize)
	}
}

// TestKernelVerdictsMatchVerdict runs the property test's random policies through the
// real program with BPF_PROG_TEST_RUN: every crafted packet (IPv4/IPv6, TCP, UDP,
// SCTP, ICMP; IPv6 ones behind 0 to 8 destination options headers) gets the verdict
// DirectionPolicy.Verdict gives, or passes when its peer is in the node set
// (testNodeSet).
func TestKernelVerdictsMatchVerdict(t *testing.T) {
	e := openTestEBPF(t, EBPFOptions{})
	ifaces := []int{dummyInterface(t), dummyInterface(t)}
	g := newPolicyGen(1).withNode()
	rounds, packets := 300, 150
	if testing.Short() {
		rounds = 40
	}
	checked, allowed := checkAgainstReference(t, g, e, ifaces, rounds, packets, func(ifindex int, d Direction, pkt packet) bool {
		return e.kernelVerdictExt(t, ifindex, d, pkt)
	})
	t.Logf("%d packets checked in the kernel, %d allowed", checked, allowed)
	for _, i := range ifaces {
		if _, err := e.Remove(i); err != nil {
			t.Fatal(err)
		}
	}
	if n := trieEntries(t, e); n != 0 {
		t.Fatalf("%d trie entries left after removing every pod", n)
	}
}

// trieEntries counts the entries in all four tries.
func trieEntries(t testing.TB, e *EBPF) int {
	t.Helper()
	n := 0
	var v policyRuleValue
	for _, m := range []*ebpf.Map{e.objs.NpaInV4, e.objs.NpaEgV4} {
		var k policyLpmKey4
		it := m.Iterate()
		for it.Next(&k, &v) {
			n++
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range []*ebpf.Map{e.objs.NpaInV6, e.objs.NpaEgV6} {
		var k policyLpmKey6
		it := m.Iterate()
		for it.Next(&k, &v) {
			n++
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

func TestKernelBadInputLeavesNothingVisible(t *testing.T) {
	e := openTestEBPF(t, EBPFOptions{Limits: Limits{Pods: 8, EntriesV4: 16, EntriesV6: 16}})
	ifindex := dummyInterface(t)
	good := PodPolicy{Ingress: DirectionPolicy{Isolated: true, Allow: []Rule{{CIDR: netip.MustParsePrefix("10.0.0.0/8")}}}}
	if _, err := e.Commit(ifindex, good); err != nil {
		t.Fatal(err)
	}
	before := trieEntries(t, e)
	allowedPeer := packet{peer: netip.MustParseAddr("10.1.1.1"), proto: ProtocolTCP, port: 80}
	deniedPeer := packet{peer: netip.MustParseAddr("11.1.1.1"), proto: ProtocolTCP, port: 80}
	check := func(name string) {
		t.Helper()
		if n := trieEntries(t, e); n != before {
			t.Errorf("%s: %d trie entries after a rejected commit, want %d", name, n, before)
		}
		if !e.kernelVerdict(t, ifindex, Ingress, allowedPeer) || e.kernelVerdict(t, ifindex, Ingress, deniedPeer) {
			t.Errorf("%s: the committed policy changed after a rejected commit", name)
		}
	}
	for _, c := range badPolicies() {
		_, err := e.Commit(ifindex, c.pol)
		if !errors.Is(err, ErrInvalidPolicy) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want ErrInvalidPolicy containing %q", c.name, err, c.want)
		}
		check(c.name)
	}
	big := DirectionPolicy{Isolated: true}
	for i := range 17 {
		big.Allow = append(big.Allow, Rule{CIDR: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i), 0, 0}), 16)})
	}
	_, err := e.Commit(ifindex, PodPolicy{Ingress: big})
	if !errors.Is(err, ErrCapacity) {
		t.Errorf("17 entries in a 16-entry trie: error %v, want ErrCapacity", err)
	}
	check("capacity")
}

// TestEveryTargetsObject: the object generated for each deployment target
// (policy_x86_bpfel.o, policy_arm64_bpfel.o; they differ in how the state word is
// loaded) passes this kernel's verifier and decides as Verdict does. On an amd64
// host this checks the arm64 program's fetch-add load through the verifier and the
// x86 JIT; the arm64 memory ordering itself only an arm64 machine exercises.
func TestEveryTargetsObject(t *testing.T) {
	objs, err := filepath.Glob("policy_*_bpfel.o")
	if err != nil || len(objs) < 2 {
		t.Fatalf("generated objects %v (%v), want one per deployment target", objs, err)
	}
	for _, obj := range objs {
		t.Run(obj, func(t *testing.T) {
			requireKernel(t)
			e, err := openEBPF(EBPFOptions{PinPath: testPinPath(t)}, func() (*ebpf.CollectionSpec, error) {
				return ebpf.LoadCollectionSpec(obj)
			})
			if err != nil {
				t.Fatalf("open with %s: %v", obj, err)
			}
			defer e.Close()
			ifaces := []int{dummyInterface(t)}
			checked, allowed := checkAgainstReference(t, newPolicyGen(7).withNode(), e, ifaces, 30, 100, func(ifindex int, d Direction, pkt packet) bool {
				return e.kernelVerdict(t, ifindex, d, pkt)
			})
			t.Logf("%s: %d packets checked in the kernel, %d allowed", obj, checked, allowed)
		})
	}
}

// TestProbeTCX: the running kernel has tcx (the test machines run Linux >= 6.6), so
// the probe passes; a kernel without it (cilium/ebpf's ErrNotSupported, faked here:
// pure logic) makes OpenEBPF fail naming the feature and the kernel, where the maps
// would load and every pod's attach fail.
func TestProbeTCX(t *testing.T) {
	e := openTestEBPF(t, EBPFOptions{})
	if err := probeTCX(e.objs.FromPod, link.AttachTCX); err != nil {
		t.Fatalf("probe on this kernel: %v", err)
	}
	noTCX := func(link.TCXOptions) (link.Link, error) {
		return nil, fmt.Errorf("attach tcx: %w", ebpf.ErrNotSupported)
	}
	err := probeTCX(e.objs.FromPod, noTCX)
	if !errors.Is(err, ErrKernelFeature) || !strings.Contains(err.Error(), "Linux 6.6") || !strings.Contains(err.Error(), "not in kernel ") {
		t.Fatalf("probe without tcx: %v, want ErrKernelFeature naming the feature and the kernel", err)
	}
}
