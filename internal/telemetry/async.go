package telemetry

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// spanJob is one kept trigger waiting for the builder goroutine: a copy of its
// record (the caller may reuse the record and its attempts slice once Report
// returns) and its commit time. A job with flushed set is a flush marker instead: the builder closes it
// once every job and measurement queued before it is done.
type spanJob struct {
	rec      Record
	attempts [4]Attempt // inline storage for rec.Attempts, so a copy allocates nothing in the common case
	commit   time.Time
	parent   trace.SpanContext // remote parent from a valid traceparent, else zero (set by the builder)
	flushed  chan struct{}
}

var jobPool = sync.Pool{New: func() any { return new(spanJob) }}

// newJob copies r into a pooled job.
func newJob(r *Record, commit time.Time) *spanJob {
	j := jobPool.Get().(*spanJob)
	j.rec = *r
	if n := len(r.Attempts); n <= len(j.attempts) {
		j.rec.Attempts = j.attempts[:copy(j.attempts[:], r.Attempts)]
	} else {
		j.rec.Attempts = slices.Clone(r.Attempts)
	}
	j.commit = commit
	return j
}

// measurement is a histogram point with no exemplar (a trigger whose trace is
// not kept, a commit duration), recorded by the builder.
type measurement struct {
	hist  metric.Float64Histogram
	attrs *measureOptions
	value float64
}

// deferRecord hands a point to the builder; when the queue is full, or there
// is no builder (OTEL_TRACES_SAMPLER set, or after Shutdown), it records it here,
// so no point is ever lost.
func (t *Telemetry) deferRecord(h metric.Float64Histogram, attrs *measureOptions, v float64) {
	if !t.closing.Load() {
		select {
		case t.points <- measurement{hist: h, attrs: attrs, value: v}:
			if t.parked.Load() || len(t.points) >= t.kickAt {
				t.kickBuilder()
			}
			return
		default:
		}
	}
	h.Record(context.Background(), v, attrs.rec...)
}

// recordPoints records every queued measurement.
func (t *Telemetry) recordPoints() {
	for {
		select {
		case m := <-t.points:
			m.hist.Record(context.Background(), m.value, m.attrs.rec...)
		default:
			return
		}
	}
}

// release clears what the job references so a pooled job keeps nothing alive.
func (j *spanJob) release() {
	*j = spanJob{}
	jobPool.Put(j)
}

// spanCount is how many spans the job's tree has: the root, each phase with
// both bounds in order, and one per attempt (what spanTree emits).
func spanCount(r *Record) uint64 {
	n := uint64(1 + len(r.Attempts))
	for _, p := range [...][2]time.Time{
		{r.Trigger, r.Received}, {r.Received, r.WorkerStart}, {r.ComputeStart, r.ComputeEnd},
	} {
		if !p[0].IsZero() && !p[1].IsZero() && !p[1].Before(p[0]) {
			n++
		}
	}
	return n
}

// buildInterval is how often the builder wakes to build what is queued.
//
// Why a timer rather than a receive per record: a send to a parked goroutine
// readies it, which wakes an idle thread (a futex system call on the reporting
// goroutine's path), and after a tree of a few microseconds that thread spins
// looking for work before it sleeps again. Measured in the reconcile loop, that
// cost several times the tree itself. Woken on a timer, the builder takes
// everything queued at once, and a send finds no receiver waiting, so Report
// only copies into the channel's buffer. The delay is invisible downstream: the
// batch span processor holds spans for seconds (OTEL_BSP_SCHEDULE_DELAY).
const buildInterval = 20 * time.Millisecond

// idleTicksBeforeParking is how many ticks in a row must find nothing queued
// before the builder stops its ticker and sleeps until kicked: an agent with no
// policy changes should not wake 50 times a second. While it is parked, Report
// and deferRecord kick it, so a trigger after a quiet spell pays one wake-up
// (rare by definition) and the ticker takes over again.
const idleTicksBeforeParking = 50

