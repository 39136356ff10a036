package bpfmaps

import (
	"errors"
	"net/netip"
	"os"
	"strings"
	"testing"
)

// TestOpenRefusesPinnedMapsOfAnotherSize: pinned maps keep the capacity they were
// created with. Opening the same pin directory with other sizes fails with a
// *PinnedCapacityError (ErrPinnedCapacity) that names the directory, each map
// whose size differs, what sizes it and both sizes, and says how to resize; it
// changes nothing, so the pinned enforcement goes on and an open with the pinned
// sizes adopts it. After the documented resize (remove the directory) the new
// sizes take.
func TestOpenRefusesPinnedMapsOfAnotherSize(t *testing.T) {
	requireKernel(t)
	pin := testPinPath(t)
	pod := dummyInterface(t)
	pol, _ := restartPolicies()
	prev, err := OpenEBPF(EBPFOptions{PinPath: pin, Limits: Limits{EntriesV4: 2048}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := prev.Commit(pod, pol); err != nil {
		t.Fatal(err)
	}
	if err := prev.Close(); err != nil {
		t.Fatal(err)
	}

	e, err := OpenEBPF(EBPFOptions{PinPath: pin, Limits: Limits{EntriesV4: 1024}, ConntrackEntries: 2048})
	if err == nil {
		_ = e.Close()
		t.Fatal("OpenEBPF adopted pinned maps of 2048 IPv4 entries when asked for 1024")
	}
	var ce *PinnedCapacityError
	if !errors.Is(err, ErrPinnedCapacity) || !errors.As(err, &ce) {
		t.Fatalf("OpenEBPF with other sizes: %v; want a *PinnedCapacityError", err)
	}
	want := []CapacityMismatch{
		{Map: "npa_eg_v4", Setting: "Limits.EntriesV4", Pinned: 2048, Wanted: 1024},
		{Map: "npa_in_v4", Setting: "Limits.EntriesV4", Pinned: 2048, Wanted: 1024},
		{Map: "ct (per-pod connection tables)", Setting: "ConntrackEntries", Pinned: DefaultConntrackEntries, Wanted: 2048},
	}
	if ce.PinPath != pin || len(ce.Mismatches) != len(want) {
		t.Fatalf("mismatches under %s: %+v, want %+v under %s", ce.PinPath, ce.Mismatches, want, pin)
	}
	for i := range want {
		if ce.Mismatches[i] != want[i] {
			t.Errorf("mismatch %d: %+v, want %+v", i, ce.Mismatches[i], want[i])
		}
	}
	for _, s := range []string{pin, "npa_in_v4", "2048", "1024", "stop the agent, remove " + pin} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}

	// Nothing changed: the pinned sizes adopt the pod and enforce its policy.
	e = openTestEBPF(t, EBPFOptions{PinPath: pin, Limits: Limits{EntriesV4: 2048}})
	if got := e.Pods(); len(got) != 1 || got[0] != pod {
		t.Fatalf("adopted pods %v after the refusal, want [%d]", got, pod)
	}
	if e.kernelVerdict(t, pod, Ingress, packet{peer: netip.MustParseAddr("10.2.0.9"), proto: ProtocolTCP, port: 80}) {
		t.Error("a denied peer passes after the refusal")
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}

	// The documented resize: remove the pin directory, open with the new size.
	removePinDir(t, pin)
	e = openTestEBPF(t, EBPFOptions{PinPath: pin, Limits: Limits{EntriesV4: 1024}})
	if n := e.objs.NpaInV4.MaxEntries(); n != 1024 {
		t.Fatalf("after the resize the ingress IPv4 trie holds %d entries, want 1024", n)
	}
	if len(e.Pods()) != 0 {
		t.Fatalf("pods %v after the resize, want none until committed again", e.Pods())
	}
}

// removePinDir removes a pin directory as an operator would (rm -r): every pinned
// map and link under it is unpinned.
func removePinDir(t *testing.T, dir string) {
	t.Helper()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatalf("remove %s: %v", dir, err)
	}
}
