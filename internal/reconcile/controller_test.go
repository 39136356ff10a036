package reconcile

import (
	"strconv"
	"testing"
	"time"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/report"
)

// These tests drive one Controller's handlers and sync directly, with its informer
// caches filled by hand (the informers never run), to pin down orderings a real
// apiserver produces only by chance.

// newVersion returns a copy of pe with the next resourceVersion and a new trigger.
func newVersion(pe *v1alpha1.PolicyEndpoint, change func(*v1alpha1.PolicyEndpoint)) (*v1alpha1.PolicyEndpoint, time.Time) {
	next := pe.DeepCopy()
	rv, _ := strconv.Atoi(pe.ResourceVersion)
	next.ResourceVersion = strconv.Itoa(rv + 1)
	if change != nil {
		change(next)
	}
	return next, stamp(next)
}

// TestListerAheadOfHandler: client-go updates the cache before it runs the handlers,
// so a worker can commit a version whose event has not been observed. The trigger is
// still reported once, when its event arrives, and its latency ends at the commit that
// first held it, not at the later no-op sync.
func TestListerAheadOfHandler(t *testing.T) {
	sink := newRecordingSink()
	mem := bpfmaps.NewMemory()
	c := offlineController(t, mem, newLookupTableResolver("10.60.0.1", 7), sink)
	store, h := c.informers[report.KindPolicyEndpoint].GetIndexer(), c.handler(report.KindPolicyEndpoint)

	v1, t1 := newVersion(benchPE(0, 1), nil)
	if err := store.Add(v1); err != nil {
		t.Fatal(err)
	}
	h.OnAdd(v1, false)
	key := keyOf(report.KindPolicyEndpoint, v1)
	if c.sync(key, time.Now()) != outcomeDone || len(sink.recordsFor(string(v1.UID))) != 1 {
		t.Fatalf("v1 not reported once")
	}

	v2, t2 := newVersion(v1, func(pe *v1alpha1.PolicyEndpoint) { pe.Spec.Ingress[0].Ports[0].Port = ptr[int32](9999) })
	if err := store.Update(v2); err != nil {
		t.Fatal(err)
	}
	if c.sync(key, time.Now()) != outcomeDone { // the worker reads v2 before its event ran
		t.Fatal("sync of v2 failed")
	}
	heldAt := time.Now()
	if n := len(sink.recordsFor(string(v1.UID))); n != 1 {
		t.Fatalf("%d records before v2's event was observed, want 1", n)
	}
	time.Sleep(20 * time.Millisecond)
	h.OnUpdate(v1, v2) // the event arrives
	if c.sync(key, time.Now()) != outcomeDone {
		t.Fatal("second sync of v2 failed")
	}
	recs := sink.recordsFor(string(v1.UID))
	if len(recs) != 2 || !recs[0].Trigger.Equal(t1) || !recs[1].Trigger.Equal(t2) {
		t.Fatalf("records %v, want triggers %v then %v", triggersOf(recs), t1, t2)
	}
	r := recs[1]
	if r.Committed().After(heldAt) || !r.Received.After(r.Committed()) {
		t.Errorf("v2's latency must end at the commit that first held it (%v), before its event was received (%v); got commit %v",
			heldAt, r.Received, r.Committed())
	}
	if !r.WorkerStart.IsZero() || len(r.Attempts) != 1 || r.Attempts[0].Err != "" {
		t.Errorf("record %+v: the later sync's timings are not this trigger's", r)
	}
}

