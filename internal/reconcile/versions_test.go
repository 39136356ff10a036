package reconcile

import (
	"net/netip"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/report"
)

// The traceparent a version carries: the KEP-5915 key first, then the
// configured key (the AWS one by default, or another).
func TestVersionTraceParentPrecedence(t *testing.T) {
	const (
		kep    = "00-11111111111111111111111111111111-1111111111111111-01"
		aws    = "00-22222222222222222222222222222222-2222222222222222-01"
		custom = "00-33333333333333333333333333333333-3333333333333333-01"
	)
	for _, tc := range []struct {
		name string
		key  string // configured key
		ann  map[string]string
		want string
	}{
		{"kep only", v1alpha1.AnnotationTraceParent, map[string]string{TracingTraceParentAnnotation: kep}, kep},
		{"configured only", v1alpha1.AnnotationTraceParent, map[string]string{v1alpha1.AnnotationTraceParent: aws}, aws},
		{"both: kep wins", v1alpha1.AnnotationTraceParent,
			map[string]string{TracingTraceParentAnnotation: kep, v1alpha1.AnnotationTraceParent: aws}, kep},
		{"kep empty: configured", v1alpha1.AnnotationTraceParent,
			map[string]string{TracingTraceParentAnnotation: "", v1alpha1.AnnotationTraceParent: aws}, aws},
		{"kep invalid still wins", v1alpha1.AnnotationTraceParent,
			map[string]string{TracingTraceParentAnnotation: "garbage", v1alpha1.AnnotationTraceParent: aws}, "garbage"},
		{"custom key", "example.com/tp", map[string]string{"example.com/tp": custom, v1alpha1.AnnotationTraceParent: aws}, custom},
		{"custom key and kep", "example.com/tp", map[string]string{"example.com/tp": custom, TracingTraceParentAnnotation: kep}, kep},
		{"configured is the kep key", TracingTraceParentAnnotation, map[string]string{TracingTraceParentAnnotation: kep}, kep},
		{"none", v1alpha1.AnnotationTraceParent, map[string]string{"other": aws}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var vt versionTable
			vt.init(v1alpha1.AnnotationLastChangeTriggerTime, tc.key, netip.MustParseAddr("192.0.2.1"))
			m := &metav1.ObjectMeta{UID: "uid-1", ResourceVersion: "7", Annotations: tc.ann}
			v, fresh := vt.record(m)
			if !fresh || v.traceParent != tc.want {
				t.Errorf("traceParent %q (fresh %v), want %q", v.traceParent, fresh, tc.want)
			}
			if again, fresh := vt.record(m); fresh || again.traceParent != tc.want {
				t.Errorf("re-delivery: traceParent %q (fresh %v), want %q from the table", again.traceParent, fresh, tc.want)
			}
		})
	}
}

