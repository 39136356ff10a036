package reconcile

import (
	"testing"
	"time"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/testenv"
)

// TestLocalPendingUntilProgrammed: after the caches synced, the initial list's object
// selecting a pod here counts as not programmed (so /readyz is not ready) while its
// commits fail, and stops counting once one succeeds; the object elsewhere never
// counts. Real apiserver.
func TestLocalPendingUntilProgrammed(t *testing.T) {
	cp := sharedCP(t)
	const node = "192.0.2.13"
	createNamespace(t, cp, "ready")
	create(t, cp, ingressPE("ready", "local", []v1alpha1.PodEndpoint{pod(node, "10.1.13.1")}, "10.2.0.0/16", 80))
	create(t, cp, ingressPE("ready", "elsewhere", []v1alpha1.PodEndpoint{pod("192.0.2.99", "10.1.99.1")}, "10.2.0.0/16", 80))
	dp := &failingDataplane{Dataplane: bpfmaps.NewMemory()}
	dp.failures.Store(1 << 20)
	a := startAgent(t, cp, agentOptions{nodeIP: node, dp: dp, resolver: newLookupTableResolver("10.1.13.1", 131)})
	// The cold start may commit (and fail) before readiness tracking begins (-1).
	testenv.Eventually(t, 20*time.Second, "two failed commits of the local object, readiness tracked", func() bool {
		return dp.calls.Load() >= 2 && a.c.LocalPending() != -1
	})
	if n := a.c.LocalPending(); n != 1 {
		t.Fatalf("LocalPending = %d while the local object's commits fail, want 1", n)
	}
	dp.failures.Store(0)
	testenv.Eventually(t, 20*time.Second, "the local object programmed", func() bool { return a.c.LocalPending() == 0 })
}

// TestLocalPendingIgnoresMissingInterfaces: an initial-list object naming a local pod
// whose interface is not on the node (a stale PolicyEndpoint, a pod long gone) does
// not hold /readyz once its other pods are programmed: nothing here is unprotected,
// and an agent kept unready by it would stall its DaemonSet's rollout.
func TestLocalPendingIgnoresMissingInterfaces(t *testing.T) {
	cp := sharedCP(t)
	const node = "192.0.2.14"
	createNamespace(t, cp, "ready-stale")
	create(t, cp, ingressPE("ready-stale", "stale", []v1alpha1.PodEndpoint{pod(node, "10.1.14.1"), pod(node, "10.1.14.2")}, "10.2.0.0/16", 80))
	mem := bpfmaps.NewMemory()
	a := startAgent(t, cp, agentOptions{nodeIP: node, dp: mem, resolver: newLookupTableResolver("10.1.14.1", 141)})
	testenv.Eventually(t, 20*time.Second, "the pod with an interface programmed, the object not pending", func() bool {
		return a.c.LocalPending() == 0 && len(mem.Pods()) == 1
	})
	if st := a.c.Stats(); st.InterfaceWaits == 0 {
		t.Errorf("no interface wait counted: the missing pod was not waited for")
	}
}
