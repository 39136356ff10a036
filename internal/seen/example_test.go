package seen_test

import (
	"fmt"
	"time"

	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/seen"
)

// ExampleSet follows one policy change from informer event to report: the
// first commit fails, the retry succeeds and reports the trigger once with
// its true latency; the next resync is suppressed as a re-delivery.
func ExampleSet() {
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	set, _ := seen.New(start) // no state path: nothing persisted
	const uid = "6f1c2a9e-3b7d-4c1e-9a2f-0d4b5e6f7a81"

	// Informer event handler.
	trigger, err := seen.ParseTrigger("2026-03-01T12:00:05.25Z")
	if err != nil {
		set.ObserveInvalid(uid)
		return
	}
	fmt.Println("event:", set.Observe(uid, trigger, trigger.Add(40*time.Millisecond)))

	// Worker: the first commit fails, the retry succeeds.
	first := trigger.Add(100 * time.Millisecond)
	set.Failed(uid, report.Attempt{Start: first, End: first.Add(time.Millisecond), Err: "map full"})
	committedAt := trigger.Add(300 * time.Millisecond)
	reports, err := set.Committed(uid, trigger, report.Attempt{Start: committedAt.Add(-2 * time.Millisecond), End: committedAt})
	if err != nil {
		fmt.Println("persist:", err)
	}
	for _, r := range reports {
		fmt.Printf("report: trigger %s latency %s attempts %d (first error %q)\n",
			r.Trigger.Format(time.RFC3339Nano), r.ProgrammedAt().Sub(r.Trigger), r.AttemptCount, r.Attempts[0].Err)
	}

	// Resync 10 minutes later: same object, same trigger.
	fmt.Println("resync:", set.Observe(uid, trigger, trigger.Add(10*time.Minute)))
	again := trigger.Add(10 * time.Minute)
	reports, _ = set.Committed(uid, trigger, report.Attempt{Start: again, End: again})
	fmt.Println("reports after resync:", len(reports))

	st := set.Stats()
	fmt.Println("redelivered:", st.Suppressed[report.Redelivered])
	// Output:
	// event: accepted
	// report: trigger 2026-03-01T12:00:05.25Z latency 300ms attempts 2 (first error "map full")
	// resync: redelivered
	// reports after resync: 0
	// redelivered: 1
}
