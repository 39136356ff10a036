package reconcile

import (
	"slices"
	"testing"
	"time"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/testenv"
)

// initialSyncDone reports whether the controller collected the dataplane's leftovers
// (every key of the initial list was synced once).
func initialSyncDone(c *Controller) bool {
	c.initial.mu.Lock()
	defer c.initial.mu.Unlock()
	return c.initial.begun && c.initial.pending == nil
}

// TestEBPFRestartKeepsEnforcementOfInvalidObject: a pod whose only policy object's
// current version is invalid keeps its pinned enforcement across an agent restart
// (issue 10: the post-sync leftover cleanup removed it and the pod was open). Real
// apiserver, real eBPF, real packets; the dataplane is closed and re-opened from its
// pins as a new process would.
func TestEBPFRestartKeepsEnforcementOfInvalidObject(t *testing.T) {
	l := newPodLab(t)
	l.serve(t, 8080)
	l.serve(t, 8081)
	for _, port := range []int{8080, 8081} {
		testenv.Eventually(t, 10*time.Second, "port reachable before any policy", func() bool { return l.reach(port) == nil })
	}
	dp := openKernelDataplane(t, "restart-invalid")
	cp := testenv.Start(t)
	const node = "192.0.2.21"
	createNamespace(t, cp, "keep")
	state := t.TempDir() + "/seen.state"
	first := startAgent(t, cp, agentOptions{nodeIP: node, dp: dp, state: state})
	pe := ingressPE("keep", "web", []v1alpha1.PodEndpoint{pod(node, l.podIP)}, l.hostIP+"/32", 8080)
	create(t, cp, pe)
	testenv.Eventually(t, 20*time.Second, "record for the create", func() bool { return len(first.sink.recordsFor(string(pe.UID))) == 1 })
	if err := l.reach(8081); err == nil {
		t.Fatalf("port 8081 reachable: the policy is not enforced")
	}

	// The object's current version becomes invalid: the valid one stays in force.
	update(t, cp, pe, func(pe *v1alpha1.PolicyEndpoint) { pe.Spec.Ingress[0].CIDR = "10.2.0.0/33" })
	testenv.Eventually(t, 20*time.Second, "invalid version counted", func() bool {
		return invalidCount(first.c, report.KindPolicyEndpoint, "spec.ingress.cidr") == 1
	})
	first.stop()
	if err := dp.Close(); err != nil {
		t.Fatal(err)
	}

	dp = openKernelDataplane(t, "restart-invalid")
	if got := dp.Pods(); !slices.Contains(got, l.hostIndex) {
		t.Fatalf("adopted pods = %v, want the veth %d", got, l.hostIndex)
	}
	second := startAgent(t, cp, agentOptions{nodeIP: node, dp: dp, state: state})
	testenv.Eventually(t, 20*time.Second, "initial sync done", func() bool { return initialSyncDone(second.c) })
	if n := invalidCount(second.c, report.KindPolicyEndpoint, "spec.ingress.cidr"); n != 1 {
		t.Errorf("the new process counted %d invalid versions, want 1", n)
	}
	if got := dp.Pods(); !slices.Contains(got, l.hostIndex) {
		t.Errorf("dataplane pods after the restart = %v: the pod's pinned enforcement was removed", got)
	}
	if s := second.c.Stats(); s.Removes != 0 {
		t.Errorf("%d pods removed after the restart, want 0", s.Removes)
	}
	if err := l.reach(8080); err != nil {
		t.Errorf("allowed port 8080 after the restart: %v", err)
	}
	if err := l.reach(8081); err == nil {
		t.Errorf("port 8081 reachable after the restart: the pod was left open")
	}

	// Deleting the object is what ends the pod's enforcement, in this process too.
	remove(t, cp, pe)
	testenv.Eventually(t, 20*time.Second, "pod state removed after the delete", func() bool { return !slices.Contains(dp.Pods(), l.hostIndex) })
	if err := l.reach(8081); err != nil {
		t.Errorf("after the delete the pod must be open again: %v", err)
	}
}
