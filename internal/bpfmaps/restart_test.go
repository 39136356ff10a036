package bpfmaps

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

const (
	childEnv        = "NPAGENT_BPFMAPS_TEST_CHILD"
	childPinEnv     = "NPAGENT_BPFMAPS_TEST_PIN"
	childIfindexEnv = "NPAGENT_BPFMAPS_TEST_IFINDEX"
)

// restartPolicies are what the child commits (first) and the adopting parent (second).
func restartPolicies() (first, second PodPolicy) {
	pfx := netip.MustParsePrefix
	first = PodPolicy{
		Ingress: DirectionPolicy{Isolated: true, Allow: []Rule{{CIDR: pfx("10.1.0.0/16"), Ports: []PortRule{{Protocol: ProtocolTCP, Port: 80}}}}},
		Egress:  DirectionPolicy{Admin: []TierRule{{Priority: 1, Action: ActionDeny, Rule: Rule{CIDR: pfx("fd00:1::/32")}}}},
	}
	second = PodPolicy{
		Ingress: DirectionPolicy{Isolated: true, Allow: []Rule{{CIDR: pfx("10.2.0.0/16"), Ports: []PortRule{{Protocol: ProtocolTCP, Port: 80}}}}},
		Egress:  first.Egress,
	}
	return first, second
}

