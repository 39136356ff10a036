package telemetry

import (
	"context"
	"math"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/exemplar"
	"go.opentelemetry.io/otel/trace"
)

// The exemplar mark: the latency histogram's exemplars come from markReservoir,
// which tells the drawing code, through the root span's context, whether it kept
// the measurement; the root span is marked (ExemplarKey) before it ends only if
// it did. So the marked roots are a superset of the traces any exported exemplar
// names, and a bounded set: a tail-sampling tier that keeps every marked trace
// keeps every trace an exemplar points to, and keeps at most
// markSlots × kinds × metric readers extra traces per collection interval.
//
// Why not the SDK's reservoir: its FixedSizeReservoir keeps the first 20
// sampled measurements and then replaces them at random, and says nothing to the
// caller, so the only safe mark is "every sampled root" — a tail sampler
// honouring it would keep every trace and sample nothing.
//
// How the SDK calls it (go.opentelemetry.io/otel/sdk/metric v1.47.0,
// internal/aggregate): Histogram.Record → expoHistogram.measure offers the
// measurement to the attribute set's reservoir synchronously, under the
// aggregation's lock, after the exemplar filter (trace-based by default: only a
// context holding a sampled span reaches Offer); each metric reader has its own
// pipeline and so its own reservoir, each offered the same context. Collect runs
// under the same lock at each collection of that reader.

// markSlots is the exemplars a latency point holds, one per octave of latency
// (the SDK's default for an exponential histogram is min(20, MaxSize) too).
const markSlots = 20

// markMinExp: slot 0 holds latencies below 2^(markMinExp+1) s (~0.24 ms, and
// zero), slot markSlots-1 those of 2^(markMinExp+markSlots) s (64 s) and above;
// the slots between are one octave each.
const markMinExp = -13

// markSlot is the slot of a latency of v seconds: its octave, clamped.
func markSlot(v float64) int {
	if !(v > 0) || math.IsInf(v, 0) {
		return 0
	}
	_, e := math.Frexp(v) // v = f·2^e, f in [0.5, 1): floor(log2 v) = e-1
	return min(max(e-1-markMinExp, 0), markSlots-1)
}

// markReservoirProvider gives each attribute set of the latency histogram its
// own markReservoir.
func markReservoirProvider(attribute.Set) exemplar.Reservoir { return &markReservoir{} }

// markReservoir keeps, per collection interval, the first measurement offered
// in each latency octave by a root span that asked to be told (a context
// holding the span tree's gatedTree), and sets that tree's exemplar flag when
// it keeps one. A kept exemplar stays until a later interval's first
// measurement of its octave replaces it, as the SDK's reservoirs keep theirs
// across collections; every one was marked when kept.
//
// A measurement whose context has no gatedTree is never kept, whatever the
// exemplar filter let through (OTEL_METRICS_EXEMPLAR_FILTER=always_on): an
// exemplar nobody could mark would be a dead link behind a tail sampler.
type markReservoir struct {
	mu    sync.Mutex
	slots [markSlots]markedMeasurement
	taken [markSlots]bool // this interval: the slot already kept a measurement
}

type markedMeasurement struct {
	valid bool
	at    time.Time
	value exemplar.Value
	attrs []attribute.KeyValue
	sc    trace.SpanContext
}

var _ exemplar.Reservoir = (*markReservoir)(nil)

func (r *markReservoir) Offer(ctx context.Context, at time.Time, v exemplar.Value, attrs []attribute.KeyValue) {
	tree, _ := ctx.Value(gatedTreeKey{}).(*gatedTree)
	if tree == nil {
		return
	}
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsSampled() {
		return
	}
	var f float64
	switch v.Type() {
	case exemplar.Float64ValueType:
		f = v.Float64()
	case exemplar.Int64ValueType:
		f = float64(v.Int64())
	default:
		return
	}
	i := markSlot(f)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.taken[i] {
		return
	}
	r.taken[i] = true
	r.slots[i] = markedMeasurement{valid: true, at: at, value: v, attrs: attrs, sc: sc}
	tree.exemplar = true // read by spanTree on this goroutine, after Record returns
}

// Collect returns the held exemplars and starts a new interval.
func (r *markReservoir) Collect(dest *[]exemplar.Exemplar) {
	r.mu.Lock()
	defer r.mu.Unlock()
	*dest = (*dest)[:0]
	for i := range r.slots {
		m := &r.slots[i]
		if !m.valid {
			continue
		}
		tid, sid := m.sc.TraceID(), m.sc.SpanID()
		*dest = append(*dest, exemplar.Exemplar{
			FilteredAttributes: m.attrs,
			Time:               m.at,
			Value:              m.value,
			TraceID:            tid[:],
			SpanID:             sid[:],
		})
	}
	r.taken = [markSlots]bool{}
}
