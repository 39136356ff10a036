package seen

import "strconv"

// Reason says why an observation or a pending trigger was not reported.
// Accepted is not a suppression: it is Observe's answer for a trigger that
// became pending.
type Reason uint8

const (
	// Accepted: Observe recorded the trigger as pending; it will end reported
	// or counted under exactly one of the reasons below.
	Accepted Reason = iota
	// Redelivered: the trigger equals a pending or consumed trigger of the uid
	// (resync, relist, requeue, restart).
	Redelivered
	// Stale: the trigger is older than the uid's consumed trigger.
	Stale
	// BeforeStart: the trigger is not newer than the start guard (the restored
	// watermark, or the process start without state) and nothing was persisted
	// or accepted for the uid.
	BeforeStart
	// InvalidAnnotation: the trigger annotation could not be parsed, or the
	// time is outside what int64 Unix nanoseconds can hold.
	InvalidAnnotation
	// NoLocalPods: a pending trigger consumed by NoLocalWork without a report.
	NoLocalPods
	// Deleted: a pending trigger dropped by Forget or Prune.
	Deleted
	// Overflow: a pending trigger dropped because the per-object bound was
	// exceeded (the oldest and the newest are always kept).
	Overflow

	// NumReasons is the number of Reason values, Accepted included; it sizes
	// Stats.Suppressed, whose Accepted slot is always zero.
	NumReasons = int(Overflow) + 1
)

var reasonNames = [NumReasons]string{
	Accepted:          "accepted",
	Redelivered:       "redelivered",
	Stale:             "stale",
	BeforeStart:       "before_start",
	InvalidAnnotation: "invalid_annotation",
	NoLocalPods:       "no_local_pods",
	Deleted:           "deleted",
	Overflow:          "overflow",
}

// String returns the snake_case name used as the metric attribute value
// ("redelivered", "before_start", ...; "accepted" for Accepted).
func (r Reason) String() string {
	if int(r) < NumReasons {
		return reasonNames[r]
	}
	return "Reason(" + strconv.Itoa(int(r)) + ")"
}

// Reasons returns every suppression reason (Accepted excluded), in declaration
// order, so a caller can register one counter series per reason up front.
func Reasons() []Reason {
	rs := make([]Reason, 0, NumReasons-1)
	for r := Redelivered; int(r) < NumReasons; r++ {
		rs = append(rs, r)
	}
	return rs
}
