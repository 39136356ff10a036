package reconcile

import (
	"testing"
	"time"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/report"
)

func noLocalWork(c *Controller) uint64 { return c.cfg.Seen.Stats().Suppressed[report.NoLocalPods] }

// withTraceParent sets a version's traceparent annotation (the configured key).
func withTraceParent(tp string) func(*v1alpha1.PolicyEndpoint) {
	return func(pe *v1alpha1.PolicyEndpoint) { pe.Annotations[v1alpha1.AnnotationTraceParent] = tp }
}

// onlyRemotePods leaves the object selecting pods of other nodes only.
func onlyRemotePods(pe *v1alpha1.PolicyEndpoint) {
	remote := pod("192.0.2.99", "10.61.9.9")
	remote.Namespace = pe.Namespace // a PolicyEndpoint selects pods of its own namespace
	pe.Spec.PodSelectorEndpoints = []v1alpha1.PodEndpoint{remote}
}

const (
	tp1 = "00-11111111111111111111111111111111-1111111111111111-01"
	tp2 = "00-22222222222222222222222222222222-2222222222222222-01"
)

// TestRecreatedObjectIsNotReportedForItsPredecessorsPods: an object deleted and
// recreated under its name, the new one selecting no pod here. The commit removes the
// old uid's pod — a change the delete caused, which carries no trigger — so the new
// uid's trigger is not this node's to report: counted as no_local_pods, and resolved.
// (Before, the new uid's trigger was reported here with the removal's latency.)
func TestRecreatedObjectIsNotReportedForItsPredecessorsPods(t *testing.T) {
	sink := newRecordingSink()
	mem := bpfmaps.NewMemory()
	c := offlineController(t, mem, newLookupTableResolver("10.60.0.1", 7), sink)
	store, h := c.informers[report.KindPolicyEndpoint].GetIndexer(), c.handler(report.KindPolicyEndpoint)

	old, _ := newVersion(benchPE(0, 1), nil) // local pod 10.60.0.1
	_ = store.Add(old)
	h.OnAdd(old, false)
	key := keyOf(report.KindPolicyEndpoint, old)
	c.sync(key, time.Now())

	_ = store.Delete(old)
	h.OnDelete(old)
	recreated, _ := newVersion(benchPE(0, 1), onlyRemotePods)
	recreated.UID = "11111111-0000-4000-8000-000000000002"
	_ = store.Add(recreated)
	h.OnAdd(recreated, false)
	if c.sync(key, time.Now()) != outcomeDone {
		t.Fatal("sync failed")
	}
	if got := mem.Pods(); len(got) != 0 {
		t.Errorf("dataplane pods = %v, want the old object's pod removed", got)
	}
	if recs := sink.recordsFor(string(recreated.UID)); len(recs) != 0 {
		t.Errorf("the recreated object, with no pod here, was reported: %v", triggersOf(recs))
	}
	if n := noLocalWork(c); n != 1 {
		t.Errorf("no_local_pods = %d, want 1", n)
	}
	if _, pending := c.cfg.Seen.Pending(string(recreated.UID)); pending {
		t.Error("the recreated object's trigger is still pending")
	}
}