// TestInvalidVersionFailsStatic: an invalid version is not programmed, the last valid
// one stays in force, and no retry runs; the fix is committed and reports the invalid
// version's trigger with its own, as coalesced writes are.
func TestInvalidVersionFailsStatic(t *testing.T) {
	sink := newRecordingSink()
	mem := bpfmaps.NewMemory()
	c := offlineController(t, mem, newLookupTableResolver("10.60.0.1", 7), sink)
	store, h := c.informers[report.KindPolicyEndpoint].GetIndexer(), c.handler(report.KindPolicyEndpoint)
	peer := addr("10.70.0.1") // benchPE(0)'s first ingress rule: 10.70.0.0/24 port 8000

	v1, _ := newVersion(benchPE(0, 1), nil)
	_ = store.Add(v1)
	h.OnAdd(v1, false)
	key := keyOf(report.KindPolicyEndpoint, v1)
	c.sync(key, time.Now())
	if !mem.Verdict(7, bpfmaps.Ingress, peer, tcp, 8000) {
		t.Fatal("v1 not in force")
	}

	v2, t2 := newVersion(v1, func(pe *v1alpha1.PolicyEndpoint) { pe.Spec.Ingress[0].CIDR = "10.70.0.0/99" })
	_ = store.Update(v2)
	h.OnUpdate(v1, v2)
	if got := c.sync(key, time.Now()); got != outcomeGiveUp {
		t.Fatalf("sync of an invalid version = %v, want give-up (no retry)", got)
	}
	if !mem.Verdict(7, bpfmaps.Ingress, peer, tcp, 8000) {
		t.Error("the last valid version must stay in force")
	}
	if n := invalidCount(c, report.KindPolicyEndpoint, "spec.ingress.cidr"); n != 1 || len(sink.recordsFor(string(v1.UID))) != 1 {
		t.Errorf("invalid counted %d, records %d", n, len(sink.recordsFor(string(v1.UID))))
	}
	if newest, ok := c.cfg.Seen.Pending(string(v1.UID)); !ok || !newest.Equal(t2) {
		t.Errorf("the invalid version's trigger must stay pending")
	}
	// A resync of the invalid version neither logs nor counts it again.
	c.sync(key, time.Now())
	if invalidCount(c, report.KindPolicyEndpoint, "spec.ingress.cidr") != 1 {
		t.Errorf("the same invalid version was counted twice")
	}

	v3, t3 := newVersion(v2, func(pe *v1alpha1.PolicyEndpoint) {
		pe.Spec.Ingress[0].CIDR = "10.70.0.0/24"
		pe.Spec.Ingress[0].Ports[0].Port = ptr[int32](8001)
	})
	_ = store.Update(v3)
	h.OnUpdate(v2, v3)
	if c.sync(key, time.Now()) != outcomeDone {
		t.Fatal("sync of the fixed version failed")
	}
	if mem.Verdict(7, bpfmaps.Ingress, peer, tcp, 8000) || !mem.Verdict(7, bpfmaps.Ingress, peer, tcp, 8001) {
		t.Error("the fixed version is not in force")
	}
	recs := sink.recordsFor(string(v1.UID))
	if got := triggersOf(recs[1:]); !sameTimes(got, []time.Time{t2, t3}) {
		t.Errorf("reported %v after the fix, want %v and %v", got, t2, t3)
	}
}

// TestRecreatedUnderSameName: delete and recreate under one name is a new object (new
// uid); pods only the old one selected are removed, and the old uid is forgotten.
func TestRecreatedUnderSameName(t *testing.T) {
	sink := newRecordingSink()
	mem := bpfmaps.NewMemory()
	c := offlineController(t, mem, newLookupTableResolver("10.60.0.1", 7, "10.60.0.2", 8), sink)
	store, h := c.informers[report.KindPolicyEndpoint].GetIndexer(), c.handler(report.KindPolicyEndpoint)

	old, _ := newVersion(benchPE(0, 1), nil) // local pod 10.60.0.1
	_ = store.Add(old)
	h.OnAdd(old, false)
	key := keyOf(report.KindPolicyEndpoint, old)
	c.sync(key, time.Now())

	// The delete and the create land in the cache before the worker runs.
	_ = store.Delete(old)
	h.OnDelete(old)
	recreated, trigger := newVersion(benchPE(1, 2), nil) // local pod 10.60.0.2
	recreated.Name, recreated.UID = old.Name, "11111111-0000-4000-8000-000000000001"
	_ = store.Add(recreated)
	h.OnAdd(recreated, false)
	if c.sync(key, time.Now()) != outcomeDone {
		t.Fatal("sync failed")
	}
	if got := mem.Pods(); len(got) != 1 || got[0] != 8 {
		t.Errorf("dataplane pods = %v, want only the new object's pod", got)
	}
	if recs := sink.recordsFor(string(recreated.UID)); len(recs) != 1 || !recs[0].Trigger.Equal(trigger) {
		t.Errorf("recreated object: records %v", triggersOf(recs))
	}
	if _, ok := c.cfg.Seen.Pending(string(old.UID)); ok || c.cfg.Seen.Stats().Objects != 1 {
		t.Errorf("the old uid must be forgotten: seen-set %+v", c.cfg.Seen.Stats())
	}
}
