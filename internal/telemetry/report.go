package telemetry

import (
	"context"
	"sync"
	"time"

	"github.com/npagent/npagent/internal/report"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Span names.
const (
	SpanProgram  = "policy.program" // root: trigger → commit
	SpanDelivery = "delivery"       // trigger → informer event received
	SpanQueue    = "queue"          // received → worker start
	SpanCompute  = "compute"        // deriving per-pod rules
	SpanCommit   = "commit"         // one per dataplane commit attempt
)

// Span attribute keys beyond the semantic conventions (which have none for a
// custom resource's name, uid or resourceVersion).
const (
	PolicyNameKey            = attribute.Key("npagent.policy.name")
	PolicyUIDKey             = attribute.Key("npagent.policy.uid")
	PolicyRefKey             = attribute.Key("npagent.policy.ref")
	PolicyResourceVersionKey = attribute.Key("npagent.policy.resource_version")
	TriggerTimeKey           = attribute.Key("npagent.policy.trigger_time")
	AttemptsKey              = attribute.Key("npagent.commit.attempts")
	AttemptKey               = attribute.Key("npagent.commit.attempt")
	PodsKey                  = attribute.Key("npagent.commit.pods")
	EntriesKey               = attribute.Key("npagent.commit.map_entries")
)

// Reject reasons: indexes of the reason values of Telemetry.rejected
// ("clock_skew", "no_commit").
const (
	rejectClockSkew = iota
	rejectNoCommit
)

const (
	outcomeSuccess = "success"
	outcomeFailure = "failure"
)

var traceContext = propagation.TraceContext{}

// Report turns one record into a span tree and one histogram observation whose
// exemplar names the root span (when the tree can reach an exporter: see the
// package doc). It never blocks on export. A record whose commit
// precedes its trigger (clock skew) yields neither and is counted; so is one
// without a commit attempt or trigger time.
//
// On the reconcile path it only decides sampling and copies the record into the
// builder's queue (a traced trigger) or the point into the measurement queue;
// the builder goroutine parses the traceparent, chooses the ids, emits the tree
// and records the point with its exemplar. When OTEL_TRACES_SAMPLER is set,
// Report does it all itself (reportThroughTracer).
func (t *Telemetry) Report(r *report.Record) {
	if int(r.Kind) >= report.NumKinds {
		return // not a kind the loop hands over: nothing to attribute it to
	}
	commit := r.Committed()
	if commit.IsZero() || r.Trigger.IsZero() {
		t.rejected.add(r.Kind, rejectNoCommit)
		return
	}
	latency := commit.Sub(r.Trigger)
	if latency < 0 {
		t.rejected.add(r.Kind, rejectClockSkew)
		return
	}
	if t.builds == nil {
		t.reportThroughTracer(r, commit, latency)
		return
	}
	if t.keep(latency) {
		j := newJob(r, commit)
		if enqueue(t, t.builds, j) {
			return
		}
		j.release()
		// Queue full, or Shutdown has begun: the tree is dropped and its spans
		// counted as a full span queue would count them; the point is still
		// recorded, with no exemplar, so none names a trace that will not arrive.
		t.spansDropped.Add(spanCount(r) * uint64(t.spanExporters))
	}
	if r.TraceParent != "" {
		t.remoteParent(r) // counts an invalid one
	}
	t.deferRecord(t.latency, t.latencySets[r.Kind], latency.Seconds())
}

// reportThroughTracer is Report when OTEL_TRACES_SAMPLER is set: the tree goes
// through the tracer, whose sampler decides, and the point is recorded here, with
// the root span's context when the sampler kept it, so that it carries an
// exemplar naming it; else with a context holding no span at all, so the
// histogram still counts it and no exemplar points at a trace that was discarded.
func (t *Telemetry) reportThroughTracer(r *report.Record, commit time.Time, latency time.Duration) {
	bg := context.Background()
	parent := bg
	if r.TraceParent != "" {
		if psc := t.remoteParent(r); psc.IsValid() {
			parent = trace.ContextWithRemoteSpanContext(bg, psc)
		}
	}
	pointCtx := bg
	if t.keep(latency) {
		sc := scratchPool.Get().(*spanScratch)
		if rootCtx := t.spanTree(parent, sc, r, commit); trace.SpanContextFromContext(rootCtx).IsSampled() {
			pointCtx = rootCtx
		}
		sc.release()
	}
	t.latency.Record(pointCtx, latency.Seconds(), t.latencySets[r.Kind].rec...)
}

// remoteParent parses the record's traceparent annotation, counting it when it
// is invalid; the zero SpanContext means none.
func (t *Telemetry) remoteParent(r *report.Record) trace.SpanContext {
	carrier := traceparentCarrier(r.TraceParent)
	psc := trace.SpanContextFromContext(traceContext.Extract(context.Background(), &carrier))
	if !psc.IsValid() {
		t.traceparentInvalid.add(r.Kind, 0)
		return trace.SpanContext{}
	}
	return psc
}

// keep decides whether a trigger of this latency is traced: always when at least
// the slow threshold, else for fastFraction of the fast ones, systematically (the
// n-th fast trigger is kept when floor(n·f) steps up), which keeps exactly that
// fraction without a random source.
func (t *Telemetry) keep(latency time.Duration) bool {
	if t.spanExporters == 0 {
		return false // no trace would leave the process: no tree, and no exemplar naming one
	}
	f := t.cfg.fastFraction
	if f >= 1 || latency >= t.cfg.slowThreshold {
		return true
	}
	if f <= 0 {
		return false
	}
	n := t.fastSeen.Add(1)
	return uint64(float64(n)*f) > uint64(float64(n-1)*f)
}

// spanTree emits the root span and its children through the tracer, all already
// ended with the record's timestamps, and returns the root span's context. Report
// uses it only when OTEL_TRACES_SAMPLER is set (the SDK's sampler must decide
// before the exemplar is recorded); otherwise the builder emits the same tree as
// finished spans (finishedSpans), which costs a fraction of this.
//
// The SDK's span machinery (a recordingSpan, its context and its snapshot per
// span) is most of the cost and is left as it is; what is trimmed here is what
// Report adds around it. Option and attribute slices come from a pooled scratch
// (through the Tracer interface a variadic slice always escapes, so each call
// would otherwise allocate one); each distinct timestamp is boxed into an option
// once and shared by the span it ends and the one it starts; and attributes are
// set on the started span directly rather than through WithAttributes, which
// would copy them twice more (into the option, then into the start config). A
// sampler therefore sees no attributes at start; none of those
// OTEL_TRACES_SAMPLER can name reads them, and Report's own sampling decision
// is taken before the span exists.
// The SDK copies what it keeps, so nothing of the scratch outlives the call.
func (t *Telemetry) spanTree(parent context.Context, sc *spanScratch, r *report.Record, commit time.Time) context.Context {
	attrs := rootAttributes(sc.attrs[:0], t.nodeAttr, r)
	sc.attrs = attrs

	ctx, root := t.tracer.Start(parent, SpanProgram, sc.start(r.Trigger)...)
	root.SetAttributes(attrs...)
	childCtx := trace.ContextWithSpan(context.Background(), root)

	for _, p := range phasesOf(r) {
		if p.drawn() {
			_, span := t.tracer.Start(childCtx, p.name, sc.start(p.start)...)
			span.End(sc.end(p.end)...)
		}
	}
	for i, a := range r.Attempts {
		_, span := t.tracer.Start(childCtx, SpanCommit, sc.start(a.Start)...)
		sc.attempt[0] = AttemptKey.Int(i + 1)
		span.SetAttributes(sc.attempt[:]...)
		if a.Err != "" {
			span.SetStatus(codes.Error, a.Err)
			span.AddEvent("exception", trace.WithTimestamp(a.End),
				trace.WithAttributes(semconv.ExceptionMessage(a.Err)))
		}
		span.End(sc.end(a.End)...)
	}
	root.End(sc.end(commit)...)
	return ctx
}

// rootAttributes appends the root span's attributes for r to dst: the node,
// the object (namespace when namespaced, kind, name, uid, the policy it came
// from), the version and trigger time, and what the commit did.
func rootAttributes(dst []attribute.KeyValue, node attribute.KeyValue, r *report.Record) []attribute.KeyValue {
	if node.Valid() {
		dst = append(dst, node)
	}
	if r.Namespace != "" {
		dst = append(dst, semconv.K8SNamespaceName(r.Namespace))
	}
	dst = append(dst, KindKey.String(r.Kind.String()), PolicyNameKey.String(r.Name), PolicyUIDKey.String(r.UID))
	if r.PolicyRef != "" {
		dst = append(dst, PolicyRefKey.String(r.PolicyRef))
	}
	return append(dst,
		PolicyResourceVersionKey.String(r.ResourceVersion),
		TriggerTimeKey.String(r.Trigger.UTC().Format(time.RFC3339Nano)),
		AttemptsKey.Int(len(r.Attempts)),
		PodsKey.Int(r.Pods),
		EntriesKey.Int(r.Entries),
	)
}

// spanScratch holds what one spanTree hands to the tracer (the tracer path),
// reused across calls through scratchPool.
type spanScratch struct {
	attrs     []attribute.KeyValue
	attempt   [1]attribute.KeyValue
	startOpts [1]trace.SpanStartOption
	endOpts   [1]trace.SpanEndOption
	// stamps memoises the timestamp options of this call: a record's phases
	// share their bounds (delivery ends when queue starts, the root starts with
	// delivery and ends with the last attempt), and each WithTimestamp boxes its
	// time on the heap.
	stamps [8]stampOption
	nStamp int
}

type stampOption struct {
	at  time.Time
	opt trace.SpanEventOption
}

// rootAttrCap is the most attributes spanTree sets on a root span.
const rootAttrCap = 12

var scratchPool = sync.Pool{New: func() any {
	return &spanScratch{attrs: make([]attribute.KeyValue, 0, rootAttrCap)}
}}

// stamp returns the timestamp option for at, boxing it only the first time
// this call asks for that exact time (== compares wall clock, monotonic reading
// and location, so a shared option carries exactly what a fresh one would).
func (sc *spanScratch) stamp(at time.Time) trace.SpanEventOption {
	for i := range sc.nStamp {
		if sc.stamps[i].at == at {
			return sc.stamps[i].opt
		}
	}
	opt := trace.WithTimestamp(at)
	if sc.nStamp < len(sc.stamps) {
		sc.stamps[sc.nStamp] = stampOption{at: at, opt: opt}
		sc.nStamp++
	}
	return opt
}

func (sc *spanScratch) start(at time.Time) []trace.SpanStartOption {
	sc.startOpts[0] = sc.stamp(at)
	return sc.startOpts[:]
}

func (sc *spanScratch) end(at time.Time) []trace.SpanEndOption {
	sc.endOpts[0] = sc.stamp(at)
	return sc.endOpts[:]
}

// release clears what the scratch references (record strings, boxed options)
// so a pooled scratch keeps nothing alive, and returns it to the pool.
func (sc *spanScratch) release() {
	clear(sc.attrs[:cap(sc.attrs)])
	sc.attrs = sc.attrs[:0]
	sc.attempt = [1]attribute.KeyValue{}
	sc.startOpts = [1]trace.SpanStartOption{}
	sc.endOpts = [1]trace.SpanEndOption{}
	sc.stamps = [8]stampOption{}
	sc.nStamp = 0
	scratchPool.Put(sc)
}

// traceparentCarrier exposes one annotation value as the "traceparent" header to
// propagation.TraceContext, without building a map per record.
type traceparentCarrier string

func (c traceparentCarrier) Get(key string) string {
	if key == "traceparent" {
		return string(c)
	}
	return ""
}
func (traceparentCarrier) Set(string, string) {}
func (traceparentCarrier) Keys() []string     { return []string{"traceparent"} }

// Committed records one dataplane commit attempt's duration and outcome (the
// duration through the measurement queue, like a point of Report's).
func (t *Telemetry) Committed(k report.Kind, a *report.Attempt) {
	if int(k) >= report.NumKinds {
		return
	}
	outcome := 0
	if a.Err != "" {
		outcome = 1
		t.commitFailures.add(k, 0)
	}
	t.deferRecord(t.commitDuration, t.commitSets[outcome][k], a.Duration().Seconds())
}
