package seen

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/npagent/npagent/internal/report"
)

// base is an arbitrary wall-clock origin for the tests' trigger times.
var base = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func at(sec float64) time.Time { return base.Add(time.Duration(sec * float64(time.Second))) }

const (
	uidA = "6f1c2a9e-3b7d-4c1e-9a2f-0d4b5e6f7a81"
	uidB = "0b9e8d7c-6a5f-4e3d-8c2b-1a0f9e8d7c6b"
)

// newTestSet starts a set whose guard is at(0), so triggers at(1) and later
// are accepted.
func newTestSet(t *testing.T, opts ...Option) *Set {
	t.Helper()
	s, err := New(at(0), opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}

func mustObserve(t *testing.T, s *Set, uid string, trigger, received time.Time, want report.Reason) {
	t.Helper()
	if got := s.Observe(uid, trigger, received); got != want {
		t.Fatalf("Observe(%s, %s) = %s, want %s", uid, trigger.Format(time.RFC3339Nano), got, want)
	}
}

func mustCommit(t *testing.T, s *Set, uid string, programmed, when time.Time) []Report {
	t.Helper()
	reports, err := s.Committed(uid, programmed, attemptAt(when))
	if err != nil {
		t.Fatalf("Committed(%s, %s): %v", uid, programmed.Format(time.RFC3339Nano), err)
	}
	return reports
}

func triggersOf(reports []Report) []time.Time {
	out := make([]time.Time, len(reports))
	for i, r := range reports {
		out[i] = r.Trigger
	}
	return out
}

// checkBalance asserts the accounting invariant of Stats.
func checkBalance(t *testing.T, s *Set) {
	t.Helper()
	st := s.Stats()
	ends := st.Reported + st.Suppressed[report.NoLocalPods] + st.Suppressed[report.Deleted] + st.Suppressed[report.Overflow] + uint64(st.Pending)
	if st.Accepted+st.Restored != ends {
		t.Fatalf("accounting: accepted %d + restored %d != reported %d + no_local_pods %d + deleted %d + overflow %d + pending %d",
			st.Accepted, st.Restored, st.Reported, st.Suppressed[report.NoLocalPods], st.Suppressed[report.Deleted], st.Suppressed[report.Overflow], st.Pending)
	}
}

// TestRedeliveryTable walks DESIGN.md's re-delivery table: after a trigger
// is reported, none of the ways the same object reaches the agent again
// yields a second report.
func TestRedeliveryTable(t *testing.T) {
	trigger := at(10)
	reportOnce := func(t *testing.T, s *Set) {
		t.Helper()
		mustObserve(t, s, uidA, trigger, at(10.1), report.Accepted)
		if got := mustCommit(t, s, uidA, trigger, at(10.2)); len(got) != 1 || !got[0].Trigger.Equal(trigger) {
			t.Fatalf("first commit reported %v, want [%s]", triggersOf(got), trigger)
		}
	}
	t.Run("informer resync", func(t *testing.T) {
		s := newTestSet(t)
		reportOnce(t, s)
		for i := range 5 { // five resync periods: OnUpdate(old, new) same resourceVersion
			mustObserve(t, s, uidA, trigger, at(100+float64(i)), report.Redelivered)
			if got := mustCommit(t, s, uidA, trigger, at(100.5+float64(i))); len(got) != 0 {
				t.Fatalf("resync %d reported %v", i, triggersOf(got))
			}
		}
		if got := s.Stats().Suppressed[report.Redelivered]; got != 5 {
			t.Fatalf("redelivered = %d, want 5", got)
		}
	})
	t.Run("relist", func(t *testing.T) {
		s := newTestSet(t)
		reportOnce(t, s)
		mustObserve(t, s, uidB, at(11), at(11.1), report.Accepted)
		mustCommit(t, s, uidB, at(11), at(11.2))
		// 410 Gone: OnUpdate(cached, listed) for every object.
		for _, uid := range []string{uidA, uidB} {
			tr := trigger
			if uid == uidB {
				tr = at(11)
			}
			mustObserve(t, s, uid, tr, at(200), report.Redelivered)
			if got := mustCommit(t, s, uid, tr, at(200.1)); len(got) != 0 {
				t.Fatalf("relist of %s reported %v", uid, triggersOf(got))
			}
		}
	})
	t.Run("workqueue requeue", func(t *testing.T) {
		s := newTestSet(t)
		mustObserve(t, s, uidA, trigger, at(10.1), report.Accepted)
		// An event from another watched object requeues the key while the
		// trigger is pending: same trigger, no new pending entry.
		mustObserve(t, s, uidA, trigger, at(10.15), report.Redelivered)
		if got := mustCommit(t, s, uidA, trigger, at(10.2)); len(got) != 1 {
			t.Fatalf("commit reported %v, want one", triggersOf(got))
		}
		// AddAfter / error retry: the worker syncs again with no event.
		for range 3 {
			if got := mustCommit(t, s, uidA, trigger, at(30)); len(got) != 0 {
				t.Fatalf("requeue reported %v", triggersOf(got))
			}
		}
	})
	t.Run("agent restart", func(t *testing.T) {
		path := t.TempDir() + "/seen.state"
		s := newTestSet(t, WithStatePath(path))
		reportOnce(t, s)
		if err := s.Persist(); err != nil {
			t.Fatal(err)
		}
		s2, err := New(at(500), WithStatePath(path))
		if err != nil {
			t.Fatalf("restore: %v", err)
		}
		// The initial list delivers every object again.
		mustObserve(t, s2, uidA, trigger, at(501), report.Redelivered)
		if got := mustCommit(t, s2, uidA, trigger, at(502)); len(got) != 0 {
			t.Fatalf("restart reported %v", triggersOf(got))
		}
	})
}

func TestFailedCommitReportedOnceOnSuccess(t *testing.T) {
	for failures := 1; failures <= 2; failures++ {
		s := newTestSet(t)
		mustObserve(t, s, uidA, at(10), at(10.5), report.Accepted)
		for range failures {
			s.Failed(uidA, failedAttempt)
		}
		if newest, ok := s.Pending(uidA); !ok || !newest.Equal(at(10)) {
			t.Fatalf("after %d failures Pending = %v, %v; want %s kept", failures, newest, ok, at(10))
		}
		got := mustCommit(t, s, uidA, at(10), at(12))
		if len(got) != 1 {
			t.Fatalf("reported %v, want one", triggersOf(got))
		}
		r := got[0]
		if r.AttemptCount != failures+1 || !r.Trigger.Equal(at(10)) || !r.ReceivedAt.Equal(at(10.5)) || r.UID != uidA {
			t.Fatalf("report = %+v, want trigger %s received %s attempts %d", r, at(10), at(10.5), failures+1)
		}
		if again := mustCommit(t, s, uidA, at(10), at(13)); len(again) != 0 {
			t.Fatalf("second success reported %v", triggersOf(again))
		}
	}
}

func TestAttemptsCountOnlyFailuresAfterAcceptance(t *testing.T) {
	s := newTestSet(t)
	mustObserve(t, s, uidA, at(10), at(10), report.Accepted)
	s.Failed(uidA, failedAttempt)
	mustObserve(t, s, uidA, at(11), at(11), report.Accepted)
	s.Failed(uidA, failedAttempt)
	got := mustCommit(t, s, uidA, at(11), at(12))
	if len(got) != 2 || got[0].AttemptCount != 3 || got[1].AttemptCount != 2 {
		t.Fatalf("reports = %+v, want attempts 3 then 2", got)
	}
}

func TestCoalescedTriggersBothReportedOldestFirst(t *testing.T) {
	s := newTestSet(t)
	// Delivered out of order to show the ordering comes from the set.
	mustObserve(t, s, uidA, at(20), at(20.1), report.Accepted)
	mustObserve(t, s, uidA, at(15), at(20.2), report.Accepted)
	got := mustCommit(t, s, uidA, at(20), at(21))
	if want := []time.Time{at(15), at(20)}; !slices.EqualFunc(triggersOf(got), want, time.Time.Equal) {
		t.Fatalf("reported %v, want %v", triggersOf(got), want)
	}
	checkBalance(t, s)
}

func TestCommitBelowNewestKeepsNewerPending(t *testing.T) {
	s := newTestSet(t)
	mustObserve(t, s, uidA, at(10), at(10), report.Accepted)
	mustObserve(t, s, uidA, at(20), at(20), report.Accepted)
	if got := mustCommit(t, s, uidA, at(10), at(21)); len(got) != 1 || !got[0].Trigger.Equal(at(10)) {
		t.Fatalf("reported %v, want [%s]", triggersOf(got), at(10))
	}
	if newest, ok := s.Pending(uidA); !ok || !newest.Equal(at(20)) {
		t.Fatalf("Pending = %v, %v; want %s", newest, ok, at(20))
	}
}

func TestStaleTrigger(t *testing.T) {
	s := newTestSet(t)
	mustObserve(t, s, uidA, at(20), at(20), report.Accepted)
	mustCommit(t, s, uidA, at(20), at(21))
	mustObserve(t, s, uidA, at(15), at(22), report.Stale)
	if got := s.Stats().Suppressed[report.Stale]; got != 1 {
		t.Fatalf("stale = %d, want 1", got)
	}
}

func TestDeleteAndRecreateSameNameIsReported(t *testing.T) {
	// Same namespace/name, new uid: the controller stamps the new object with
	// its own trigger, which can even equal the old one's.
	s := newTestSet(t)
	mustObserve(t, s, uidA, at(10), at(10), report.Accepted)
	mustCommit(t, s, uidA, at(10), at(11))
	s.Forget(uidA)
	mustObserve(t, s, uidB, at(10), at(12), report.Accepted)
	if got := mustCommit(t, s, uidB, at(10), at(13)); len(got) != 1 || got[0].UID != uidB {
		t.Fatalf("recreated object reported %+v, want one report for %s", got, uidB)
	}
	if st := s.Stats(); st.Objects != 1 {
		t.Fatalf("objects = %d, want 1 after delete", st.Objects)
	}
}

func TestBeforeStartWithoutState(t *testing.T) {
	s := newTestSet(t) // guard at(0)
	mustObserve(t, s, uidA, at(-60), at(1), report.BeforeStart)
	// The object's next resync is a re-delivery, not another before_start.
	mustObserve(t, s, uidA, at(-60), at(31), report.Redelivered)
	if got := mustCommit(t, s, uidA, at(-60), at(2)); len(got) != 0 {
		t.Fatalf("before_start trigger reported %v", triggersOf(got))
	}
	// A change made after the start is measured.
	mustObserve(t, s, uidA, at(5), at(5.1), report.Accepted)
	if got := mustCommit(t, s, uidA, at(5), at(6)); len(got) != 1 {
		t.Fatalf("post-start change reported %v, want one", triggersOf(got))
	}
	st := s.Stats()
	if st.Suppressed[report.BeforeStart] != 1 || st.Suppressed[report.Redelivered] != 1 {
		t.Fatalf("before_start %d redelivered %d, want 1 and 1", st.Suppressed[report.BeforeStart], st.Suppressed[report.Redelivered])
	}
}

func TestGuardedUIDLaterOldTriggerStaysBeforeStart(t *testing.T) {
	// A stale list gives the older version first, then the watch delivers a
	// newer one that is still older than the start: neither is measured.
	s := newTestSet(t)
	mustObserve(t, s, uidA, at(-60), at(1), report.BeforeStart)
	mustObserve(t, s, uidA, at(-30), at(1.1), report.BeforeStart)
}

func TestInvalidAnnotationCounted(t *testing.T) {
	s := newTestSet(t)
	s.ObserveInvalid(uidA)
	mustObserve(t, s, uidA, time.Time{}, at(1), report.InvalidAnnotation)
	if got := s.Stats().Suppressed[report.InvalidAnnotation]; got != 2 {
		t.Fatalf("invalid_annotation = %d, want 2", got)
	}
	if got := s.Stats().Objects; got != 0 {
		t.Fatalf("objects = %d, want 0: invalid events track nothing", got)
	}
}

func TestNoLocalWorkConsumesWithoutReport(t *testing.T) {
	s := newTestSet(t)
	mustObserve(t, s, uidA, at(10), at(10), report.Accepted)
	mustObserve(t, s, uidA, at(11), at(11), report.Accepted)
	mustObserve(t, s, uidA, at(12), at(12), report.Accepted)
	s.NoLocalWork(uidA, at(11))
	if got := s.Stats().Suppressed[report.NoLocalPods]; got != 2 {
		t.Fatalf("no_local_pods = %d, want 2", got)
	}
	mustObserve(t, s, uidA, at(11), at(13), report.Redelivered)
	// A pod of the object lands on this node: the next trigger is measured.
	if got := mustCommit(t, s, uidA, at(12), at(14)); len(got) != 1 || !got[0].Trigger.Equal(at(12)) {
		t.Fatalf("reported %v, want [%s]", triggersOf(got), at(12))
	}
	checkBalance(t, s)
}

func TestForgetCountsPendingDeleted(t *testing.T) {
	s := newTestSet(t)
	mustObserve(t, s, uidA, at(10), at(10), report.Accepted)
	mustObserve(t, s, uidA, at(11), at(11), report.Accepted)
	s.Forget(uidA)
	st := s.Stats()
	if st.Suppressed[report.Deleted] != 2 || st.Objects != 0 || st.Pending != 0 {
		t.Fatalf("after Forget: deleted %d objects %d pending %d, want 2 0 0", st.Suppressed[report.Deleted], st.Objects, st.Pending)
	}
	checkBalance(t, s)
}

func TestOverflowKeepsOldestAndNewest(t *testing.T) {
	s := newTestSet(t, WithMaxPending(3))
	for i := 1; i <= 6; i++ {
		mustObserve(t, s, uidA, at(float64(i)), at(float64(i)), report.Accepted)
	}
	got := triggersOf(mustCommit(t, s, uidA, at(6), at(7)))
	if len(got) != 3 || !got[0].Equal(at(1)) || !got[2].Equal(at(6)) {
		t.Fatalf("reported %v, want 3 triggers from %s to %s", got, at(1), at(6))
	}
	if o := s.Stats().Suppressed[report.Overflow]; o != 3 {
		t.Fatalf("overflow = %d, want 3", o)
	}
	checkBalance(t, s)
}

func TestPruneDropsEntriesOfGoneObjects(t *testing.T) {
	s := newTestSet(t)
	mustObserve(t, s, uidA, at(10), at(10), report.Accepted)
	mustObserve(t, s, uidB, at(10), at(10), report.Accepted)
	mustCommit(t, s, uidB, at(10), at(11))
	mustObserve(t, s, "not-a-uuid", at(10), at(10), report.Accepted)
	live := map[string]bool{uidB: true}
	if n := s.Prune(func(uid string) bool { return live[uid] }); n != 2 {
		t.Fatalf("Prune dropped %d, want 2", n)
	}
	st := s.Stats()
	if st.Objects != 1 || st.Suppressed[report.Deleted] != 2 {
		t.Fatalf("objects %d deleted %d, want 1 and 2", st.Objects, st.Suppressed[report.Deleted])
	}
	checkBalance(t, s)
}

func TestNonUUIDKeysAreDistinct(t *testing.T) {
	s := newTestSet(t)
	upper := "6F1C2A9E-3B7D-4C1E-9A2F-0D4B5E6F7A81" // not canonical: string-keyed
	mustObserve(t, s, uidA, at(10), at(10), report.Accepted)
	mustObserve(t, s, upper, at(10), at(10), report.Accepted)
	if got := mustCommit(t, s, upper, at(10), at(11)); len(got) != 1 || got[0].UID != upper {
		t.Fatalf("reported %+v, want one for %s", got, upper)
	}
	if _, ok := s.Pending(uidA); !ok {
		t.Fatalf("%s lost its pending trigger to %s", uidA, upper)
	}
}

// TestListerAheadOfHandler: client-go updates the lister before handlers run,
// so a worker can commit a trigger Observe has not seen. Its event must still
// be measured, once, ending at the commit that programmed it.
func TestListerAheadOfHandler(t *testing.T) {
	s := newTestSet(t)
	mustObserve(t, s, uidA, at(10), at(10.1), report.Accepted)
	got := mustCommit(t, s, uidA, at(12), at(12.5)) // lister already holds at(12)
	if len(got) != 1 || !got[0].Trigger.Equal(at(10)) || got[0].Ahead {
		t.Fatalf("first commit reported %+v, want [%s] without ProgrammedAt", got, at(10))
	}
	mustObserve(t, s, uidA, at(12), at(12.6), report.Accepted) // the handler catches up
	mustObserve(t, s, uidA, at(12), at(13), report.Redelivered)
	got = mustCommit(t, s, uidA, at(12), at(13.5))
	if len(got) != 1 || !got[0].Trigger.Equal(at(12)) || !got[0].Ahead || !got[0].ProgrammedAt().Equal(at(12.5)) {
		t.Fatalf("second commit reported %+v, want [%s] programmed at %s", got, at(12), at(12.5))
	}
	if again := mustCommit(t, s, uidA, at(12), at(14)); len(again) != 0 {
		t.Fatalf("third commit reported %v", triggersOf(again))
	}
	if st := s.Stats(); st.Pending != 0 {
		t.Fatalf("pending = %d, want 0", st.Pending)
	}
	checkBalance(t, s)
}

func TestCommitWithoutAnnotationChangesNothing(t *testing.T) {
	s := newTestSet(t)
	if got := mustCommit(t, s, uidA, time.Time{}, at(1)); got != nil {
		t.Fatalf("reported %v", got)
	}
	if st := s.Stats(); st.Objects != 0 {
		t.Fatalf("objects = %d, want 0", st.Objects)
	}
}

func TestReasonNames(t *testing.T) {
	want := map[report.Reason]string{
		report.Accepted: "accepted", report.Redelivered: "redelivered", report.Stale: "stale", report.BeforeStart: "before_start",
		report.InvalidAnnotation: "invalid_annotation", report.NoLocalPods: "no_local_pods", report.Deleted: "deleted", report.Overflow: "overflow",
	}
	for r, name := range want {
		if r.String() != name {
			t.Errorf("Reason(%d).String() = %q, want %q", r, r.String(), name)
		}
	}
	rs := report.Reasons()
	if len(rs) != report.NumReasons-1 || slices.Contains(rs, report.Accepted) {
		t.Fatalf("Reasons() = %v, want the %d suppression reasons", rs, report.NumReasons-1)
	}
	if got := report.Reason(200).String(); got != "Reason(200)" {
		t.Fatalf("unknown reason prints %q", got)
	}
}

// TestObserveRedeliveredDoesNotAllocate guards the hot path: every resync
// re-observes every object.
func TestObserveRedeliveredDoesNotAllocate(t *testing.T) {
	s := newTestSet(t)
	mustObserve(t, s, uidA, at(10), at(10), report.Accepted)
	mustObserve(t, s, uidB, at(10), at(10), report.Accepted)
	mustCommit(t, s, uidB, at(10), at(11))
	for _, c := range []struct {
		name string
		uid  string
	}{{"pending", uidA}, {"consumed", uidB}} {
		allocs := testing.AllocsPerRun(1000, func() {
			if s.Observe(c.uid, at(10), at(20)) != report.Redelivered {
				t.Fatal("not redelivered")
			}
		})
		if allocs != 0 {
			t.Errorf("Observe of a re-delivered %s trigger allocates %.1f times per call, want 0", c.name, allocs)
		}
	}
}

// attemptAt is a successful commit attempt ending at t.
func attemptAt(t time.Time) report.Attempt { return report.Attempt{Start: t, End: t} }

// failedAttempt is a failed commit attempt.
var failedAttempt = report.Attempt{Err: "commit failed (test)"}

// The set owns attempt history: a reported trigger carries the failed attempts
// since it was accepted, with their errors, then the successful one; the list is
// bounded (the newest kept) while the count stays whole; a later trigger does
// not inherit failures from before its acceptance.
func TestAttemptsCarriedWithTheirErrors(t *testing.T) {
	s := newTestSet(t)
	mustObserve(t, s, uidA, at(10), at(10), report.Accepted)
	s.Failed(uidA, report.Attempt{Start: at(10.1), End: at(10.2), Err: "first"})
	mustObserve(t, s, uidA, at(11), at(11), report.Accepted)
	s.Failed(uidA, report.Attempt{Start: at(11.1), End: at(11.2), Err: "second"})
	ok := report.Attempt{Start: at(11.5), End: at(12), Phases: report.Phases{Write: time.Millisecond}}
	got, err := s.Committed(uidA, at(11), ok)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("reported %v, want two", triggersOf(got))
	}
	errs := func(r Report) []string {
		var out []string
		for _, a := range r.Attempts {
			out = append(out, a.Err)
		}
		return out
	}
	if e := errs(got[0]); !slices.Equal(e, []string{"first", "second", ""}) || got[0].Attempts[2] != ok {
		t.Errorf("first trigger's attempts %q, want first, second, then the success", e)
	}
	if e := errs(got[1]); !slices.Equal(e, []string{"second", ""}) {
		t.Errorf("second trigger's attempts %q, want second then the success", e)
	}
	if !got[1].ProgrammedAt().Equal(at(12)) {
		t.Errorf("ProgrammedAt = %s, want the success's end %s", got[1].ProgrammedAt(), at(12))
	}

	// Bounded: only the newest maxAttempts failures keep their details.
	mustObserve(t, s, uidA, at(20), at(20), report.Accepted)
	for i := range maxAttempts + 5 {
		s.Failed(uidA, report.Attempt{Err: fmt.Sprint(i)})
	}
	got = mustCommit(t, s, uidA, at(20), at(30))
	if len(got) != 1 || got[0].AttemptCount != maxAttempts+6 || len(got[0].Attempts) != maxAttempts+1 ||
		got[0].Attempts[0].Err != "5" {
		t.Fatalf("after %d failures: count %d, %d attempts kept starting at %q; want count %d, %d kept from \"5\"",
			maxAttempts+5, got[0].AttemptCount, len(got[0].Attempts), got[0].Attempts[0].Err, maxAttempts+6, maxAttempts+1)
	}
}