// runBuilder builds the queued jobs, in order, every buildInterval and whenever
// kicked (a flush, a queue filling up, work arriving while parked), until stop
// is closed. It is the only goroutine that emits spans in asynchronous mode.
func (t *Telemetry) runBuilder() {
	defer close(t.builderDone)
	tick := time.NewTicker(buildInterval)
	defer tick.Stop()
	idle := 0
	for {
		if idle >= idleTicksBeforeParking {
			tick.Stop()
			t.parked.Store(true)
			// Work queued before parked was visible to its sender is seen here.
			if len(t.builds) == 0 && len(t.points) == 0 {
				select {
				case <-t.kick:
				case <-t.stopBuilder:
					t.parked.Store(false)
					return
				}
			}
			t.parked.Store(false)
			tick.Reset(buildInterval)
			idle = 0
		} else {
			select {
			case <-tick.C:
			case <-t.kick:
			case <-t.stopBuilder:
				return
			}
		}
		if t.buildQueued() == 0 {
			idle++
		} else {
			idle = 0
		}
	}
}

// buildQueued records the queued measurements and builds the queued jobs until
// both queues are empty, and returns how many it took. A flush marker is closed
// once the measurements queued before it are recorded too.
func (t *Telemetry) buildQueued() int {
	n := 0
	for {
		select {
		case m := <-t.points:
			m.hist.Record(context.Background(), m.value, m.attrs.rec...)
			n++
		case j := <-t.builds:
			n++
			if j.flushed != nil {
				t.recordPoints()
				close(j.flushed)
				continue
			}
			t.buildJob(j)
			j.release()
		default:
			return n
		}
	}
}

// kickBuilder wakes the builder now rather than at its next tick; it never
// blocks (one pending kick is enough).
func (t *Telemetry) kickBuilder() {
	select {
	case t.kick <- struct{}{}:
	default:
	}
}

// buildJob emits one job's span tree, as finished spans (see finishedSpans),
// and records its point in the root span's context, so the point carries an
// exemplar naming the root. The root takes the remote parent's trace id (and
// trace state) when the traceparent is valid, else a new trace id.
func (t *Telemetry) buildJob(j *spanJob) {
	r := &j.rec
	if r.TraceParent != "" {
		j.parent = t.remoteParent(r)
	}
	traceID := j.parent.TraceID()
	if !j.parent.IsValid() {
		traceID = newTraceID()
	}
	root := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    traceID,
		SpanID:     newSpanID(),
		TraceFlags: trace.FlagsSampled,
		TraceState: j.parent.TraceState(),
	})
	t.finished.emit(t.nodeAttr, j, root)
	t.latency.Record(trace.ContextWithSpanContext(context.Background(), root),
		j.commit.Sub(r.Trigger).Seconds(), t.kindAttrs.get(r.Kind, "").rec...)
}

// drainBuilds waits until every job queued so far is built (its spans ended and
// handed to the span processors), or ctx is done. After the builder has stopped
// there is nothing to wait for.
func (t *Telemetry) drainBuilds(ctx context.Context) error {
	if t.builds == nil || t.builderStopped.Load() {
		return nil
	}
	marker := &spanJob{flushed: make(chan struct{})}
	select {
	case t.builds <- marker:
	case <-t.builderDone:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	t.kickBuilder()
	select {
	case <-marker.flushed:
		return nil
	case <-t.builderDone: // stopped by a concurrent Shutdown, which drained what it could
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// stopBuilds drains the queue and stops the builder; Report builds no spans
// afterwards. Safe to call more than once.
func (t *Telemetry) stopBuilds(ctx context.Context) error {
	if t.builds == nil || !t.closing.CompareAndSwap(false, true) {
		return nil
	}
	err := t.drainBuilds(ctx)
	close(t.stopBuilder)
	select {
	case <-t.builderDone:
		t.builderStopped.Store(true)
		t.recordPoints() // any sent between the drain and closing
	case <-ctx.Done():
		err = ctx.Err()
	}
	return err
}

// newTraceID and newSpanID draw from math/rand/v2's per-thread generator, as the
// SDK's default id generator does (these ids need to be unique, not secret): no
// lock, no allocation, never the all-zero (invalid) id.
func newTraceID() trace.TraceID {
	var id trace.TraceID
	for !id.IsValid() {
		binary.BigEndian.PutUint64(id[:8], rand.Uint64())
		binary.BigEndian.PutUint64(id[8:], rand.Uint64())
	}
	return id
}

func newSpanID() trace.SpanID {
	var id trace.SpanID
	for !id.IsValid() {
		binary.BigEndian.PutUint64(id[:], rand.Uint64())
	}
	return id
}