// runChild is the body of the re-executed test binary: it commits the first restart
// policy, leaves an orphan entry as a commit that crashed between its write and its
// switch would, and exits without closing anything.
func runChild(role string) int {
	if role == "open-and-exit" {
		return runOpenChild()
	}
	if role != "commit-and-exit" {
		fmt.Fprintf(os.Stderr, "unknown child role %q\n", role)
		return 2
	}
	ifindex, err := strconv.Atoi(os.Getenv(childIfindexEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	e, err := OpenEBPF(EBPFOptions{PinPath: os.Getenv(childPinEnv)})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	first, _ := restartPolicies()
	if _, err := e.Commit(ifindex, first); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	rec := e.pods[uint32(ifindex)]
	in := rec.dirs[Ingress].ref
	orphan := policyLpmKey4{Prefixlen: 64 + 8, Group: in.id(), Tag: entryTag(in.set^1, tierNamespaced), Addr: [4]byte{11}}
	var v policyRuleValue
	v.Count = 1
	v.Rules[0] = policyPortRule{EndPort: allPortsEndPort, Action: uint8(ActionAccept)}
	if err := e.objs.NpaInV4.Put(orphan, v); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0 // exit holding every handle: the kernel closes them
}

// TestRestartAdoptsPinnedState: a process commits and exits; enforcement holds with no
// process alive; a new OpenEBPF adopts pods, entry sets and hashes (an unchanged
// re-commit is skipped), cleans the crashed commit's orphan entry, and changes policy.
func TestRestartAdoptsPinnedState(t *testing.T) {
	requireKernel(t)
	pin := testPinPath(t)
	ifindex := dummyInterface(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=commit-and-exit", childPinEnv+"="+pin, childIfindexEnv+"="+strconv.Itoa(ifindex))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}

	// No process holds a handle now: the pinned link's program still decides.
	first, second := restartPolicies()
	toPod := pinnedProgram(t, filepath.Join(pin, "links", fmt.Sprintf("%d-to_pod", ifindex)))
	fromPod := pinnedProgram(t, filepath.Join(pin, "links", fmt.Sprintf("%d-from_pod", ifindex)))
	in1 := packet{peer: netip.MustParseAddr("10.1.0.9"), proto: ProtocolTCP, port: 80}
	in2 := packet{peer: netip.MustParseAddr("10.2.0.9"), proto: ProtocolTCP, port: 80}
	out := packet{peer: netip.MustParseAddr("fd00:1::9"), proto: ProtocolUDP, port: 53}
	verdicts := func(to, from *ebpf.Program) [3]bool {
		return [3]bool{
			run(t, to, ifindex, packetBytes(in1.peer, podAddrIngress4, ProtocolTCP, 30000, 80)),
			run(t, to, ifindex, packetBytes(in2.peer, podAddrIngress4, ProtocolTCP, 30000, 80)),
			run(t, from, ifindex, packetBytes(podAddrEgress6, out.peer, ProtocolUDP, 30000, 53)),
		}
	}
	if got, want := verdicts(toPod, fromPod), [3]bool{true, false, false}; got != want {
		t.Fatalf("after the child exited: verdicts %v, want %v (the first policy)", got, want)
	}

	e := openTestEBPF(t, EBPFOptions{PinPath: pin})
	if got := e.Pods(); len(got) != 1 || got[0] != ifindex {
		t.Fatalf("adopted pods %v, want [%d]", got, ifindex)
	}
	if n, want := trieEntries(t, e), e.pods[uint32(ifindex)].dirs[Ingress].entries().len()+e.pods[uint32(ifindex)].dirs[Egress].entries().len(); n != want || want == 0 {
		t.Fatalf("%d trie entries after adoption, want the %d of the active sets (orphan not cleaned?)", n, want)
	}
	res, err := e.Commit(ifindex, first)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Skipped {
		t.Fatalf("re-commit of the adopted policy was not skipped: %+v", res)
	}
	if _, err := e.Commit(ifindex, second); err != nil {
		t.Fatal(err)
	}
	want := [3]bool{false, true, false}
	if got := verdicts(e.objs.ToPod, e.objs.FromPod); got != want {
		t.Fatalf("after adopting and committing the second policy: verdicts %v, want %v", got, want)
	}
	// The pinned link now runs this process's program.
	if got := verdicts(pinnedProgram(t, filepath.Join(pin, "links", fmt.Sprintf("%d-to_pod", ifindex))), fromPod); got != want {
		t.Fatalf("through the pinned link: verdicts %v, want %v", got, want)
	}
	if _, err := e.Remove(ifindex); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(pin, "links", fmt.Sprintf("%d-to_pod", ifindex))); !os.IsNotExist(err) {
		t.Fatalf("link still pinned after Remove: %v", err)
	}
}

// pinnedProgram opens the program a pinned link runs, closed at cleanup.
func pinnedProgram(t *testing.T, path string) *ebpf.Program {
	t.Helper()
	l, err := link.LoadPinnedLink(path, nil)
	if err != nil {
		t.Fatalf("load pinned link: %v", err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		t.Fatal(err)
	}
	prog, err := ebpf.NewProgramFromID(info.Program)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = prog.Close() })
	return prog
}

// TestDatapathChecksStateOwner: a program that reaches a slot whose words another pod
// owns (the slot mapping it read was deleted and its element reused) treats the packet
// as unmanaged instead of deciding it by that pod's policy.
func TestDatapathChecksStateOwner(t *testing.T) {
	e := openTestEBPF(t, EBPFOptions{})
	ifindex := dummyInterface(t)
	denyAll := PodPolicy{Ingress: DirectionPolicy{Isolated: true}}
	if _, err := e.Commit(ifindex, denyAll); err != nil {
		t.Fatal(err)
	}
	pkt := packet{peer: netip.MustParseAddr("10.1.0.9"), proto: ProtocolTCP, port: 80}
	if e.kernelVerdict(t, ifindex, Ingress, pkt) {
		t.Fatal("deny-all policy let a packet in")
	}
	slot := e.states.slots[uint32(ifindex)]
	own := e.states.word(slot, int(Ingress)).Load()
	e.states.word(slot, int(Ingress)).Store(dirWord(uint32(ifindex)+1, wordGen(own), wordFlags(own)))
	if !e.kernelVerdict(t, ifindex, Ingress, pkt) {
		t.Fatal("the program decided a packet by a state word another pod owns")
	}
	e.states.word(slot, int(Ingress)).Store(own)
	if e.kernelVerdict(t, ifindex, Ingress, pkt) {
		t.Fatal("deny-all policy let a packet in after its word was restored")
	}
}

// TestOpenRepairsPodSlots: what a process that died half-way through a commit or a
// removal leaves is repaired at the next start. A slot filled but not yet mapped is
// cleared and reused; a mapping to a slot its pod does not own is deleted; a direction
// whose hash was left unknown (a switch cut between its word and its hash) is
// rewritten by the next commit, not skipped.
func TestOpenRepairsPodSlots(t *testing.T) {
	requireKernel(t)
	pin := testPinPath(t)
	kept, mismapped := dummyInterface(t), dummyInterface(t)
	prev, err := OpenEBPF(EBPFOptions{PinPath: pin, Limits: Limits{Pods: 4}})
	if err != nil {
		t.Fatal(err)
	}
	pol := PodPolicy{Ingress: DirectionPolicy{Isolated: true}}
	for _, i := range []int{kept, mismapped} {
		if _, err := prev.Commit(i, pol); err != nil {
			t.Fatal(err)
		}
	}
	// A first commit that died after filling its slot, before mapping it.
	orphan := prev.states.free[len(prev.states.free)-1]
	prev.states.write(orphan, &policyPodState{Dir: [2]uint64{dirWord(999, 1, 0), dirWord(999, 1, 0)}})
	// A switch of kept's ingress cut after its word was stored.
	prev.states.hash(prev.states.slots[uint32(kept)], int(Ingress)).Store(unknownHash)
	// A mapping whose slot holds another pod's words.
	if err := prev.objs.NpaPodSlot.Update(uint32(mismapped), prev.states.slots[uint32(kept)], ebpf.UpdateExist); err != nil {
		t.Fatal(err)
	}
	if err := prev.Close(); err != nil {
		t.Fatal(err)
	}

	e := openTestEBPF(t, EBPFOptions{PinPath: pin, Limits: Limits{Pods: 4}})
	if got := e.Pods(); len(got) != 1 || got[0] != kept {
		t.Fatalf("adopted pods %v, want [%d]", got, kept)
	}
	if st := e.states.read(orphan); st != (policyPodState{}) {
		t.Fatalf("orphan slot %d not cleared: %+v", orphan, st)
	}
	if len(e.states.free) != 3 {
		t.Fatalf("%d free slots, want 3 of 4", len(e.states.free))
	}
	var slot uint32
	if err := e.objs.NpaPodSlot.Lookup(uint32(mismapped), &slot); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatalf("mismapped interface %d still has a slot mapping (%d, %v)", mismapped, slot, err)
	}
	// The interface whose state was dropped is committed afresh and enforced; the
	// unknown hash is rewritten.
	if _, err := e.Commit(mismapped, pol); err != nil {
		t.Fatal(err)
	}
	res, err := e.Commit(kept, pol)
	if err != nil || res.Skipped {
		t.Fatalf("commit over an unknown hash: %+v %v, want a rewrite", res, err)
	}
	if res, err := e.Commit(kept, pol); err != nil || !res.Skipped {
		t.Fatalf("second commit of the same policy: %+v %v, want skipped", res, err)
	}
	pkt := packet{peer: netip.MustParseAddr("10.1.0.9"), proto: ProtocolTCP, port: 80}
	if e.kernelVerdict(t, mismapped, Ingress, pkt) || e.kernelVerdict(t, kept, Ingress, pkt) {
		t.Fatal("a deny-all pod let a packet in after the repair")
	}
}