// TestCoalescedTriggersKeepTheirOwnVersions: two versions reach one commit (written
// while the key waited). Each trigger is reported with its own resourceVersion and
// traceparent, and only on a node where its own version changed something: here v1
// changes the rules of the local pod and v2 removes the pod (marked as a removal), so
// both are reported, each naming the other's writer (Served) for the commit's links;
// on a node where v1 had no pod and v2 has one, only v2's is.
func TestCoalescedTriggersKeepTheirOwnVersions(t *testing.T) {
	t.Run("change, then remove the local pod", func(t *testing.T) {
		sink := newRecordingSink()
		c := offlineController(t, bpfmaps.NewMemory(), newLookupTableResolver("10.60.0.1", 7), sink)
		store, h := c.informers[report.KindPolicyEndpoint].GetIndexer(), c.handler(report.KindPolicyEndpoint)
		v0, _ := newVersion(benchPE(0, 1), nil) // the local pod, programmed
		_ = store.Add(v0)
		h.OnAdd(v0, false)
		key := keyOf(report.KindPolicyEndpoint, v0)
		c.sync(key, time.Now())
		before := len(sink.recordsFor(string(v0.UID)))

		v1, t1 := newVersion(v0, func(pe *v1alpha1.PolicyEndpoint) {
			pe.Spec.Ingress[0].CIDR = "10.70.1.0/24"
			withTraceParent(tp1)(pe)
		})
		_ = store.Update(v1)
		h.OnUpdate(v0, v1)
		v2, t2 := newVersion(v1, func(pe *v1alpha1.PolicyEndpoint) { onlyRemotePods(pe); withTraceParent(tp2)(pe) })
		_ = store.Update(v2)
		h.OnUpdate(v1, v2)
		if c.sync(key, time.Now()) != outcomeDone {
			t.Fatal("sync failed")
		}
		recs := sink.recordsFor(string(v0.UID))[before:]
		if len(recs) != 2 {
			t.Fatalf("records %v, want t1 %v and t2 %v", triggersOf(recs), t1, t2)
		}
		want := map[time.Time]struct {
			rv, tp, served string
			removedOnly    bool
		}{t1: {v1.ResourceVersion, tp1, tp2, false}, t2: {v2.ResourceVersion, tp2, tp1, true}}
		for _, r := range recs {
			w, ok := want[r.Trigger]
			if !ok {
				t.Fatalf("record of trigger %v, not t1 or t2", r.Trigger)
			}
			if r.ResourceVersion != w.rv || r.TraceParent != w.tp || r.RemovedOnly != w.removedOnly {
				t.Errorf("trigger %v: resourceVersion %s traceparent %s removedOnly %v; want %s %s %v",
					r.Trigger, r.ResourceVersion, r.TraceParent, r.RemovedOnly, w.rv, w.tp, w.removedOnly)
			}
			// The commit served both: each trigger's record names the other's writer.
			if len(r.Served) != 1 || r.Served[0] != w.served {
				t.Errorf("trigger %v: served %v, want [%s]", r.Trigger, r.Served, w.served)
			}
		}
		// explain agrees: v1 was never synced (coalesced into v2's sync) and had
		// local work, which is why its trigger was reported.
		for _, ve := range c.ExplainObject(report.KindPolicyEndpoint, v0.Namespace, v0.Name).Versions {
			if ve.ResourceVersion == v1.ResourceVersion && !ve.HasLocalWork() {
				t.Errorf("explain: v1 (coalesced, reported) shows no local work: %+v", ve)
			}
		}
	})
	t.Run("only the later version is local", func(t *testing.T) {
		sink := newRecordingSink()
		c := offlineController(t, bpfmaps.NewMemory(), newLookupTableResolver("10.60.0.1", 7), sink)
		store, h := c.informers[report.KindPolicyEndpoint].GetIndexer(), c.handler(report.KindPolicyEndpoint)
		v0, _ := newVersion(benchPE(0, 1), onlyRemotePods)
		_ = store.Add(v0)
		h.OnAdd(v0, false)
		key := keyOf(report.KindPolicyEndpoint, v0)
		c.sync(key, time.Now())
		noLocal := noLocalWork(c)

		v1, _ := newVersion(v0, withTraceParent(tp1)) // still no pod here
		_ = store.Update(v1)
		h.OnUpdate(v0, v1)
		v2, t2 := newVersion(v1, func(pe *v1alpha1.PolicyEndpoint) {
			pe.Spec.PodSelectorEndpoints = benchPE(0, 1).Spec.PodSelectorEndpoints
			withTraceParent(tp2)(pe)
		})
		_ = store.Update(v2)
		h.OnUpdate(v1, v2)
		if c.sync(key, time.Now()) != outcomeDone {
			t.Fatal("sync failed")
		}
		recs := sink.recordsFor(string(v0.UID))
		if len(recs) != 1 || !recs[0].Trigger.Equal(t2) || recs[0].ResourceVersion != v2.ResourceVersion || recs[0].TraceParent != tp2 {
			t.Fatalf("records %+v, want only t2 %v with v2's version and traceparent", recs, t2)
		}
		if n := noLocalWork(c) - noLocal; n != 1 {
			t.Errorf("no_local_pods grew by %d, want 1 (v1's trigger)", n)
		}
		// explain shows the same judgement for the version that was never synced.
		ex := c.ExplainObject(report.KindPolicyEndpoint, v0.Namespace, v0.Name)
		for _, ve := range ex.Versions {
			if ve.ResourceVersion == v1.ResourceVersion && (ve.LocalWork == nil || ve.HasLocalWork()) {
				t.Errorf("explain: v1, with no pod here and never synced, shows local work %v", ve.LocalWork)
			}
			if ve.ResourceVersion == v2.ResourceVersion && !ve.HasLocalWork() {
				t.Error("explain: v2 shows no local work")
			}
		}
		if _, pending := c.cfg.Seen.Pending(string(v0.UID)); pending {
			t.Error("a trigger is still pending")
		}
	})
}
