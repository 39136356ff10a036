package seen

import (
	"testing"
	"time"

	"github.com/npagent/npagent/internal/report"
)

// TestInspectShowsPendingFailedAndConsumed: Inspect copies what the set holds for
// a uid — pending triggers with their receipt and failure count, the failed
// attempts, the consumed trigger — and changes nothing.
func TestInspectShowsPendingFailedAndConsumed(t *testing.T) {
	s := newTestSet(t)
	if _, ok := s.Inspect(uidA); ok {
		t.Fatal("Inspect of an unknown uid reported an entry")
	}
	mustObserve(t, s, uidA, at(1), at(1.5), report.Accepted)
	mustObserve(t, s, uidA, at(2), at(2.5), report.Accepted)
	s.Failed(uidA, report.Attempt{Start: at(3), End: at(3.1), Err: "boom"})
	e, ok := s.Inspect(uidA)
	if !ok || len(e.Pending) != 2 || !e.Consumed.IsZero() {
		t.Fatalf("Inspect = %+v, %v; want two pending, nothing consumed", e, ok)
	}
	if !e.Pending[0].Trigger.Equal(at(1)) || !e.Pending[0].ReceivedAt.Equal(at(1.5)) || e.Pending[0].Failures != 1 || !e.Pending[1].Trigger.Equal(at(2)) {
		t.Errorf("pending = %+v", e.Pending)
	}
	if len(e.Failed) != 1 || e.Failed[0].Err != "boom" {
		t.Errorf("failed = %+v, want the one failed attempt", e.Failed)
	}
	e.Failed[0].Err = "changed by the caller"
	if again, _ := s.Inspect(uidA); again.Failed[0].Err != "boom" {
		t.Errorf("Inspect shares the set's attempts with its caller: %q", again.Failed[0].Err)
	}
	mustCommit(t, s, uidA, at(1), at(4))
	e, _ = s.Inspect(uidA)
	if !e.Consumed.Equal(at(1)) || len(e.Pending) != 1 || e.Pending[0].Failures != 0 || len(e.Failed) != 0 {
		t.Errorf("after the commit of at(1): %+v; want at(1) consumed, at(2) pending with no failures", e)
	}
	if st := s.Stats(); st.Pending != 1 || st.Reported != 1 {
		t.Errorf("stats = %+v: Inspect must not change the set", st)
	}
}

// TestOldestPending: the oldest pending trigger over every uid, with its receipt,
// and nothing once all are committed.
func TestOldestPending(t *testing.T) {
	s := newTestSet(t)
	if _, _, ok := s.OldestPending(); ok {
		t.Fatal("OldestPending on an empty set reported one")
	}
	mustObserve(t, s, uidA, at(5), at(5.5), report.Accepted)
	mustObserve(t, s, uidB, at(2), at(2.5), report.Accepted)
	mustObserve(t, s, "named-object", at(3), at(3.5), report.Accepted)
	trig, recv, ok := s.OldestPending()
	if !ok || !trig.Equal(at(2)) || !recv.Equal(at(2.5)) {
		t.Fatalf("OldestPending = %v %v %v, want at(2), received at(2.5)", trig, recv, ok)
	}
	mustCommit(t, s, uidB, at(2), at(6))
	if trig, _, _ := s.OldestPending(); !trig.Equal(at(3)) {
		t.Errorf("after committing uidB: oldest = %v, want at(3)", trig)
	}
	mustCommit(t, s, uidA, at(5), at(7))
	s.Forget("named-object")
	if trig, _, ok := s.OldestPending(); ok {
		t.Errorf("nothing pending, OldestPending = %v", trig)
	}
}

func BenchmarkOldestPending(b *testing.B) {
	s, _ := New(at(0))
	for i := range 10000 {
		uid := time.Duration(i).String()
		s.Observe(uid, at(1+float64(i)), at(1))
		if i%100 != 0 {
			s.Committed(uid, at(1+float64(i)), report.Attempt{Start: at(1), End: at(2)})
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		s.OldestPending()
	}
}
