package record

import (
	"testing"
	"time"
)

func TestCommittedAndLatency(t *testing.T) {
	trigger := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	r := Record{Trigger: trigger}
	if !r.Committed().IsZero() {
		t.Errorf("no attempts: Committed() = %v, want the zero time", r.Committed())
	}
	r.Attempts = []Attempt{
		{Start: trigger.Add(time.Second), End: trigger.Add(2 * time.Second), Err: "map full"},
		{Start: trigger.Add(3 * time.Second), End: trigger.Add(3500 * time.Millisecond)},
	}
	if got, want := r.Committed(), trigger.Add(3500*time.Millisecond); !got.Equal(want) {
		t.Errorf("Committed() = %v, want the end of the last attempt %v", got, want)
	}
	if got := r.Latency(); got != 3500*time.Millisecond {
		t.Errorf("Latency() = %v, want 3.5s", got)
	}
	// Clock skew: the controller's clock ahead of this node's.
	r.Trigger = trigger.Add(time.Hour)
	if got := r.Latency(); got >= 0 {
		t.Errorf("trigger after the commit: Latency() = %v, want negative", got)
	}
}