// TestOpenRepairsEntrySets: what a process that died in a commit leaves in the entry
// sets is repaired at the next start, and level sets are adopted as level. Pod
// "level" has two level sets; pod "before" has an inactive set a commit was writing
// when it died (an extra entry, a changed value); pod "after" has an inactive set a
// commit was bringing level after its switch when it died (an entry missing). After
// the restart every pod decides as its committed policy, the unlevel sets are gone,
// and further commits are deltas again.
func TestOpenRepairsEntrySets(t *testing.T) {
	requireKernel(t)
	pin := testPinPath(t)
	level, before, after := dummyInterface(t), dummyInterface(t), dummyInterface(t)
	pods := []int{level, before, after}
	base := widePolicy(20, 80)
	base.Egress = DirectionPolicy{Admin: []TierRule{{Priority: 1, Action: ActionDeny, Rule: Rule{CIDR: netip.MustParsePrefix("fd00:1::/32")}}}}
	grow := func(p PodPolicy, last byte) PodPolicy {
		p.Ingress = cloneDirection(p.Ingress)
		p.Ingress.Allow = append(p.Ingress.Allow, Rule{CIDR: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 9, 9, last}), 32)})
		return p
	}
	committed := map[int]PodPolicy{}
	prev, err := OpenEBPF(EBPFOptions{PinPath: pin})
	if err != nil {
		t.Fatal(err)
	}
	for n, i := range pods {
		// Each pod its own rules, so that each has its own entry group.
		own := grow(base, byte(100+n))
		committed[i] = own
		if _, err := prev.Commit(i, own); err != nil {
			t.Fatal(err)
		}
		committed[i] = grow(own, 1)
		if _, err := prev.Commit(i, committed[i]); err != nil {
			t.Fatal(err)
		}
		if !isLevel(prev.pods[uint32(i)], Ingress) {
			t.Fatal("the second commit of a small change left the sets unlevel")
		}
	}
	inactiveKey := func(i int) policyLpmKey4 {
		r := prev.pods[uint32(i)].dirs[Ingress].ref
		return tagKeys4(r.held().entries.k4[:1], r.g.id, r.set^1)[0]
	}
	var accept policyRuleValue
	accept.Count = 1
	accept.Rules[0] = policyPortRule{EndPort: allPortsEndPort, Action: uint8(ActionAccept)}
	// "before": an entry added and a value changed in its inactive set.
	extra := inactiveKey(before)
	extra.Addr = [4]byte{10, 7, 7, 7}
	for _, k := range []policyLpmKey4{extra, inactiveKey(before)} {
		if err := prev.objs.NpaInV4.Put(k, accept); err != nil {
			t.Fatal(err)
		}
	}
	// "after": an entry missing from its inactive set.
	if err := prev.objs.NpaInV4.Delete(inactiveKey(after)); err != nil {
		t.Fatal(err)
	}
	if err := prev.Close(); err != nil {
		t.Fatal(err)
	}

	e := openTestEBPF(t, EBPFOptions{PinPath: pin})
	g := newPolicyGen(21)
	var pkts []packet
	for range 200 {
		pkts = append(pkts, g.packet())
	}
	for _, a := range []string{"10.0.0.5", "10.9.9.1", "10.9.9.2", "10.7.7.7"} {
		pkts = append(pkts, packet{peer: netip.MustParseAddr(a), proto: ProtocolTCP, port: 80}, packet{peer: netip.MustParseAddr(a), proto: ProtocolTCP, port: 81})
	}
	check := func(stage string) {
		t.Helper()
		checkGroups(t, e.core, func(d Direction, group, set uint32) dirEntries { return e.kernelSetEntries(t, d, group, set) })
		want := 0
		for d := range e.groups {
			for _, g := range e.groups[d].byID {
				want += g.sets[0].entries.len() + g.sets[1].entries.len()
			}
		}
		for _, i := range pods {
			rec := e.pods[uint32(i)]
			if rec == nil {
				t.Fatalf("%s: pod %d not adopted", stage, i)
			}
			for _, pkt := range pkts {
				for _, d := range []Direction{Ingress, Egress} {
					if got, want := e.kernelVerdict(t, i, d, pkt), referenceVerdict(committed[i], d, pkt); got != want {
						t.Fatalf("%s: pod %d %s %v %v/%d: verdict %v, want %v", stage, i, d, pkt.peer, pkt.proto, pkt.port, got, want)
					}
				}
			}
		}
		if n := trieEntries(t, e); n != want {
			t.Fatalf("%s: %d trie entries, want the %d of the pods' sets", stage, n, want)
		}
		if used := e.used[0][0] + e.used[0][1] + e.used[1][0] + e.used[1][1]; used != want {
			t.Fatalf("%s: %d entries accounted, %d held", stage, used, want)
		}
	}
	check("after the restart")
	for i, wantLevel := range map[int]bool{level: true, before: false, after: false} {
		if got := isLevel(e.pods[uint32(i)], Ingress); got != wantLevel {
			t.Errorf("pod %d: ingress sets adopted level=%v, want %v", i, got, wantLevel)
		}
	}
	for _, i := range pods {
		if res, err := e.Commit(i, committed[i]); err != nil || !res.Skipped {
			t.Fatalf("pod %d: re-commit of the adopted policy: %+v %v, want skipped", i, res, err)
		}
	}
	for round, last := range []byte{2, 3} {
		for _, i := range pods {
			committed[i] = grow(committed[i], last)
			res, err := e.Commit(i, committed[i])
			if err != nil {
				t.Fatal(err)
			}
			// A pod whose second set was dropped writes it in full once.
			if wantDelta := round == 1 || i == level; res.Delta != wantDelta {
				t.Errorf("round %d pod %d: commit %+v, want Delta %v", round, i, res, wantDelta)
			}
		}
		check(fmt.Sprintf("after commit round %d", round))
	}
}

