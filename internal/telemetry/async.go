package telemetry

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/npagent/npagent/internal/report"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// spanJob is one kept trigger waiting for the builder goroutine: a copy of its
// record (the caller may reuse the record and its attempts slice once Report
// returns) and its commit time. A job with flushed set is a flush marker instead: the builder closes it
// once every job and measurement queued before it is done.
type spanJob struct {
	rec      report.Record
	attempts [4]report.Attempt // inline storage for rec.Attempts, so a copy allocates nothing in the common case
	commit   time.Time
	parent   trace.SpanContext // remote parent from a valid traceparent, else zero (set by the builder)
	flushed  chan struct{}
}

var jobPool = sync.Pool{New: func() any { return new(spanJob) }}

// newJob copies r into a pooled job.
func newJob(r *report.Record, commit time.Time) *spanJob {
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
// is no builder (OTEL_TRACES_SAMPLER set, or Shutdown has begun), it records it
// here, so no point is ever lost.
func (t *Telemetry) deferRecord(h metric.Float64Histogram, attrs *measureOptions, v float64) {
	m := measurement{hist: h, attrs: attrs, value: v}
	if !enqueue(t, t.points, m) {
		m.record()
	}
}

// enqueue hands v to the builder through queue without ever blocking, kicking
// the builder when the queue reaches kickAt. It returns false when v was not
// queued: the queue is full, there is no builder (a nil queue), or Shutdown has
// begun.
func enqueue[T any](t *Telemetry, queue chan T, v T) bool {
	if !t.admit() {
		return false
	}
	defer t.admitted()
	select {
	case queue <- v:
		if len(queue) >= t.kickAt {
			t.kickBuilder()
		}
		return true
	default:
		return false
	}
}

func (m measurement) record() { m.hist.Record(context.Background(), m.value, m.attrs.rec...) }

// recordPoints records every queued measurement.
func (t *Telemetry) recordPoints() {
	for {
		select {
		case m := <-t.points:
			m.record()
		default:
			return
		}
	}
}

// admit registers a caller about to queue work for the builder and returns
// true, unless Shutdown has begun. Every true must be followed by admitted once
// the send is done: stopBuilds waits for the callers it admitted, so nothing is
// queued after its final drain and lost.
func (t *Telemetry) admit() bool {
	t.queuing.Add(1)
	if t.closing.Load() {
		t.queuing.Add(-1)
		return false
	}
	return true
}

func (t *Telemetry) admitted() { t.queuing.Add(-1) }

// release clears what the job references so a pooled job keeps nothing alive.
func (j *spanJob) release() {
	*j = spanJob{}
	jobPool.Put(j)
}

// spanCount is how many spans the record's tree has: the root, each phase that
// is drawn, and one per attempt (what both span builders emit).
func spanCount(r *report.Record) uint64 {
	n := uint64(1 + len(r.Attempts))
	for _, p := range phasesOf(r) {
		if p.drawn() {
			n++
		}
	}
	return n
}

// phase is one of a record's child spans besides its commit attempts.
type phase struct {
	name       string
	start, end time.Time
}

// phasesOf lists the record's phases: delivery, queue and compute.
func phasesOf(r *report.Record) [3]phase {
	return [3]phase{
		{SpanDelivery, r.Trigger, r.Received},
		{SpanQueue, r.Received, r.WorkerStart},
		{SpanCompute, r.ComputeStart, r.ComputeEnd},
	}
}

// drawn reports whether the phase gets a span. One with a missing bound, or one
// that would end before it starts (controller and node clocks disagree by more
// than the delivery took), is left out rather than drawn with a made-up
// duration.
func (p phase) drawn() bool {
	return !p.start.IsZero() && !p.end.IsZero() && !p.end.Before(p.start)
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
// before the builder stops its ticker and sleeps on the queues themselves: an
// agent with no policy changes should not wake 50 times a second. The first
// record or point after a quiet spell then wakes it (one wake-up, rare by
// definition) and the ticker takes over again.
const idleTicksBeforeParking = 50

// runBuilder builds the queued jobs, in order, every buildInterval and whenever
// kicked (a flush, a queue reaching kickAt), until stop is closed. It is the
// only goroutine that emits spans in asynchronous mode.
func (t *Telemetry) runBuilder() {
	defer close(t.builderDone)
	tick := time.NewTicker(buildInterval)
	defer tick.Stop()
	idle := 0
	for {
		if idle >= idleTicksBeforeParking {
			tick.Stop()
			t.parked.Store(true)
			select {
			case j := <-t.builds:
				t.handleJob(j)
			case m := <-t.points:
				m.record()
			case <-t.kick:
			case <-t.stopBuilder:
				t.parked.Store(false)
				return
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
		if t.buildQueued(t.stopBuilder) == 0 {
			idle++
		} else {
			idle = 0
		}
	}
}

// buildQueued records the queued measurements and builds the queued jobs until
// both queues are empty, or stop is closed, and returns how many it took.
func (t *Telemetry) buildQueued(stop <-chan struct{}) int {
	n := 0
	for {
		select {
		case <-stop:
			return n
		default:
		}
		select {
		case m := <-t.points:
			m.record()
		case j := <-t.builds:
			t.handleJob(j)
		default:
			return n
		}
		n++
	}
}

// handleJob builds a job, or closes a flush marker once the measurements queued
// before it are recorded too.
func (t *Telemetry) handleJob(j *spanJob) {
	if j.flushed != nil {
		t.recordPoints()
		close(j.flushed)
		return
	}
	t.buildJob(j)
	j.release()
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
// exemplar naming the root (when a span queue took the tree). The root takes the remote parent's trace id (and
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
		TraceFlags: j.parent.TraceFlags() | trace.FlagsSampled, // as the SDK's sampler result does
		TraceState: j.parent.TraceState(),
	})
	ctx := context.Background()
	if t.finished.emit(t.nodeAttr, j, root) {
		ctx = trace.ContextWithSpanContext(ctx, root)
	} // else no span queue took the tree: no exemplar may name it
	t.latency.Record(ctx, j.commit.Sub(r.Trigger).Seconds(), t.latencySets[r.Kind].rec...)
}

// drainBuilds waits until every job queued so far is built (its spans ended and
// handed to the span processors), or ctx is done. After the builder has stopped
// there is nothing to wait for.
func (t *Telemetry) drainBuilds(ctx context.Context) error {
	if t.builds == nil || t.builderStopped.Load() {
		return nil
	}
	marker := &spanJob{flushed: make(chan struct{})}
	t.kickBuilder() // a full queue empties sooner
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

// stopBuilds stops admitting work, waits for the callers already admitted
// (their sends never block, so the wait is short), drains the queues and stops
// the builder; Report builds no spans afterwards. If ctx ends before the drain
// does, the builder stops after the job in hand and what is still queued is
// abandoned with nothing lost uncounted: points recorded without exemplar,
// spans counted as dropped. Either way the builder has stopped when it returns,
// so nothing reaches the span processors after Shutdown stops them. Safe to
// call more than once.
func (t *Telemetry) stopBuilds(ctx context.Context) error {
	if t.builds == nil || !t.closing.CompareAndSwap(false, true) {
		return nil
	}
	for t.queuing.Load() != 0 {
		runtime.Gosched() // an admitted caller is between its check and its send
	}
	err := t.drainBuilds(ctx)
	close(t.stopBuilder)
	<-t.builderDone // prompt: the builder checks stopBuilder between jobs
	if err == nil {
		t.buildQueued(nil) // flush markers of concurrent ForceFlush calls
	} else {
		t.abandonQueued()
	}
	t.builderStopped.Store(true)
	return err
}

// abandonQueued empties the queues without building: each point is recorded
// (a traced record's without exemplar), each tree's spans counted as dropped,
// each flush marker closed.
func (t *Telemetry) abandonQueued() {
	for {
		select {
		case m := <-t.points:
			m.record()
		case j := <-t.builds:
			if j.flushed != nil {
				close(j.flushed)
				continue
			}
			t.spansDropped.Add(spanCount(&j.rec) * uint64(t.spanExporters))
			t.latency.Record(context.Background(), j.commit.Sub(j.rec.Trigger).Seconds(), t.latencySets[j.rec.Kind].rec...)
			j.release()
		default:
			return
		}
	}
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
