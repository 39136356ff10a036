package telemetry

import (
	"context"
	"time"

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

const (
	rejectClockSkew = "clock_skew"
	rejectNoCommit  = "no_commit"
	outcomeSuccess  = "success"
	outcomeFailure  = "failure"
)

var traceContext = propagation.TraceContext{}

// Report turns one record into a span tree and one histogram observation whose
// exemplar names the root span. It never blocks on export. A record whose commit
// precedes its trigger (clock skew) yields neither and is counted; so is one
// without a commit attempt or trigger time.
func (t *Telemetry) Report(r *Record) {
	bg := context.Background()
	commit := r.Committed()
	if commit.IsZero() || r.Trigger.IsZero() {
		t.rejected.Add(bg, 1, t.rejectedAttrs.get(r.Kind, rejectNoCommit).add...)
		return
	}
	latency := commit.Sub(r.Trigger)
	if latency < 0 {
		t.rejected.Add(bg, 1, t.rejectedAttrs.get(r.Kind, rejectClockSkew).add...)
		return
	}
	parent := bg
	if r.TraceParent != "" {
		parent = traceContext.Extract(bg, traceparentCarrier(r.TraceParent))
		if !trace.SpanContextFromContext(parent).IsValid() {
			t.traceparentInvalid.Add(bg, 1, t.kindAttrs.get(r.Kind, "").add...)
		}
	}
	// The point is recorded with the root span's context when the trace is kept,
	// so it carries an exemplar naming it; for a trace not kept, with a context
	// holding no span at all, so the histogram still counts it and no exemplar
	// points at a trace that was discarded.
	pointCtx := bg
	if t.keep(latency) {
		if rootCtx := t.spanTree(parent, r, commit); trace.SpanContextFromContext(rootCtx).IsSampled() {
			pointCtx = rootCtx
		}
	}
	t.latency.Record(pointCtx, latency.Seconds(), t.kindAttrs.get(r.Kind, "").rec...)
}

// keep decides whether a trigger of this latency is traced: always when at least
// the slow threshold, else for fastFraction of the fast ones, systematically (the
// n-th fast trigger is kept when floor(n·f) steps up), which keeps exactly that
// fraction without a random source.
func (t *Telemetry) keep(latency time.Duration) bool {
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

// spanTree emits the root span and its children, all already ended with the
// record's timestamps, and returns the root span's context.
func (t *Telemetry) spanTree(parent context.Context, r *Record, commit time.Time) context.Context {
	attrs := make([]attribute.KeyValue, 0, 12)
	if t.nodeAttr.Valid() {
		attrs = append(attrs, t.nodeAttr)
	}
	if r.Namespace != "" {
		attrs = append(attrs, semconv.K8SNamespaceName(r.Namespace))
	}
	attrs = append(attrs,
		KindKey.String(r.Kind),
		PolicyNameKey.String(r.Name),
		PolicyUIDKey.String(r.UID),
	)
	if r.PolicyRef != "" {
		attrs = append(attrs, PolicyRefKey.String(r.PolicyRef))
	}
	attrs = append(attrs,
		PolicyResourceVersionKey.String(r.ResourceVersion),
		TriggerTimeKey.String(r.Trigger.UTC().Format(time.RFC3339Nano)),
		AttemptsKey.Int(len(r.Attempts)),
		PodsKey.Int(r.Pods),
		EntriesKey.Int(r.Entries),
	)
	ctx, root := t.tracer.Start(parent, SpanProgram,
		trace.WithTimestamp(r.Trigger), trace.WithAttributes(attrs...))

	t.child(ctx, SpanDelivery, r.Trigger, r.Received)
	t.child(ctx, SpanQueue, r.Received, r.WorkerStart)
	t.child(ctx, SpanCompute, r.ComputeStart, r.ComputeEnd)
	for i, a := range r.Attempts {
		_, span := t.tracer.Start(ctx, SpanCommit, trace.WithTimestamp(a.Start),
			trace.WithAttributes(AttemptKey.Int(i+1)))
		if a.Err != "" {
			span.SetStatus(codes.Error, a.Err)
			span.AddEvent("exception", trace.WithTimestamp(a.End),
				trace.WithAttributes(semconv.ExceptionMessage(a.Err)))
		}
		span.End(trace.WithTimestamp(a.End))
	}
	root.End(trace.WithTimestamp(commit))
	return ctx
}

// child emits one phase span. A phase with a missing bound, or one that would end
// before it starts (controller and node clocks disagree by more than the
// delivery took), is left out rather than drawn with a made-up duration.
func (t *Telemetry) child(ctx context.Context, name string, start, end time.Time) {
	if start.IsZero() || end.IsZero() || end.Before(start) {
		return
	}
	_, span := t.tracer.Start(ctx, name, trace.WithTimestamp(start))
	span.End(trace.WithTimestamp(end))
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

// Suppressed counts a suppressed observation: reason is the seen-set's reason
// name ("redelivered", "stale", ...), kind the policy kind. Allocates nothing.
func (t *Telemetry) Suppressed(kind, reason string) {
	t.suppressed.Add(context.Background(), 1, t.suppressedAttrs.get(kind, reason).add...)
}

// Delivered counts an informer delivery by cause: "resync", "relist", "update",
// "add", "requeue". Allocates nothing.
func (t *Telemetry) Delivered(kind, cause string) {
	t.deliveries.Add(context.Background(), 1, t.deliveryAttrs.get(kind, cause).add...)
}

// CommitDone records one dataplane commit attempt's duration and outcome.
func (t *Telemetry) CommitDone(kind string, d time.Duration, err error) {
	bg := context.Background()
	outcome := outcomeSuccess
	if err != nil {
		outcome = outcomeFailure
		t.commitFailures.Add(bg, 1, t.kindAttrs.get(kind, "").add...)
	}
	t.commitDuration.Record(bg, d.Seconds(), t.commitAttrs.get(kind, outcome).rec...)
}

// InvalidObject counts an object rejected for bad input; field names the field
// (for example "spec.podSelector").
func (t *Telemetry) InvalidObject(kind, field string) {
	t.invalidObjects.Add(context.Background(), 1, t.invalidAttrs.get(kind, field).add...)
}