// TestOpenRefusesUnmarkedEntries: entries without an entry-set mark were written by
// an unreleased build (one generation per commit). OpenEBPF does not migrate them:
// it refuses with ErrIncompatiblePins naming the pin directory, and changes
// nothing (the entries stay as they were).
func TestOpenRefusesUnmarkedEntries(t *testing.T) {
	requireKernel(t)
	pin := testPinPath(t)
	pod := dummyInterface(t)
	prev, err := OpenEBPF(EBPFOptions{PinPath: pin})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := prev.Commit(pod, widePolicy(3, 80)); err != nil {
		t.Fatal(err)
	}
	// Its active entries retagged gen << 2 | tier, as the unreleased build wrote them.
	rec := prev.pods[uint32(pod)]
	w := rec.state.Dir[Ingress]
	var v policyRuleValue
	var unmarked []policyLpmKey4
	in := rec.dirs[Ingress].ref
	for _, k := range tagKeys4(in.held().entries.k4, in.id(), in.set) {
		if err := prev.objs.NpaInV4.Lookup(k, &v); err != nil {
			t.Fatal(err)
		}
		if err := prev.objs.NpaInV4.Delete(k); err != nil {
			t.Fatal(err)
		}
		k.Tag = wordGen(w)<<2 | uint32(tagTier(k.Tag))
		if err := prev.objs.NpaInV4.Put(k, v); err != nil {
			t.Fatal(err)
		}
		unmarked = append(unmarked, k)
	}
	if len(unmarked) == 0 {
		t.Fatal("the policy wrote no IPv4 ingress entries to retag")
	}
	if err := prev.Close(); err != nil {
		t.Fatal(err)
	}

	e, err := OpenEBPF(EBPFOptions{PinPath: pin})
	if err == nil {
		_ = e.Close()
		t.Fatal("OpenEBPF adopted entries of an unreleased layout; want ErrIncompatiblePins")
	}
	if !errors.Is(err, ErrIncompatiblePins) || !strings.Contains(err.Error(), pin) {
		t.Fatalf("OpenEBPF: %v; want ErrIncompatiblePins naming %s", err, pin)
	}
	m, err := ebpf.LoadPinnedMap(filepath.Join(pin, "npa_in_v4"), nil)
	if err != nil {
		t.Fatalf("reopen the pinned trie: %v", err)
	}
	defer m.Close()
	for _, k := range unmarked {
		if err := m.Lookup(k, &v); err != nil {
			t.Errorf("entry %+v gone after the refusal: %v", k, err)
		}
	}
}

