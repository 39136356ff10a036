package reconcile

import (
	"bytes"
	"log/slog"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/explain"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/translate"
	"k8s.io/apimachinery/pkg/types"
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

// TestComputeEndsBeforeTheLockWait: the object's compile is "compute"; the wait for
// the pod table's lock (held here by another commit) is the attempt's own lock wait,
// and the merge under the lock is measured as a phase of the attempt.
func TestComputeEndsBeforeTheLockWait(t *testing.T) {
	sink := newRecordingSink()
	c := offlineController(t, bpfmaps.NewMemory(), newLookupTableResolver("10.60.0.1", 7), sink)
	store, h := c.informers[report.KindPolicyEndpoint].GetIndexer(), c.handler(report.KindPolicyEndpoint)
	pe, _ := newVersion(benchPE(0, 1), nil)
	if err := store.Add(pe); err != nil {
		t.Fatal(err)
	}
	h.OnAdd(pe, false)

	const hold = 50 * time.Millisecond
	c.pods.mu.Lock() // another worker's commit holds the node-wide lock
	released := make(chan struct{})
	go func() {
		time.Sleep(hold)
		c.pods.mu.Unlock()
		close(released)
	}()
	if c.sync(keyOf(report.KindPolicyEndpoint, pe), time.Now()) != outcomeDone {
		t.Fatal("sync failed")
	}
	<-released
	recs := sink.recordsFor(string(pe.UID))
	if len(recs) != 1 || len(recs[0].Attempts) != 1 {
		t.Fatalf("records %+v, want one with one attempt", recs)
	}
	r, a := recs[0], recs[0].Attempts[0]
	if r.ComputeEnd.After(a.Requested) {
		t.Errorf("compute ends at %v, after the lock was requested at %v: it must not include the wait", r.ComputeEnd, a.Requested)
	}
	if w := a.LockWait(); w < hold*8/10 {
		t.Errorf("lock wait %v, want about %v (the lock was held that long)", w, hold)
	}
	if a.Duration() >= hold/2 {
		t.Errorf("commit took %v under the lock: the wait leaked into it", a.Duration())
	}
	if a.Phases.Merge <= 0 || a.Phases.Merge > a.Duration() {
		t.Errorf("merge phase %v, want > 0 and within the attempt's %v", a.Phases.Merge, a.Duration())
	}
}

// TestDeleteForgetsOnlyInTheWorker: the delete handler records the uid and leaves the
// seen-set alone; the worker's sync of the key forgets it, so a commit of the object
// in flight can never recreate an entry after its Forget.
func TestDeleteForgetsOnlyInTheWorker(t *testing.T) {
	c := offlineController(t, bpfmaps.NewMemory(), newLookupTableResolver("10.60.0.1", 7), newRecordingSink())
	store, h := c.informers[report.KindPolicyEndpoint].GetIndexer(), c.handler(report.KindPolicyEndpoint)
	v1, _ := newVersion(benchPE(0, 1), nil)
	if err := store.Add(v1); err != nil {
		t.Fatal(err)
	}
	h.OnAdd(v1, false)
	key := keyOf(report.KindPolicyEndpoint, v1)
	// The worker read v1 and is about to commit; a newer version's event is pending.
	v2, _ := newVersion(v1, nil)
	if err := store.Update(v2); err != nil {
		t.Fatal(err)
	}
	h.OnUpdate(v1, v2)
	if err := store.Delete(v2); err != nil {
		t.Fatal(err)
	}
	h.OnDelete(v2)
	if _, ok := c.cfg.Seen.Pending(string(v1.UID)); !ok {
		t.Fatal("the delete handler forgot the uid: only the worker may")
	}
	if c.sync(key, time.Now()) != outcomeDone {
		t.Fatal("sync after delete failed")
	}
	if _, ok := c.cfg.Seen.Pending(string(v1.UID)); ok || c.cfg.Seen.Stats().Objects != 0 {
		t.Errorf("after the worker's sync the deleted uid must be forgotten: %+v", c.cfg.Seen.Stats())
	}
}

// TestTriggerParsedOncePerVersion: the handler records each version's parsed trigger;
// re-deliveries and the worker check it out instead of parsing the annotation again.
func TestTriggerParsedOncePerVersion(t *testing.T) {
	c := offlineController(t, bpfmaps.NewMemory(), newLookupTableResolver(), nil)
	pe, trigger := newVersion(benchPE(0, 1), nil)
	if v, fresh := c.versions.record(pe); !v.trigger.Equal(trigger) || !fresh {
		t.Fatalf("recorded trigger %v (fresh %v), want %v, fresh", v.trigger, fresh, trigger)
	}
	// Same version, annotation changed behind the table's back: a parse would see it.
	pe.Annotations[v1alpha1.AnnotationLastChangeTriggerTime] = "not a time"
	if v, fresh := c.versions.record(pe); !v.trigger.Equal(trigger) || v.triggerErr != nil || fresh {
		t.Errorf("re-delivery parsed again: %+v (fresh %v)", v, fresh)
	}
	if v := c.versions.checkout(pe); !v.trigger.Equal(trigger) {
		t.Errorf("worker parsed again: %+v", v)
	}
	if a := testing.AllocsPerRun(100, func() { c.versions.record(pe) }); a != 0 {
		t.Errorf("re-delivered version: %v allocs, want 0", a)
	}
	next, nextTrigger := newVersion(pe, nil)
	if v := c.versions.checkout(next); !v.trigger.Equal(nextTrigger) {
		t.Errorf("a version no event brought yet is parsed by the worker: got %+v", v)
	}
}

// TestCompileOptionsReachTheWorker: Config.Compile decides what a domainName rule
// does: by default its object is rejected (its rules not programmed, counted by
// field; with no valid version, its pod isolated both ways as it names); with
// DropDomainAllowRules the object is programmed without it.
func TestCompileOptionsReachTheWorker(t *testing.T) {
	for _, drop := range []bool{false, true} {
		mem := bpfmaps.NewMemory()
		c := offlineController(t, mem, newLookupTableResolver("10.60.0.1", 7), nil)
		c.cfg.Compile = translate.Options{DropDomainAllowRules: drop}
		store, h := c.informers[report.KindPolicyEndpoint].GetIndexer(), c.handler(report.KindPolicyEndpoint)
		pe, _ := newVersion(benchPE(0, 1), func(pe *v1alpha1.PolicyEndpoint) {
			pe.Spec.Egress = append(pe.Spec.Egress, v1alpha1.EndpointInfo{DomainName: "example.com"})
		})
		if err := store.Add(pe); err != nil {
			t.Fatal(err)
		}
		h.OnAdd(pe, false)
		got := c.sync(keyOf(report.KindPolicyEndpoint, pe), time.Now())
		invalid := invalidCount(c, report.KindPolicyEndpoint, "spec.egress.domainName")
		switch {
		case !drop && (got != outcomeGiveUp || invalid != 1 || !slices.Equal(mem.Pods(), []int{7}) ||
			mem.Verdict(7, bpfmaps.Ingress, addr("10.70.0.1"), tcp, 8000) || mem.Verdict(7, bpfmaps.Egress, addr("10.70.0.1"), tcp, 8000)):
			t.Errorf("strict: sync = %v, invalid %d, pods %v; want give-up, 1, the pod isolated both ways", got, invalid, mem.Pods())
		case drop && (got != outcomeDone || invalid != 0 || len(mem.Pods()) != 1):
			t.Errorf("drop: sync = %v, invalid %d, pods %v; want done, 0, the pod", got, invalid, mem.Pods())
		}
	}
}

// TestChunksOfOnePolicyMerge: the controller splits a policy into several objects,
// some with rules and no pods. A pod one chunk lists gets the rules of every chunk of
// its policy; a trigger on a rules-only chunk is reported where the policy has local
// pods (its commit changed them); deleting that chunk takes its rules away; a chunk
// of another policy does not leak in.
func TestChunksOfOnePolicyMerge(t *testing.T) {
	sink := newRecordingSink()
	mem := bpfmaps.NewMemory()
	c := offlineController(t, mem, newLookupTableResolver("10.60.0.1", 7), sink)
	store, h := c.informers[report.KindPolicyEndpoint].GetIndexer(), c.handler(report.KindPolicyEndpoint)
	chunk := func(name, policy string, pods []v1alpha1.PodEndpoint, cidr string, port int32) *v1alpha1.PolicyEndpoint {
		pe := ingressPE("bench", name, pods, cidr, port)
		pe.UID = types.UID("uid-" + name)
		pe.ResourceVersion = "1"
		pe.Spec.PolicyRef.Name = policy
		pe.Annotations = map[string]string{v1alpha1.AnnotationLastChangeTriggerTime: time.Now().UTC().Format(time.RFC3339Nano)}
		return pe
	}
	add := func(pe *v1alpha1.PolicyEndpoint) {
		t.Helper()
		if err := store.Add(pe); err != nil {
			t.Fatal(err)
		}
		h.OnAdd(pe, false)
		if got := c.sync(keyOf(report.KindPolicyEndpoint, pe), time.Now()); got != outcomeDone {
			t.Fatalf("sync %s = %v", pe.Name, got)
		}
	}
	peer, other := netip.MustParseAddr("10.80.0.9"), netip.MustParseAddr("10.90.0.9")
	add(chunk("np-a-pods", "np-a", []v1alpha1.PodEndpoint{pod(benchNode, "10.60.0.1")}, "10.70.0.0/16", 8000))
	rules := chunk("np-a-rules", "np-a", nil, "10.80.0.0/16", 9000)
	add(rules)
	add(chunk("np-b-rules", "np-b", nil, "10.90.0.0/16", 9100))

	if !mem.Verdict(7, bpfmaps.Ingress, peer, bpfmaps.ProtocolTCP, 9000) {
		t.Error("the pod does not get the rules of its policy's rules-only chunk")
	}
	if mem.Verdict(7, bpfmaps.Ingress, other, bpfmaps.ProtocolTCP, 9100) {
		t.Error("a chunk of another policy leaked into the pod")
	}
	if recs := sink.recordsFor("uid-np-a-rules"); len(recs) != 1 || recs[0].Pods != 1 {
		t.Errorf("rules-only chunk's trigger: records %+v, want one, for the one local pod it changed", recs)
	}
	if recs := sink.recordsFor("uid-np-b-rules"); len(recs) != 0 {
		t.Errorf("np-b has no pod here: %d records, want none (no_local_pods)", len(recs))
	}

	if err := store.Delete(rules); err != nil {
		t.Fatal(err)
	}
	h.OnDelete(rules)
	if got := c.sync(keyOf(report.KindPolicyEndpoint, rules), time.Now()); got != outcomeDone {
		t.Fatalf("sync after delete = %v", got)
	}
	if mem.Verdict(7, bpfmaps.Ingress, peer, bpfmaps.ProtocolTCP, 9000) {
		t.Error("the deleted chunk's rules are still in force")
	}
	if !mem.Verdict(7, bpfmaps.Ingress, netip.MustParseAddr("10.70.0.9"), bpfmaps.ProtocolTCP, 8000) {
		t.Error("the remaining chunk's rules were lost")
	}
}

// TestInvalidAnnotationCountedOncePerVersion: a version whose trigger annotation
// does not parse is suppressed (invalid_annotation), counted and logged once, not
// again on every resync or relist of it; a new version with the same bad value is
// a new write and counts again.
func TestInvalidAnnotationCountedOncePerVersion(t *testing.T) {
	c := offlineController(t, bpfmaps.NewMemory(), newLookupTableResolver("10.60.0.1", 7), nil)
	store, h := c.informers[report.KindPolicyEndpoint].GetIndexer(), c.handler(report.KindPolicyEndpoint)
	bad := func(pe *v1alpha1.PolicyEndpoint) {
		pe.Annotations[v1alpha1.AnnotationLastChangeTriggerTime] = "yesterday"
	}
	v1, _ := newVersion(benchPE(0, 1), nil)
	bad(v1)
	if err := store.Add(v1); err != nil {
		t.Fatal(err)
	}
	h.OnAdd(v1, false)
	for range 3 {
		h.OnUpdate(v1, v1) // resyncs
	}
	field := "metadata.annotations[" + v1alpha1.AnnotationLastChangeTriggerTime + "]"
	if n := c.cfg.Seen.Stats().Suppressed[report.InvalidAnnotation]; n != 1 {
		t.Errorf("invalid_annotation %d after a write and 3 resyncs, want 1", n)
	}
	v2, _ := newVersion(v1, nil)
	bad(v2)
	if err := store.Update(v2); err != nil {
		t.Fatal(err)
	}
	h.OnUpdate(v1, v2)
	if n, inv := c.cfg.Seen.Stats().Suppressed[report.InvalidAnnotation], invalidCount(c, report.KindPolicyEndpoint, field); n != 2 || inv != 2 {
		t.Errorf("after a second bad write: invalid_annotation %d, invalid objects %d; want 2 and 2", n, inv)
	}
}

// TestMissingTriggerAnnotation: an object version without the trigger annotation
// (a controller that does not stamp it) is enforced as usual, and its missing
// measurement is visible: counted once per written version (not per resync),
// logged once per object naming it, and noted by explain.
func TestMissingTriggerAnnotation(t *testing.T) {
	c := offlineController(t, bpfmaps.NewMemory(), newLookupTableResolver("10.60.0.1", 7), nil)
	var logs bytes.Buffer
	c.log = slog.New(slog.NewTextHandler(&logs, nil))
	store, h := c.informers[report.KindPolicyEndpoint].GetIndexer(), c.handler(report.KindPolicyEndpoint)
	v1 := benchPE(0, 1)
	delete(v1.Annotations, v1alpha1.AnnotationLastChangeTriggerTime)
	if err := store.Add(v1); err != nil {
		t.Fatal(err)
	}
	h.OnAdd(v1, false)
	for range 3 {
		h.OnUpdate(v1, v1) // resyncs
	}
	if n := c.Stats().TriggerMissing[report.KindPolicyEndpoint]; n != 1 {
		t.Errorf("trigger missing %d after a write and 3 resyncs, want 1", n)
	}
	v2 := v1.DeepCopy() // a second write, again without the annotation
	v2.ResourceVersion = "2000"
	if err := store.Update(v2); err != nil {
		t.Fatal(err)
	}
	h.OnUpdate(v1, v2)
	var counts report.Counts
	c.Counts(&counts)
	if n := counts.TriggerMissing[report.KindPolicyEndpoint]; n != 2 {
		t.Errorf("Counts: trigger missing %d after two versions, want 2", n)
	}
	if n := strings.Count(logs.String(), "no trigger annotation"); n != 1 {
		t.Errorf("logged %d times, want once per object:\n%s", n, logs.String())
	}
	for _, want := range []string{"name=" + v1.Name, "namespace=" + v1.Namespace, v1alpha1.AnnotationLastChangeTriggerTime} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the log line does not name %q:\n%s", want, logs.String())
		}
	}
	if got := c.sync(keyOf(report.KindPolicyEndpoint, v2), time.Now()); got != outcomeDone {
		t.Fatalf("sync = %v: an object without the annotation is still enforced", got)
	}
	ex := c.ExplainObject(report.KindPolicyEndpoint, v1.Namespace, v1.Name)
	if len(ex.Notes) != 1 || !strings.Contains(ex.Notes[0], v1alpha1.AnnotationLastChangeTriggerTime) || !strings.Contains(ex.Notes[0], "not measured") {
		t.Errorf("explain notes %q, want one naming the missing annotation", ex.Notes)
	}
	if ex.State != explain.StateProgrammed {
		t.Errorf("explain state %s, want programmed", ex.State)
	}

	// An object with the annotation gets no note.
	v3, _ := newVersion(benchPE(1, 1), nil)
	if err := store.Add(v3); err != nil {
		t.Fatal(err)
	}
	h.OnAdd(v3, false)
	if ex := c.ExplainObject(report.KindPolicyEndpoint, v3.Namespace, v3.Name); len(ex.Notes) != 0 {
		t.Errorf("an object with the annotation has notes %q", ex.Notes)
	}
}
