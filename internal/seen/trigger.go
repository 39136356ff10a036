package seen

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// ErrInvalidTrigger is wrapped by every ParseTrigger error, so callers can
// match it with errors.Is.
var ErrInvalidTrigger = errors.New("invalid trigger time")

// maxQuotedValue bounds how much of a bad annotation value an error quotes:
// annotations can be large and errors end up in logs.
const maxQuotedValue = 80

// ParseTrigger parses the value of the networking.k8s.aws/last-change-trigger-time
// annotation: RFC3339Nano (fractional seconds optional, so plain RFC3339 is
// accepted too), any UTC offset. The time must fit int64 Unix nanoseconds
// (years 1678 to 2262), the set's internal representation. The error quotes
// the value (its first 80 bytes) and wraps ErrInvalidTrigger.
func ParseTrigger(value string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, value)
	if err != nil {
		return time.Time{}, fmt.Errorf("parse trigger time %s: %w: want RFC3339, e.g. %q",
			quoteValue(value), ErrInvalidTrigger, "2006-01-02T15:04:05.999999999Z")
	}
	if _, ok := unixNano(t); !ok {
		return time.Time{}, fmt.Errorf("parse trigger time %s: %w: outside years 1678 to 2262",
			quoteValue(value), ErrInvalidTrigger)
	}
	return t, nil
}

func quoteValue(v string) string {
	if len(v) <= maxQuotedValue {
		return fmt.Sprintf("%q", v)
	}
	return fmt.Sprintf("%q...", v[:maxQuotedValue])
}

// noTime marks "nothing consumed" and "no ahead commit". It is the one int64
// value unixNano never returns.
const noTime int64 = math.MinInt64

var (
	minNano = time.Unix(0, math.MinInt64+1)
	maxNano = time.Unix(0, math.MaxInt64)
)

const (
	minNanoSec = math.MinInt64/int64(time.Second) + 1
	maxNanoSec = math.MaxInt64/int64(time.Second) - 1
)

// unixNano converts t to Unix nanoseconds, reporting false when t (the zero
// time, for one) does not fit or would collide with noTime.
func unixNano(t time.Time) (int64, bool) {
	// Inlined fast path for the years 1679 to 2261; the exact bounds only
	// matter at the edges.
	if sec := t.Unix(); sec > minNanoSec && sec < maxNanoSec {
		return t.UnixNano(), true
	}
	return unixNanoEdge(t)
}

func unixNanoEdge(t time.Time) (int64, bool) {
	if t.Before(minNano) || t.After(maxNano) {
		return 0, false
	}
	return t.UnixNano(), true
}

// timeOf converts Unix nanoseconds back to a UTC time.
func timeOf(n int64) time.Time { return time.Unix(0, n).UTC() }
