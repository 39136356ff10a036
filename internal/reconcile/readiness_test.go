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
	cp := testenv.Start(t)
	const node = "192.0.2.13"
	createNamespace(t, cp, "ready")
	create(t, cp, ingressPE("ready", "local", []v1alpha1.PodEndpoint{pod(node, "10.1.13.1")}, "10.2.0.0/16", 80))
	create(t, cp, ingressPE("ready", "elsewhere", []v1alpha1.PodEndpoint{pod("192.0.2.99", "10.1.99.1")}, "10.2.0.0/16", 80))
	dp := &failingDataplane{Dataplane: bpfmaps.NewMemory()}
	dp.failures.Store(1 << 20)
	a := startAgent(t, cp, agentOptions{nodeIP: node, dp: dp, resolver: newLookupTableResolver("10.1.13.1", 131)})
	testenv.Eventually(t, 20*time.Second, "two failed commits of the local object", func() bool { return dp.calls.Load() >= 2 })
	if n := a.c.LocalPending(); n != 1 {
		t.Fatalf("LocalPending = %d while the local object's commits fail, want 1", n)
	}
	dp.failures.Store(0)
	testenv.Eventually(t, 20*time.Second, "the local object programmed", func() bool { return a.c.LocalPending() == 0 })
}
