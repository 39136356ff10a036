package reconcile

import (
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/explain"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/testenv"
	"github.com/npagent/npagent/internal/translate"
)

// wholeChunks is a memory dataplane that checks every commit of one interface: the
// policy must allow each of the given peers (one per chunk of the pod's policy). A
// commit that misses one was merged from part of the policy's chunks.
type wholeChunks struct {
	*bpfmaps.Memory
	ifindex int
	peers   []netip.AddrPort

	mu      sync.Mutex
	commits int
	partial []string
}

func (d *wholeChunks) Commit(ifindex int, p bpfmaps.PodPolicy) (bpfmaps.CommitResult, error) {
	res, err := d.Memory.Commit(ifindex, p)
	if err != nil || ifindex != d.ifindex {
		return res, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.commits++
	for _, peer := range d.peers {
		if !d.Verdict(ifindex, bpfmaps.Ingress, peer.Addr(), bpfmaps.ProtocolTCP, peer.Port()) {
			d.partial = append(d.partial, peer.String())
		}
	}
	return res, nil
}

func (d *wholeChunks) result() (commits int, partial []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.commits, slices.Clone(d.partial)
}

// cachedStub reports whether the PolicyEndpoint cache holds key as a stub.
func cachedStub(c *Controller, key translate.Key) bool {
	obj, ok, _ := c.informers[report.KindPolicyEndpoint].GetIndexer().GetByKey(key.StoreKey())
	return ok && isStub(obj)
}

// chunkOf is an ingress chunk of policy np in namespace ns.
func chunkOf(ns, name, np string, pods []v1alpha1.PodEndpoint, cidr string, port int32) *v1alpha1.PolicyEndpoint {
	pe := ingressPE(ns, name, pods, cidr, port)
	pe.Spec.PolicyRef.Name = np
	return pe
}

// TestStubFetchedWhenSiblingGainsPod: two chunks of a policy whose pods are all on
// another node are cached as stubs (their triggers consumed without a report); when
// one chunk gains a pod here, the other is fetched in full from the apiserver and the
// pod gets both chunks' rules — never one without the other — and the new trigger is
// reported once. Real apiserver.
func TestStubFetchedWhenSiblingGainsPod(t *testing.T) {
	cp := sharedCP(t)
	const node = "192.0.2.51"
	createNamespace(t, cp, "stubs")
	remote := []v1alpha1.PodEndpoint{pod("192.0.2.99", "10.51.9.1")}
	rules := chunkOf("stubs", "np-s-rules", "np-s", remote, "10.80.0.0/16", 9000)
	pods := chunkOf("stubs", "np-s-pods", "np-s", remote, "10.90.0.0/16", 9100)
	create(t, cp, rules)
	create(t, cp, pods)
	dp := &wholeChunks{Memory: bpfmaps.NewMemory(), ifindex: 51,
		peers: []netip.AddrPort{netip.MustParseAddrPort("10.80.0.9:9000"), netip.MustParseAddrPort("10.90.0.9:9100")}}
	a := startAgent(t, cp, agentOptions{nodeIP: node, dp: dp, resolver: newLookupTableResolver("10.51.0.1", 51)})
	rulesKey, podsKey := keyOf(report.KindPolicyEndpoint, rules), keyOf(report.KindPolicyEndpoint, pods)
	testenv.Eventually(t, 10*time.Second, "both chunks synced", func() bool { return a.c.queue.Len() == 0 && a.c.Stats().Syncs >= 2 })
	if !cachedStub(a.c, rulesKey) || !cachedStub(a.c, podsKey) {
		t.Fatalf("chunks with no pod here cached in full (rules stub: %v, pods stub: %v), want stubs", cachedStub(a.c, rulesKey), cachedStub(a.c, podsKey))
	}
	if got := a.sink.recordCount(); got != 0 {
		t.Fatalf("%d records before any pod here, want none", got)
	}

	trigger := update(t, cp, pods, func(pe *v1alpha1.PolicyEndpoint) {
		pe.Spec.PodSelectorEndpoints = append(pe.Spec.PodSelectorEndpoints, pod(node, "10.51.0.1"))
		pe.Spec.PodSelectorEndpoints[1].Namespace = "stubs"
	})
	testenv.Eventually(t, 10*time.Second, "the pod has both chunks' rules", func() bool {
		return dp.Verdict(51, bpfmaps.Ingress, netip.MustParseAddr("10.80.0.9"), bpfmaps.ProtocolTCP, 9000) &&
			dp.Verdict(51, bpfmaps.Ingress, netip.MustParseAddr("10.90.0.9"), bpfmaps.ProtocolTCP, 9100)
	})
	testenv.Eventually(t, 10*time.Second, "the trigger reported", func() bool { return len(a.sink.recordsFor(string(podsUID(t, a.c, podsKey)))) > 0 })
	time.Sleep(300 * time.Millisecond) // a second report would come now
	if recs := a.sink.recordsFor(string(podsUID(t, a.c, podsKey))); len(recs) != 1 || !recs[0].Trigger.Equal(trigger) {
		t.Errorf("records of the chunk that gained the pod: %d (%v), want one, of trigger %v", len(recs), triggersOf(recs), trigger)
	}
	if n := a.sink.recordCount(); n != 1 {
		t.Errorf("%d records in all, want 1 (the rules chunk's trigger was consumed when it had no work here)", n)
	}
	if commits, partial := dp.result(); commits == 0 || len(partial) > 0 {
		t.Errorf("%d commits of the pod; peers missing from some: %v (a commit from part of the chunks)", commits, partial)
	}
	if n := a.c.stubs.fetches.Load(); n < 1 {
		t.Errorf("%d stubs fetched, want the rules chunk", n)
	}
	if cachedStub(a.c, podsKey) {
		t.Error("the chunk with a pod here is still a stub in the cache")
	}
}

func podsUID(t *testing.T, c *Controller, key translate.Key) string {
	t.Helper()
	cur, ok := c.current(key)
	if !ok {
		t.Fatalf("%s not cached", key)
	}
	return string(cur.uid)
}

// TestStubSiblingListedBeforeLocalChunk: at agent start the initial list brings a
// chunk with no pod here (stubbed) before its sibling with a pod here; the stub is
// fetched again, and the pod's policy is never committed without it. The stub of
// an unrelated policy stays one and explains as having no work here; readiness waits
// for the pod; the pod's explanation names both chunks. Real apiserver.
func TestStubSiblingListedBeforeLocalChunk(t *testing.T) {
	cp := sharedCP(t)
	const node = "192.0.2.52"
	createNamespace(t, cp, "stubs-list")
	remote := []v1alpha1.PodEndpoint{pod("192.0.2.99", "10.52.9.1")}
	// Listed in key order: "np-t-a" before "np-t-b".
	create(t, cp, chunkOf("stubs-list", "np-t-a", "np-t", remote, "10.80.0.0/16", 9000))
	create(t, cp, chunkOf("stubs-list", "np-t-b", "np-t", []v1alpha1.PodEndpoint{pod(node, "10.52.0.1")}, "10.90.0.0/16", 9100))
	other := chunkOf("stubs-list", "np-u", "np-u", remote, "10.70.0.0/16", 9200)
	create(t, cp, other)
	dp := &wholeChunks{Memory: bpfmaps.NewMemory(), ifindex: 52,
		peers: []netip.AddrPort{netip.MustParseAddrPort("10.80.0.9:9000"), netip.MustParseAddrPort("10.90.0.9:9100")}}
	a := startAgent(t, cp, agentOptions{nodeIP: node, dp: dp, resolver: newLookupTableResolver("10.52.0.1", 52)})
	testenv.Eventually(t, 10*time.Second, "ready: the pod programmed", func() bool { return a.c.LocalPending() == 0 })
	if !dp.Verdict(52, bpfmaps.Ingress, netip.MustParseAddr("10.80.0.9"), bpfmaps.ProtocolTCP, 9000) ||
		!dp.Verdict(52, bpfmaps.Ingress, netip.MustParseAddr("10.90.0.9"), bpfmaps.ProtocolTCP, 9100) {
		t.Error("the pod lacks a chunk's rules once ready")
	}
	if commits, partial := dp.result(); commits == 0 || len(partial) > 0 {
		t.Errorf("%d commits of the pod; peers missing from some: %v (a commit from part of the chunks)", commits, partial)
	}
	otherKey := keyOf(report.KindPolicyEndpoint, other)
	waitInitialSync(t, a) // np-u synced once (an empty queue may still have it in flight)
	if !cachedStub(a.c, otherKey) {
		t.Error("a chunk of a policy with no pod here is cached in full, want a stub")
	}
	if ex := a.c.ExplainObject(report.KindPolicyEndpoint, "stubs-list", "np-u"); ex.State != explain.StateNoLocalWork || !ex.Programmed || ex.UID == "" || ex.Trigger.IsZero() {
		t.Errorf("explain of a stub: state %q programmed %v uid %q trigger %v; want no local work, programmed, its uid and trigger", ex.State, ex.Programmed, ex.UID, ex.Trigger)
	}
	ex := a.c.ExplainPod(explain.PodQuery{IP: netip.MustParseAddr("10.52.0.1")})
	var names []string
	for _, o := range ex.Objects {
		names = append(names, o.Name)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"np-t-a", "np-t-b"}) {
		t.Errorf("explain of the pod names %v, want both chunks of its policy", names)
	}
}