// A commit that ran ahead of the event (lister before handlers) is the attempt
// the trigger is reported with, details and all.
func TestAheadReportCarriesTheCommitThatHeldIt(t *testing.T) {
	s := newTestSet(t)
	ahead := report.Attempt{Start: at(12), End: at(12.5), Phases: report.Phases{Switch: time.Microsecond}}
	if got, _ := s.Committed(uidA, at(12), ahead); len(got) != 0 {
		t.Fatalf("commit ahead of the event reported %v", triggersOf(got))
	}
	mustObserve(t, s, uidA, at(12), at(13), report.Accepted)
	got := mustCommit(t, s, uidA, at(12), at(14))
	if len(got) != 1 || !got[0].Ahead || len(got[0].Attempts) != 1 || got[0].Attempts[0] != ahead {
		t.Fatalf("report %+v, want one ahead report carrying the earlier commit %+v", got, ahead)
	}
}

// TestFutureTriggerNotConsumed: a trigger far past the clock (2262-01-01, a
// controller's bad clock or a hand-written annotation) is suppressed as future
// and not consumed, neither by Observe nor by a commit or NoLocalWork of its
// version, so the object's later genuine triggers are still measured; before,
// every one of them answered stale until the clock passed 2262.
func TestFutureTriggerNotConsumed(t *testing.T) {
	now := at(100)
	s := newTestSet(t, WithNow(func() time.Time { return now }), WithMaxSkew(5*time.Second))
	far := time.Date(2262, 1, 1, 0, 0, 0, 0, time.UTC)
	mustObserve(t, s, uidA, far, at(100), report.Future)
	if got, _ := s.Committed(uidA, far, attemptAt(at(100.5))); len(got) != 0 {
		t.Fatalf("commit of the future version reported %v", triggersOf(got))
	}
	s.NoLocalWork(uidA, far)
	mustObserve(t, s, uidA, at(103), at(103.2), report.Accepted) // within the skew: counts
	if got := mustCommit(t, s, uidA, at(103), at(104)); len(got) != 1 || !got[0].Trigger.Equal(at(103)) {
		t.Fatalf("genuine trigger after a future one: reported %v, want [%s]", triggersOf(got), at(103))
	}
	mustObserve(t, s, uidA, at(99), at(104.5), report.Stale)
	if st := s.Stats(); st.Suppressed[report.Future] != 1 {
		t.Errorf("future counted %d times, want 1", st.Suppressed[report.Future])
	}
}

// CountRedelivered counts what Observe of a pending or consumed trigger would:
// one redelivered, nothing else changed.
func TestCountRedelivered(t *testing.T) {
	s, err := New(time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	trig := time.Now().Add(-time.Minute)
	if r := s.Observe("u", trig, time.Now()); r != report.Accepted {
		t.Fatalf("Observe = %v", r)
	}
	before := s.Stats()
	if r := s.Observe("u", trig, time.Now()); r != report.Redelivered {
		t.Fatalf("Observe again = %v", r)
	}
	s.CountRedelivered()
	after := s.Stats()
	if n := after.Suppressed[report.Redelivered] - before.Suppressed[report.Redelivered]; n != 2 {
		t.Errorf("Observe's and CountRedelivered's re-deliveries counted %d, want 2", n)
	}
	if after.Accepted != before.Accepted || after.Pending != before.Pending || after.Objects != before.Objects {
		t.Errorf("CountRedelivered changed more than the count: %+v → %+v", before, after)
	}
}