// TestOpenRefusesToMountBPFFS: with no bpffs at /sys/fs/bpf, OpenEBPF fails with
// ErrNoBPFFS, telling the operator to mount it on the host, and mounts nothing
// itself (a mount inside the agent's container would die with it, pins and all).
// The test unmounts bpffs in a private mount namespace of its own thread, so the
// host's mount is untouched.
func TestOpenRefusesToMountBPFFS(t *testing.T) {
	requireKernel(t)
	done := make(chan struct{})
	go func() { // a thread of its own: it ends in the private namespace and dies with it
		defer close(done)
		runtime.LockOSThread() // never unlocked: the runtime discards the thread
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			t.Errorf("unshare mount namespace: %v", err)
			return
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			t.Errorf("make mounts private: %v", err)
			return
		}
		if err := unix.Unmount("/sys/fs/bpf", unix.MNT_DETACH); err != nil {
			t.Errorf("unmount bpffs in the private namespace: %v", err)
			return
		}
		_, err := OpenEBPF(EBPFOptions{PinPath: fmt.Sprintf("/sys/fs/bpf/npagent-nobpffs-%d", os.Getpid())})
		if !errors.Is(err, ErrNoBPFFS) || !strings.Contains(err.Error(), "mount it on the host") {
			t.Errorf("OpenEBPF without bpffs: %v; want ErrNoBPFFS telling to mount it on the host", err)
		}
		var st unix.Statfs_t
		if err := unix.Statfs("/sys/fs/bpf", &st); err == nil && st.Type == bpfFSMagic {
			t.Error("OpenEBPF mounted bpffs itself")
		}
	}()
	<-done
}
