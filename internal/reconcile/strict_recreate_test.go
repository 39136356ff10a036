package reconcile

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/testenv"
)

// TestStrictModeDeniesPodNamedOnlyByInvalidObject: a pod that only an invalid object
// names (no valid version of it was ever known) has no state to keep, so strict mode
// denies it like a pod no object selects. Before, the invalid object "held" the pod
// and it stayed open.
func TestStrictModeDeniesPodNamedOnlyByInvalidObject(t *testing.T) {
	cp := sharedCP(t)
	const node = "192.0.2.51"
	createNamespace(t, cp, "rh")
	dp := bpfmaps.NewMemory()
	startAgent(t, cp, agentOptions{nodeIP: node, dp: dp, resolver: newLookupTableResolver("10.7.0.1", 31), mode: EnforcingStrict})
	create(t, cp, ingressPE("rh", "bad", []v1alpha1.PodEndpoint{pod(node, "10.7.0.1")}, "10.2.0.0/33", 80))
	createPod(t, cp, "rh", "p", "node-"+node, "10.7.0.1")
	peer := netip.MustParseAddr("10.99.0.1")
	testenv.Eventually(t, 15*time.Second, "the pod denied by strict mode", func() bool {
		return slices.Contains(dp.Pods(), 31) && !dp.Verdict(31, bpfmaps.Egress, peer, bpfmaps.ProtocolTCP, 80) &&
			!dp.Verdict(31, bpfmaps.Ingress, peer, bpfmaps.ProtocolTCP, 80)
	})
}

// TestStrictModeRecreatedPodSameIPGetsPolicy: a pod recreated with the same IP on a
// new interface while a PolicyEndpoint still selects that IP (a StatefulSet pod
// coming back) gets the object's policy on its new interface, and the old
// interface's state goes, though no object changes. Before, strict mode left every
// selected address to its objects' syncs, which never came: the new interface was
// open.
func TestStrictModeRecreatedPodSameIPGetsPolicy(t *testing.T) {
	cp := sharedCP(t)
	const node = "192.0.2.52"
	createNamespace(t, cp, "ru")
	dp := bpfmaps.NewMemory()
	res := newLookupTableResolver("10.6.0.1", 41)
	a := startAgent(t, cp, agentOptions{nodeIP: node, dp: dp, resolver: res, mode: EnforcingStrict})
	pe := ingressPE("ru", "web", []v1alpha1.PodEndpoint{pod(node, "10.6.0.1")}, "10.99.0.1/32", 80)
	create(t, cp, pe)
	p := createPod(t, cp, "ru", "web-0", "node-"+node, "10.6.0.1")
	testenv.Eventually(t, 10*time.Second, "the object's trigger reported", func() bool { return len(a.sink.recordsFor(string(pe.UID))) == 1 })
	if err := cp.Client.Delete(context.Background(), p, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	res.set("10.6.0.1", 42)
	createPod(t, cp, "ru", "web-0", "node-"+node, "10.6.0.1")
	allowed, other := netip.MustParseAddr("10.99.0.1"), netip.MustParseAddr("10.98.0.1")
	testenv.Eventually(t, 15*time.Second, "the policy on the new interface, none on the old", func() bool {
		pods := dp.Pods()
		return slices.Contains(pods, 42) && !slices.Contains(pods, 41) &&
			dp.Verdict(42, bpfmaps.Ingress, allowed, bpfmaps.ProtocolTCP, 80) &&
			!dp.Verdict(42, bpfmaps.Ingress, other, bpfmaps.ProtocolTCP, 80)
	})
	if n := len(a.sink.recordsFor(string(pe.UID))); n != 1 {
		t.Errorf("%d reports of the object's one trigger, want 1", n)
	}
}
