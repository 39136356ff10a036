package bpfmaps

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/npagent/npagent/internal/testenv/netlab"
)

// TestCleanupEndsEnforcement: after an agent exits, its pinned programs keep
// enforcing (by design, for restarts); Cleanup — refused while an agent holds the pin
// directory — detaches them and removes every pin, so traffic flows again with no
// npagent program attached, and a new agent starts with nothing to adopt. A path
// that is not npagent's is refused, not emptied.
func TestCleanupEndsEnforcement(t *testing.T) {
	lab := newTrafficLab(t)
	netlab.ServeEcho(t, lab.pod, "tcp4", labPod4+":8080")
	netlab.ServeEcho(t, lab.pod, "tcp6", "["+labPod6+"]:8080")
	lab.enterNode(t)
	reach := func() [2]bool {
		return [2]bool{
			netlab.Exchange(lab.peer, "tcp4", labPod4+":8080", trafficTimeout) == nil,
			netlab.Exchange(lab.peer, "tcp6", "["+labPod6+"]:8080", trafficTimeout) == nil,
		}
	}
	attached := func() int {
		n := 0
		for _, a := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
			res, err := link.QueryPrograms(link.QueryOptions{Target: lab.hostIfindex, Attach: a})
			if err != nil {
				t.Fatalf("query %v programs: %v", a, err)
			}
			n += len(res.Programs)
		}
		return n
	}

	pin := testPinPath(t)
	e, err := OpenEBPF(EBPFOptions{PinPath: pin})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Commit(lab.hostIfindex, PodPolicy{Ingress: DirectionPolicy{Isolated: true}}); err != nil {
		t.Fatal(err)
	}
	if got := reach(); got != [2]bool{} {
		t.Fatalf("with a deny-all ingress policy the peer reaches the pod: %v", got)
	}
	if _, err := Cleanup(pin); !errors.Is(err, ErrPinDirLocked) {
		t.Fatalf("cleanup while an agent holds the pins: %v, want ErrPinDirLocked", err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if got := reach(); got != [2]bool{} || attached() != 2 {
		t.Fatalf("after the agent closed: reach %v, %d programs attached; want the pinned policy still enforced", got, attached())
	}

	c, err := Cleanup(pin)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.Detached, []int{lab.hostIfindex}) || c.Pins < 3 {
		t.Fatalf("cleanup: %+v, want interface %d detached and its pins removed", c, lab.hostIfindex)
	}
	if n := attached(); n != 0 {
		t.Fatalf("%d programs still attached after cleanup", n)
	}
	if got := reach(); got != [2]bool{true, true} {
		t.Fatalf("after cleanup the peer reaches the pod: %v, want both families", got)
	}
	if _, err := os.Stat(pin); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("pin directory after cleanup: %v, want it gone", err)
	}
	if c, err := Cleanup(pin); err != nil || len(c.Detached)+c.Pins != 0 {
		t.Fatalf("second cleanup: %+v %v, want nothing to do", c, err)
	}
	fresh := openTestEBPF(t, EBPFOptions{PinPath: pin})
	if a := fresh.Adoption(); a.Pods != 0 {
		t.Fatalf("a new agent after cleanup adopted %+v, want nothing", a)
	}

	// Not npagent's: refused, left as it is.
	other := testPinPath(t)
	if err := os.MkdirAll(filepath.Join(other, "links"), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := Cleanup(other); err == nil || !strings.Contains(err.Error(), "no npagent state") {
		t.Fatalf("cleanup of a directory without npagent's pins: %v, want a refusal", err)
	}
	if _, err := os.Stat(filepath.Join(other, "links")); err != nil {
		t.Fatalf("a refused cleanup removed something: %v", err)
	}
	if _, err := Cleanup(t.TempDir()); err == nil || !strings.Contains(err.Error(), "not on a bpf filesystem") {
		t.Fatalf("cleanup of a directory off bpffs: %v, want a refusal", err)
	}
}