// TestRedeliveryCountedWithoutLookup: a re-delivered version whose trigger the
// seen-set already answered is counted redelivered from the version table, as the
// seen-set would count it, once per re-delivery (resync or relist), and accepts
// nothing; a version whose trigger is older than an earlier version's (the writer's
// clock stepped back) is still asked, and counted stale.
func TestRedeliveryCountedWithoutLookup(t *testing.T) {
	c := offlineController(t, bpfmaps.NewMemory(), newLookupTableResolver(), newRecordingSink())
	store, h := c.informers[report.KindPolicyEndpoint].GetIndexer(), c.handler(report.KindPolicyEndpoint)
	relisted := relistObserver{c, report.KindPolicyEndpoint}
	c.relists[report.KindPolicyEndpoint].begin() // the initial list
	pe := ingressPE("bench", "np-r", []v1alpha1.PodEndpoint{pod("192.0.2.99", "10.61.0.1")}, "10.70.0.0/16", 8000)
	pe.UID, pe.ResourceVersion = "uid-np-r", "1"
	late := nextTrigger()
	pe.Annotations = map[string]string{v1alpha1.AnnotationLastChangeTriggerTime: late.Format(time.RFC3339Nano)}
	if err := store.Add(pe); err != nil {
		t.Fatal(err)
	}
	h.OnAdd(pe, false)
	key := keyOf(report.KindPolicyEndpoint, pe)
	c.sync(key, time.Now()) // no local pod: the trigger is consumed
	st0 := c.cfg.Seen.Stats()
	if st0.Accepted != 1 {
		t.Fatalf("accepted %d, want 1", st0.Accepted)
	}
	for range 3 {
		c.relists[report.KindPolicyEndpoint].begin()
		again := pe.DeepCopy()
		relisted.Unchanged(again) // relist: counted here
		h.OnUpdate(pe, again)     // the relist's same-resourceVersion update: not again
		h.OnUpdate(pe, pe)        // a resync
	}
	st := c.cfg.Seen.Stats()
	if n := st.Suppressed[report.Redelivered] - st0.Suppressed[report.Redelivered]; n != 6 || st.Accepted != 1 {
		t.Errorf("6 re-deliveries: %d counted redelivered, %d accepted; want 6 and 1", n, st.Accepted)
	}

	// A second object: version 1 (trigger late) and version 2 (trigger early: the
	// writer's clock stepped back) are both accepted, then a worker that read
	// version 1 from the store before version 2's event consumes late.
	pe = pe.DeepCopy()
	pe.Name, pe.UID, pe.ResourceVersion = "np-s", "uid-np-s", "10"
	late, early := nextTrigger(), nextTrigger().Add(-time.Hour)
	pe.Annotations = map[string]string{v1alpha1.AnnotationLastChangeTriggerTime: late.Format(time.RFC3339Nano)}
	if err := store.Add(pe); err != nil {
		t.Fatal(err)
	}
	h.OnAdd(pe, false)
	older := pe.DeepCopy()
	older.ResourceVersion = "11"
	older.Annotations = map[string]string{v1alpha1.AnnotationLastChangeTriggerTime: early.Format(time.RFC3339Nano)}
	if err := store.Update(older); err != nil {
		t.Fatal(err)
	}
	h.OnUpdate(pe, older)
	c.cfg.Seen.NoLocalWork(string(pe.UID), late)
	st0 = c.cfg.Seen.Stats()
	h.OnUpdate(older, older)
	c.relists[report.KindPolicyEndpoint].begin()
	relisted.Unchanged(older.DeepCopy())
	h.OnUpdate(older, older) // the relist's update
	if st := c.cfg.Seen.Stats(); st.Accepted != 3 {
		t.Fatalf("accepted %d, want 3", st.Accepted)
	}
	st = c.cfg.Seen.Stats()
	if stale, redelivered := st.Suppressed[report.Stale]-st0.Suppressed[report.Stale], st.Suppressed[report.Redelivered]-st0.Suppressed[report.Redelivered]; stale != 2 || redelivered != 0 {
		t.Errorf("re-deliveries of a version older than the consumed trigger: %d stale, %d redelivered; want 2 and 0", stale, redelivered)
	}
}

func TestRelistTracker(t *testing.T) {
	var tr relistTracker
	var vt versionTable
	vt.init(v1alpha1.AnnotationLastChangeTriggerTime, v1alpha1.AnnotationTraceParent, testNode)
	m := &metav1.ObjectMeta{UID: "u1", ResourceVersion: "5"}
	vt.record(m)
	tr.begin()
	if tr.listing() {
		t.Fatal("the initial list is not a relist")
	}
	tr.begin()
	if !tr.listing() {
		t.Fatal("a second list is a relist")
	}
	if _, _, mark := vt.markRelist(m, tr.current()); mark != relistFirst {
		t.Fatalf("first re-delivery of the recorded version: %v, want relistFirst", mark)
	}
	if _, _, mark := vt.markRelist(m, tr.current()); mark != relistAgain {
		t.Fatalf("second re-delivery in one relist (a list retried): %v, want relistAgain", mark)
	}
	if _, _, mark := vt.markRelist(&metav1.ObjectMeta{UID: "u1", ResourceVersion: "6"}, tr.current()); mark != relistUnknown {
		t.Fatalf("a version not recorded: %v, want relistUnknown", mark)
	}
	if !vt.consumeRelist("u1", "5", tr.current()) || vt.consumeRelist("u1", "5", tr.current()) {
		t.Fatal("consume must be true once")
	}
	if vt.consumeRelist("u2", "5", tr.current()) {
		t.Fatal("an unmarked object is a resync")
	}
	tr.begin()
	if vt.consumeRelist("u1", "5", tr.current()) {
		t.Fatal("a new relist starts with no marks")
	}
	if _, _, mark := vt.markRelist(m, tr.current()); mark != relistFirst {
		t.Fatal("a new relist marks again")
	}
}
