package seen

import (
	"slices"
	"testing"
	"time"

	"github.com/npagent/npagent/internal/report"
)

func mustObserveVersion(t *testing.T, s *Set, uid string, trigger, received time.Time, v Version, want report.Reason) {
	t.Helper()
	if got := s.ObserveVersion(uid, trigger, received, v); got != want {
		t.Fatalf("ObserveVersion(%s, %s) = %s, want %s", uid, trigger.Format(time.RFC3339Nano), got, want)
	}
}

// versionsOf returns each report's recorded resourceVersion, "-" for none.
func versionsOf(reports []Report) []string {
	out := make([]string, len(reports))
	for i, r := range reports {
		out[i] = "-"
		if r.Version != nil {
			out[i] = r.Version.ResourceVersion
		}
	}
	return out
}

// TestCommitReportsEachTriggerWithItsOwnVersion: a commit that serves triggers of
// coalesced versions reports each with the version that carried it, not the
// committed one; a trigger observed without a version reports none.
func TestCommitReportsEachTriggerWithItsOwnVersion(t *testing.T) {
	s := newTestSet(t)
	v1 := Version{ResourceVersion: "1", TraceParent: "tp1", LocalWork: true}
	v2 := Version{ResourceVersion: "2", TraceParent: "tp2", LocalWork: true, RemovedOnly: true}
	mustObserveVersion(t, s, uidA, at(10), at(10.1), v1, report.Accepted)
	mustObserveVersion(t, s, uidA, at(20), at(20.1), v2, report.Accepted)
	mustObserve(t, s, uidA, at(30), at(30.1), report.Accepted)
	got := mustCommit(t, s, uidA, at(30), at(31))
	if want := []string{"1", "2", "-"}; !slices.Equal(versionsOf(got), want) {
		t.Fatalf("reported versions %v, want %v", versionsOf(got), want)
	}
	if *got[0].Version != v1 || *got[1].Version != v2 {
		t.Fatalf("reported %+v and %+v, want %+v and %+v", *got[0].Version, *got[1].Version, v1, v2)
	}
	checkBalance(t, s)
}

// TestRedeliveryKeepsTheFirstVersion: a later version carrying the same trigger
// answers redelivered and does not replace the record of the version that
// brought it first.
func TestRedeliveryKeepsTheFirstVersion(t *testing.T) {
	s := newTestSet(t)
	mustObserveVersion(t, s, uidA, at(10), at(10.1), Version{ResourceVersion: "1", LocalWork: true}, report.Accepted)
	mustObserveVersion(t, s, uidA, at(10), at(11), Version{ResourceVersion: "2", LocalWork: true}, report.Redelivered)
	if got := mustCommit(t, s, uidA, at(10), at(12)); !slices.Equal(versionsOf(got), []string{"1"}) {
		t.Fatalf("reported versions %v, want [1]", versionsOf(got))
	}
}

// TestTriggerWithoutLocalWorkConsumedByCommit: the commit covering a trigger whose
// own version had no work on this node consumes it without a report, counted
// no_local_pods, while the other triggers it covers are reported.
func TestTriggerWithoutLocalWorkConsumedByCommit(t *testing.T) {
	s := newTestSet(t)
	mustObserveVersion(t, s, uidA, at(10), at(10.1), Version{ResourceVersion: "1"}, report.Accepted)
	mustObserveVersion(t, s, uidA, at(20), at(20.1), Version{ResourceVersion: "2", LocalWork: true}, report.Accepted)
	got := mustCommit(t, s, uidA, at(20), at(21))
	if !slices.Equal(versionsOf(got), []string{"2"}) {
		t.Fatalf("reported versions %v, want [2]", versionsOf(got))
	}
	if n := s.Stats().Suppressed[report.NoLocalPods]; n != 1 {
		t.Fatalf("no_local_pods = %d, want 1", n)
	}
	mustObserve(t, s, uidA, at(10), at(22), report.Stale)
	checkBalance(t, s)
}

// TestVersionRecordSharesThePendingBound: the record goes with its trigger when
// overflow drops it, and stays with the oldest and the newest it keeps.
func TestVersionRecordSharesThePendingBound(t *testing.T) {
	s := newTestSet(t, WithMaxPending(2))
	for i, rv := range []string{"1", "2", "3"} {
		mustObserveVersion(t, s, uidA, at(float64(10*(i+1))), at(float64(10*(i+1))), Version{ResourceVersion: rv, LocalWork: true}, report.Accepted)
	}
	if got := mustCommit(t, s, uidA, at(30), at(31)); !slices.Equal(versionsOf(got), []string{"1", "3"}) {
		t.Fatalf("reported versions %v, want [1 3]", versionsOf(got))
	}
	checkBalance(t, s)
}

// TestForgetDropsTheVersionRecord: after Forget the same trigger is a new object's,
// recorded with the new version.
func TestForgetDropsTheVersionRecord(t *testing.T) {
	s := newTestSet(t)
	mustObserveVersion(t, s, uidA, at(10), at(10.1), Version{ResourceVersion: "1", LocalWork: true}, report.Accepted)
	s.Forget(uidA)
	mustObserveVersion(t, s, uidA, at(10), at(11), Version{ResourceVersion: "7", LocalWork: true}, report.Accepted)
	if got := mustCommit(t, s, uidA, at(10), at(12)); !slices.Equal(versionsOf(got), []string{"7"}) {
		t.Fatalf("reported versions %v, want [7]", versionsOf(got))
	}
}

// TestRestoredTriggerHasNoVersion: the record is not persisted; a trigger
// restored from the state file is reported without one.
func TestRestoredTriggerHasNoVersion(t *testing.T) {
	path := statePath(t)
	clk := &clock{t: at(0)}
	s1 := restart(t, at(0), path, WithNow(clk.now))
	mustObserveVersion(t, s1, uidA, at(10), at(10.1), Version{ResourceVersion: "1"}, report.Accepted)
	clk.set(at(100))
	if err := s1.Persist(); err != nil {
		t.Fatal(err)
	}
	s2 := restart(t, at(200), path, WithNow(clk.now))
	if got := mustCommit(t, s2, uidA, at(10), at(201)); !slices.Equal(versionsOf(got), []string{"-"}) {
		t.Fatalf("reported versions %v, want [-]", versionsOf(got))
	}
}

// TestObserveVersionRedeliveredDoesNotAllocate: the record is allocated only for
// an accepted trigger.
func TestObserveVersionRedeliveredDoesNotAllocate(t *testing.T) {
	s := newTestSet(t)
	v := Version{ResourceVersion: "1", TraceParent: "tp", LocalWork: true}
	mustObserveVersion(t, s, uidA, at(10), at(10), v, report.Accepted)
	allocs := testing.AllocsPerRun(1000, func() {
		if s.ObserveVersion(uidA, at(10), at(20), v) != report.Redelivered {
			t.Fatal("not redelivered")
		}
	})
	if allocs != 0 {
		t.Errorf("ObserveVersion of a re-delivered trigger allocates %.1f times per call, want 0", allocs)
	}
}
