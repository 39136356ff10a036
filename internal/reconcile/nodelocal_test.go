package reconcile

import (
	"net/netip"
	"slices"
	"strconv"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/translate"
)

// keptRules is how many rules the pod table keeps of key's version, and whether it
// keeps one at all.
func keptRules(c *Controller, key translate.Key) (int, bool) {
	c.pods.mu.Lock()
	defer c.pods.mu.Unlock()
	st := c.pods.objects[key]
	if st == nil || st.compiled == nil {
		return 0, false
	}
	return st.compiled.HeldRules(), true
}

// TestNodeLocalMemory: a version with no pod on this node is kept without its rules,
// and its trigger is consumed as no_local_pods; a later version that gains a local pod
// is compiled and enforced, and one that loses it is kept without rules again and the
// pod's policy removed. A rules-only chunk kept without rules still reaches the pod a
// sibling chunk gains later.
func TestNodeLocalMemory(t *testing.T) {
	sink := newRecordingSink()
	mem := bpfmaps.NewMemory()
	c := offlineController(t, mem, newLookupTableResolver("10.60.0.1", 7, "10.60.0.2", 8), sink)
	store, h := c.informers[report.KindPolicyEndpoint].GetIndexer(), c.handler(report.KindPolicyEndpoint)
	rv := 0
	write := func(pe *v1alpha1.PolicyEndpoint, first bool) {
		t.Helper()
		rv++
		pe.ResourceVersion = strconv.Itoa(rv)
		pe.Annotations = map[string]string{v1alpha1.AnnotationLastChangeTriggerTime: nextTrigger().UTC().Format(time.RFC3339Nano)}
		old, _, _ := store.Get(pe)
		if err := store.Update(pe); err != nil {
			t.Fatal(err)
		}
		if first {
			h.OnAdd(pe, false)
		} else {
			h.OnUpdate(old, pe)
		}
		if got := c.sync(keyOf(report.KindPolicyEndpoint, pe), time.Now()); got != outcomeDone {
			t.Fatalf("sync %s = %v", pe.Name, got)
		}
	}
	podOf := func(host, ip string) v1alpha1.PodEndpoint {
		p := pod(host, ip)
		p.Namespace = "bench"
		return p
	}
	remote := []v1alpha1.PodEndpoint{podOf("192.0.2.99", "10.61.0.1")}
	local := []v1alpha1.PodEndpoint{podOf(benchNode, "10.60.0.1"), remote[0]}
	peer := netip.MustParseAddr("10.70.0.9")

	pe := ingressPE("bench", "np-x", remote, "10.70.0.0/16", 8000)
	pe.UID = types.UID("uid-np-x")
	key := keyOf(report.KindPolicyEndpoint, pe)
	noLocal := noLocalWork(c)
	write(pe, true)
	if n, ok := keptRules(c, key); !ok || n != 0 {
		t.Errorf("no local pods: %d rules kept (version kept: %v), want the version and none of its rules", n, ok)
	}
	if n := noLocalWork(c) - noLocal; n != 1 || len(sink.recordsFor("uid-np-x")) != 0 {
		t.Errorf("no local pods: %d no_local_pods, %d records; want 1 and none", n, len(sink.recordsFor("uid-np-x")))
	}

	pe = pe.DeepCopy()
	pe.Spec.PodSelectorEndpoints = local
	write(pe, false)
	if n, _ := keptRules(c, key); n != 1 {
		t.Errorf("a local pod: %d rules kept, want 1", n)
	}
	if !mem.Verdict(7, bpfmaps.Ingress, peer, bpfmaps.ProtocolTCP, 8000) || mem.Verdict(7, bpfmaps.Ingress, peer, bpfmaps.ProtocolTCP, 8001) {
		t.Error("the version that gained a local pod is not enforced on it")
	}
	if recs := sink.recordsFor("uid-np-x"); len(recs) != 1 || recs[0].Pods != 1 {
		t.Errorf("gained a local pod: records %+v, want one for one pod", recs)
	}

	pe = pe.DeepCopy()
	pe.Spec.PodSelectorEndpoints = remote
	write(pe, false)
	if n, _ := keptRules(c, key); n != 0 {
		t.Errorf("lost its local pod: %d rules kept, want none", n)
	}
	if slices.Contains(mem.Pods(), 7) {
		t.Error("the pod the version no longer selects still has its policy")
	}
	if recs := sink.recordsFor("uid-np-x"); len(recs) != 2 || !recs[1].RemovedOnly {
		t.Errorf("lost its local pod: records %+v, want a second one, removed-only", recs)
	}

	// A rules-only chunk, then a sibling chunk that gains a pod here.
	chunk := func(name string, pods []v1alpha1.PodEndpoint, cidr string, port int32) *v1alpha1.PolicyEndpoint {
		pe := ingressPE("bench", name, pods, cidr, port)
		pe.UID = types.UID("uid-" + name)
		pe.Spec.PolicyRef.Name = "np-y"
		return pe
	}
	rules := chunk("np-y-rules", nil, "10.80.0.0/16", 9000)
	write(rules, true)
	if n, _ := keptRules(c, keyOf(report.KindPolicyEndpoint, rules)); n != 0 {
		t.Errorf("rules-only chunk, no sibling here: %d rules kept, want none", n)
	}
	pods := chunk("np-y-pods", remote, "10.90.0.0/16", 9100)
	write(pods, true)
	pods = pods.DeepCopy()
	pods.Spec.PodSelectorEndpoints = []v1alpha1.PodEndpoint{podOf(benchNode, "10.60.0.2")}
	write(pods, false)
	if !mem.Verdict(8, bpfmaps.Ingress, netip.MustParseAddr("10.80.0.9"), bpfmaps.ProtocolTCP, 9000) {
		t.Error("the pod a sibling chunk gained does not get the rules-only chunk's rules")
	}
	if !mem.Verdict(8, bpfmaps.Ingress, netip.MustParseAddr("10.90.0.9"), bpfmaps.ProtocolTCP, 9100) {
		t.Error("the pod does not get its own chunk's rules")
	}
}

