package kubewatch

import (
	"errors"
	"slices"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/npagent/npagent/api/v1alpha1"
)

// TestWatchStalled: the stall rule on its own (pure logic, times given).
func TestWatchStalled(t *testing.T) {
	const (
		bound   = time.Minute
		timeout = 7 * time.Minute // the open watch's timeoutSeconds
	)
	now := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	never := time.Time{}
	for _, tc := range []struct {
		name        string
		established bool
		last, down  time.Time
		timeout     time.Duration
		want        bool
	}{
		{"before the first list", false, never, never, timeout, false},
		{"open, an event just now", true, ago(time.Second), never, timeout, false},
		{"open and quiet for 5m: no bookmark is due", true, ago(5 * time.Minute), ago(time.Hour), timeout, false},
		{"open and quiet up to its timeout plus the bound", true, ago(timeout + bound), ago(time.Hour), timeout, false},
		{"open past its timeout plus the bound: not served", true, ago(timeout + bound + time.Second), ago(time.Hour), timeout, true},
		{"open without a timeout, silent past the bound", true, ago(bound + time.Second), ago(time.Hour), 0, true},
		{"down for a moment after a quiet 5m", false, ago(5 * time.Minute), ago(5 * time.Second), 0, false},
		{"down past the bound", false, ago(bound + 2*time.Second), ago(bound + time.Second), 0, true},
		{"listed, watch never opened, past the bound", false, ago(bound + time.Second), never, 0, true},
		{"relisted while down, within the bound", false, ago(10 * time.Second), ago(bound + time.Second), 0, false},
	} {
		age, got := watchStalled(tc.established, tc.last, tc.down, tc.timeout, now, bound)
		if got != tc.want {
			t.Errorf("%s: stalled = %v (age %v), want %v", tc.name, got, age, tc.want)
		}
	}
}

// TestListWatchDiff: after a 410 the ListWatch lists afresh and delivers the
// difference to what it delivered before as events, as the reflector's relist
// would: every listed object (unchanged ones too), a recreated object as delete
// plus add, and the missing ones deleted.
func TestListWatchDiff(t *testing.T) {
	pe := func(name, uid, rv string) runtime.Object {
		return &v1alpha1.PolicyEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(uid), ResourceVersion: rv}}
	}
	l := &listWatch{}
	first := []runtime.Object{pe("same", "u1", "1"), pe("changed", "u2", "2"), pe("recreated", "u3", "3"), pe("gone", "u4", "4")}
	l.listed(first, true)
	relisted := []runtime.Object{pe("same", "u1", "1"), pe("changed", "u2", "7"), pe("recreated", "u9", "8"), pe("new", "u5", "9")}
	events, unchanged := l.diff(relisted)
	// The unchanged object is re-delivered as the object delivered before (the
	// informer's cache keeps it; node-local versions refer to it); the others as
	// copies of their own, so that nothing keeps the new list alive.
	if events[0].Object != first[0] {
		t.Error("the unchanged object was re-delivered as the new decode, not as the object delivered before")
	}
	for i, e := range events[1:] {
		for _, item := range relisted {
			if e.Object == item {
				t.Errorf("event %d delivers an item of the new list itself, not a copy", i+1)
			}
		}
	}
	type ev struct {
		t        watch.EventType
		name, rv string
	}
	var got []ev
	for _, e := range events {
		m := e.Object.(metav1.Object)
		got = append(got, ev{e.Type, m.GetName(), m.GetResourceVersion()})
	}
	want := []ev{
		{watch.Modified, "same", "1"},
		{watch.Modified, "changed", "7"},
		{watch.Deleted, "recreated", "3"}, {watch.Added, "recreated", "8"},
		{watch.Added, "new", "9"},
		{watch.Deleted, "gone", "4"},
	}
	if len(got) != len(want) {
		t.Fatalf("events = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("event %d = %v, want %v (all: %v)", i, got[i], want[i], got)
		}
	}
	// The observer hears of the unchanged object only, as delivered before.
	if len(unchanged) != 1 || unchanged[0] != first[0] {
		t.Errorf("unchanged = %v, want only the object delivered before as \"same\"", unchanged)
	}
	// What was delivered is now the list.
	if n := len(l.delivered); n != 4 {
		t.Errorf("%d objects remembered, want 4", n)
	}
	if d := l.delivered["ns/recreated"]; d.uid != "u9" || d.rv != "8" {
		t.Errorf("recreated remembered as %+v", d)
	}
}

// TestReopenDelay: a watch that delivered or lasted is reopened at once; one that
// ended with an error or at once waits 100 ms, doubling to 500 ms, until one
// delivers again (pure logic).
func TestReopenDelay(t *testing.T) {
	failed := errors.New("internal error")
	var d time.Duration
	var got []time.Duration
	for range 5 {
		d = reopenDelay(d, failed, 0, 10*time.Millisecond)
		got = append(got, d)
	}
	want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 500 * time.Millisecond, 500 * time.Millisecond}
	if !slices.Equal(got, want) {
		t.Errorf("delays after failing watches = %v, want %v", got, want)
	}
	if d := reopenDelay(500*time.Millisecond, nil, 3, 10*time.Millisecond); d != 0 {
		t.Errorf("after a watch that delivered: %v, want 0", d)
	}
	if d := reopenDelay(500*time.Millisecond, nil, 0, 7*time.Minute); d != 0 {
		t.Errorf("after a watch that ran to its timeout: %v, want 0", d)
	}
	if d := reopenDelay(0, nil, 0, 5*time.Millisecond); d != 100*time.Millisecond {
		t.Errorf("after a watch closed at once with nothing: %v, want 100ms", d)
	}
	if d := reopenDelay(0, failed, 4, time.Minute); d != 100*time.Millisecond {
		t.Errorf("after a watch that delivered and then failed: %v, want 100ms", d)
	}
}

// TestRVGone: a resourceVersion too old (410, either reason) or too new is cured by
// a fresh list; other errors are not.
func TestRVGone(t *testing.T) {
	gr := schema.GroupResource{Group: "networking.k8s.aws", Resource: "policyendpoints"}
	tooLarge := apierrors.NewTimeoutError("Too large resource version", 1)
	tooLarge.ErrStatus.Details.Causes = []metav1.StatusCause{{Type: metav1.CauseTypeResourceVersionTooLarge}}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{apierrors.NewResourceExpired("too old resource version: 5 (9)"), true},
		{&apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 410, Reason: metav1.StatusReasonGone}}, true}, // Kubernetes 1.17 and older
		{tooLarge, true},
		{apierrors.NewTimeoutError("slow", 1), false},
		{apierrors.NewNotFound(gr, ""), false},
		{errors.New("connection refused"), false},
	} {
		if got := rvGone(tc.err); got != tc.want {
			t.Errorf("rvGone(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
