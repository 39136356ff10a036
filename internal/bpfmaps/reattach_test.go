package bpfmaps

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/npagent/npagent/internal/testenv/netlab"
)

// attachedPrograms returns the programs attached with tcx to the interface's hook,
// each opened (closed at cleanup).
func attachedPrograms(t *testing.T, ifindex int, at ebpf.AttachType) []*ebpf.Program {
	t.Helper()
	res, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: at})
	if err != nil {
		t.Fatalf("query tcx programs of interface %d: %v", ifindex, err)
	}
	var progs []*ebpf.Program
	for _, p := range res.Programs {
		prog, err := ebpf.NewProgramFromID(p.ID)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = prog.Close() })
		progs = append(progs, prog)
	}
	return progs
}

// TestRestartReattachesMissingLinks: while no agent runs, one pod's links are
// removed (pins deleted and the last reference closed: detached) and another pod's
// links are detached (the pins stay, defunct). At the next OpenEBPF both pods keep
// their state, get their programs attached again (one program per hook, pinned),
// Adoption names them, and the program attached to each interface enforces the
// committed policy: a denied peer is dropped, an allowed one passes.
func TestRestartReattachesMissingLinks(t *testing.T) {
	requireKernel(t)
	pin := testPinPath(t)
	unpinned, detached := dummyInterface(t), dummyInterface(t)
	pods := []int{unpinned, detached}
	slices.Sort(pods)
	pol, _ := restartPolicies()
	prev, err := OpenEBPF(EBPFOptions{PinPath: pin})
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range pods {
		if _, err := prev.Commit(i, pol); err != nil {
			t.Fatal(err)
		}
	}
	if err := prev.Close(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"from_pod", "to_pod"} {
		l, err := link.LoadPinnedLink(filepath.Join(pin, "links", fmt.Sprintf("%d-%s", unpinned, name)), nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Unpin(); err != nil {
			t.Fatal(err)
		}
		_ = l.Close() // the last reference: detached
		l, err = link.LoadPinnedLink(filepath.Join(pin, "links", fmt.Sprintf("%d-%s", detached, name)), nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Detach(); err != nil {
			t.Fatalf("detach the %s link of interface %d: %v", name, detached, err)
		}
		_ = l.Close()
	}
	for _, i := range pods {
		for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
			if n := len(attachedPrograms(t, i, at)); n != 0 {
				t.Fatalf("interface %d: %d programs attached at %v after the links were removed, want 0", i, n, at)
			}
		}
	}

	e := openTestEBPF(t, EBPFOptions{PinPath: pin})
	if got := e.Pods(); !slices.Equal(got, pods) {
		t.Fatalf("adopted pods %v, want %v (state of a pod whose link was gone dropped?)", got, pods)
	}
	if a := e.Adoption(); !slices.Equal(a.Reattached, pods) || a.Pods != 2 || len(a.Vanished) != 0 {
		t.Fatalf("Adoption %+v, want Pods 2 and Reattached %v", a, pods)
	}
	allowed := packetBytes(netip.MustParseAddr("10.1.0.9"), podAddrIngress4, ProtocolTCP, 30000, 80)
	denied := packetBytes(netip.MustParseAddr("10.2.0.9"), podAddrIngress4, ProtocolTCP, 30000, 80)
	for _, i := range pods {
		for _, name := range []string{"from_pod", "to_pod"} {
			if _, err := os.Stat(filepath.Join(pin, "links", fmt.Sprintf("%d-%s", i, name))); err != nil {
				t.Errorf("interface %d: %s link not pinned again: %v", i, name, err)
			}
		}
		if n := len(attachedPrograms(t, i, ebpf.AttachTCXIngress)); n != 1 {
			t.Errorf("interface %d: %d programs attached at tcx ingress (from the pod), want 1", i, n)
		}
		progs := attachedPrograms(t, i, ebpf.AttachTCXEgress)
		if len(progs) != 1 {
			t.Fatalf("interface %d: %d programs attached at tcx egress (to the pod), want 1", i, len(progs))
		}
		if !run(t, progs[0], i, allowed) || run(t, progs[0], i, denied) {
			t.Errorf("interface %d: the re-attached program does not enforce the committed policy (allowed %v, denied %v)",
				i, run(t, progs[0], i, allowed), run(t, progs[0], i, denied))
		}
	}
	// The re-attached links are this process's: an unchanged re-commit is skipped,
	// and Remove detaches them.
	for _, i := range pods {
		if res, err := e.Commit(i, pol); err != nil || !res.Skipped {
			t.Fatalf("pod %d: re-commit: %+v %v, want skipped", i, res, err)
		}
		if _, err := e.Remove(i); err != nil {
			t.Fatal(err)
		}
		if n := len(attachedPrograms(t, i, ebpf.AttachTCXEgress)); n != 0 {
			t.Errorf("interface %d: %d programs attached after Remove, want 0", i, n)
		}
	}
}

// TestRestartDropsVanishedInterfaces: a pod whose interface was deleted while no
// agent ran (its links defunct) is not re-attached: its state is deleted and
// Adoption names it, while a pod whose interface is there is adopted as it was.
func TestRestartDropsVanishedInterfaces(t *testing.T) {
	requireKernel(t)
	pin := testPinPath(t)
	kept, gone := dummyInterface(t), dummyInterface(t)
	pol, _ := restartPolicies()
	prev, err := OpenEBPF(EBPFOptions{PinPath: pin})
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{kept, gone} {
		if _, err := prev.Commit(i, pol); err != nil {
			t.Fatal(err)
		}
	}
	if err := prev.Close(); err != nil {
		t.Fatal(err)
	}
	l, err := netlink.LinkByIndex(gone)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkDel(l); err != nil {
		t.Fatal(err)
	}
	e := openTestEBPF(t, EBPFOptions{PinPath: pin})
	if got := e.Pods(); !slices.Equal(got, []int{kept}) {
		t.Fatalf("adopted pods %v, want [%d]", got, kept)
	}
	if a := e.Adoption(); !slices.Equal(a.Vanished, []int{gone}) || len(a.Reattached) != 0 || a.Pods != 1 {
		t.Fatalf("Adoption %+v, want Pods 1, Vanished [%d], nothing re-attached", a, gone)
	}
	if _, err := os.Stat(filepath.Join(pin, "links", fmt.Sprintf("%d-to_pod", gone))); !os.IsNotExist(err) {
		t.Errorf("the vanished interface's link is still pinned: %v", err)
	}
}

// TestFailedAdoptClosesLinks: an OpenEBPF whose adoption fails after it loaded
// some pinned links (here a link pin replaced by a map's) closes every handle it
// opened, and leaves the pins as they were.
func TestFailedAdoptClosesLinks(t *testing.T) {
	requireKernel(t)
	pin := testPinPath(t)
	pod := dummyInterface(t)
	pol, _ := restartPolicies()
	prev, err := OpenEBPF(EBPFOptions{PinPath: pin})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := prev.Commit(pod, pol); err != nil {
		t.Fatal(err)
	}
	toPod := filepath.Join(pin, "links", fmt.Sprintf("%d-to_pod", pod))
	if err := prev.links[uint32(pod)].toPod.Unpin(); err != nil {
		t.Fatal(err)
	}
	if err := prev.objs.NpaCtTables.Pin(toPod); err != nil { // not a link
		t.Fatal(err)
	}
	if err := prev.Close(); err != nil {
		t.Fatal(err)
	}
	before := bpfFDs()
	if e, err := OpenEBPF(EBPFOptions{PinPath: pin}); err == nil {
		_ = e.Close()
		t.Fatal("OpenEBPF adopted a map pinned as a link")
	}
	if after := bpfFDs(); len(after) > len(before) {
		t.Fatalf("a failed adoption leaked bpf descriptors: %d before, %d after: %v", len(before), len(after), after)
	}
	if _, err := os.Stat(filepath.Join(pin, "links", fmt.Sprintf("%d-from_pod", pod))); err != nil {
		t.Errorf("the from_pod link pin is gone after the failed adoption: %v", err)
	}
}

// TestRealTrafficAfterReattach: with real packets between network namespaces, a
// pod's enforcement lapses when its links are removed while no agent runs, and a
// new OpenEBPF restores it before any commit: the port its policy does not allow
// is closed again, the allowed one stays open.
func TestRealTrafficAfterReattach(t *testing.T) {
	lab := newTrafficLab(t)
	netlab.ServeEcho(t, lab.pod, "tcp4", labPod4+":8080")
	netlab.ServeEcho(t, lab.pod, "tcp4", labPod4+":8081")

	// Attaching and listing interfaces happen in the caller's network namespace:
	// run from a thread in the node namespace.
	lab.enterNode(t)

	check := func(stage string, want map[string]bool) {
		t.Helper()
		for _, port := range []string{"8080", "8081"} {
			err := netlab.Exchange(lab.peer, "tcp4", labPod4+":"+port, trafficTimeout)
			if (err == nil) != want[port] {
				t.Errorf("%s: peer → pod tcp %s: exchange error %v, want allowed=%v", stage, port, err, want[port])
			}
		}
	}
	pin := testPinPath(t)
	prev := openTestEBPF(t, EBPFOptions{PinPath: pin})
	pol := PodPolicy{Ingress: DirectionPolicy{Isolated: true, Allow: []Rule{{CIDR: netip.MustParsePrefix("10.201.2.0/24"),
		Ports: []PortRule{{Protocol: ProtocolTCP, Port: 8080}}}}}}
	if _, err := prev.Commit(lab.hostIfindex, pol); err != nil {
		t.Fatal(err)
	}
	check("committed", map[string]bool{"8080": true, "8081": false})
	if err := prev.Close(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"from_pod", "to_pod"} {
		l, err := link.LoadPinnedLink(filepath.Join(pin, "links", fmt.Sprintf("%d-%s", lab.hostIfindex, name)), nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Unpin(); err != nil {
			t.Fatal(err)
		}
		_ = l.Close()
	}
	check("links removed, no agent", map[string]bool{"8080": true, "8081": true})

	e := openTestEBPF(t, EBPFOptions{PinPath: pin})
	check("reopened", map[string]bool{"8080": true, "8081": false})
	if a := e.Adoption(); !slices.Equal(a.Reattached, []int{lab.hostIfindex}) {
		t.Errorf("Adoption %+v, want interface %d re-attached", a, lab.hostIfindex)
	}
}