// TestNodeLocalInvalidRejected: bad input in a version with no local pod is rejected
// as on any node (the choice: validate in full, keep nothing): counted by field, and
// the last valid version stays the key's.
func TestNodeLocalInvalidRejected(t *testing.T) {
	c := offlineController(t, bpfmaps.NewMemory(), newLookupTableResolver(), newRecordingSink())
	store, h := c.informers[report.KindPolicyEndpoint].GetIndexer(), c.handler(report.KindPolicyEndpoint)
	pe := ingressPE("bench", "np-bad", []v1alpha1.PodEndpoint{pod("192.0.2.99", "10.61.0.1")}, "10.70.0.0/16", 8000)
	pe.UID, pe.ResourceVersion = "uid-np-bad", "1"
	if err := store.Add(pe); err != nil {
		t.Fatal(err)
	}
	h.OnAdd(pe, false)
	key := keyOf(report.KindPolicyEndpoint, pe)
	if got := c.sync(key, time.Now()); got != outcomeDone {
		t.Fatalf("sync of the valid version = %v", got)
	}
	bad := pe.DeepCopy()
	bad.ResourceVersion = "2"
	bad.Spec.Ingress[0].CIDR = "10.70.0.0/99"
	if err := store.Update(bad); err != nil {
		t.Fatal(err)
	}
	h.OnUpdate(pe, bad)
	before := invalidCount(c, report.KindPolicyEndpoint, "spec.ingress.cidr")
	if got := c.sync(key, time.Now()); got != outcomeGiveUp {
		t.Errorf("sync of the invalid version = %v, want give up (rejected)", got)
	}
	if n := invalidCount(c, report.KindPolicyEndpoint, "spec.ingress.cidr") - before; n != 1 {
		t.Errorf("invalid version with no local pod counted %d times at spec.ingress.cidr, want 1", n)
	}
	c.pods.mu.Lock()
	kept := c.pods.objects[key].compiled
	c.pods.mu.Unlock()
	if kept == nil || kept.ResourceVersion != "1" {
		t.Errorf("kept version %+v, want the last valid one (resourceVersion 1)", kept)
	}
}
