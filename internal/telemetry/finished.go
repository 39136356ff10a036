package telemetry

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// finishedSpans emits span trees as finished spans, straight to the span
// processors, for the builder goroutine.
//
// Why not the tracer: npagent traces after the commit, so every timestamp of a
// tree is known before its first span exists. The SDK's live-span machinery — a
// recordingSpan with its mutex and event queues, a context per span, a snapshot
// copy and an attribute de-duplication map at End — is then pure overhead: it was
// about 90 % of the whole per-trigger cost (profile of BenchmarkReportAndBuild),
// and on a 2-core node that CPU is taken from the reconcile. A finished span is
// one allocation. tracetest.SpanStub.Snapshot is the SDK's public constructor of
// a sdktrace.ReadOnlySpan; the batch span processors and exporters downstream
// are the SDK's, unchanged.
//
// What the tracer would add is added here: the provider's resource and this
// package's instrumentation scope; the sampling decision (this path runs only
// with the AlwaysSample sampler, see buildTracing); the span limits the SDK reads
// from OTEL_SPAN_* and OTEL_ATTRIBUTE_* (limitAttrs); and the order in which
// spans end (children first, the root last, with its child count).
// TestFinishedSpansMatchTheTracer holds the two paths to the same output.
type finishedSpans struct {
	gates    []*spanGate             // one per exporter: bounded queue, then batch span processor
	tree     []sdktrace.ReadOnlySpan // the tree being emitted (only the builder calls emit)
	resource *resource.Resource
	scope    instrumentation.Scope
	limits   sdktrace.SpanLimits
	// attemptAttrs[i] is the attribute list of attempt i+1's commit span,
	// built once and shared read-only by every such span.
	attemptAttrs [][]attribute.KeyValue
	attemptDrops []int
}

func newFinishedSpans(gates []*spanGate, res *resource.Resource, limits sdktrace.SpanLimits) *finishedSpans {
	f := &finishedSpans{
		gates:    gates,
		resource: res,
		scope:    instrumentation.Scope{Name: ScopeName},
		limits:   limits,
	}
	for i := range maxSharedAttempts {
		attrs, dropped := f.limitAttrs([]attribute.KeyValue{AttemptKey.Int(i + 1)}, limits.AttributeCountLimit)
		f.attemptAttrs = append(f.attemptAttrs, attrs)
		f.attemptDrops = append(f.attemptDrops, dropped)
	}
	return f
}

// maxSharedAttempts is how many attempt numbers get a prebuilt attribute list;
// later attempts (rare: each follows a failed commit) build their own.
const maxSharedAttempts = 8

// emit ends the job's tree: delivery, queue and compute (each when both its
// bounds are known and in order), one commit span per attempt, then the root,
// which takes the span context root and, when the traceparent was valid, the
// job's remote parent.
//
// The tree goes to each span queue whole or not at all (spanGate.offer), so a
// queue near its limit never exports children without their root. emit reports
// whether any queue took it: only then may an exemplar name the root.
func (f *finishedSpans) emit(nodeAttr attribute.KeyValue, j *spanJob, root trace.SpanContext) bool {
	r := &j.rec
	tree := f.tree[:0]
	children := 0
	for _, p := range phasesOf(r) {
		if !p.drawn() {
			continue
		}
		tree = append(tree, f.end(tracetest.SpanStub{Name: p.name, StartTime: p.start, EndTime: p.end}, root))
		children++
	}
	for i, a := range r.Attempts {
		s := tracetest.SpanStub{Name: SpanCommit, StartTime: a.Start, EndTime: a.End}
		if i < len(f.attemptAttrs) {
			s.Attributes, s.DroppedAttributes = f.attemptAttrs[i], f.attemptDrops[i]
		} else {
			s.Attributes, s.DroppedAttributes = f.limitAttrs([]attribute.KeyValue{AttemptKey.Int(i + 1)}, f.limits.AttributeCountLimit)
		}
		if a.Err != "" {
			s.Status = sdktrace.Status{Code: codes.Error, Description: a.Err}
			// One event with one attribute: only a limit of 0 drops anything. The
			// SDK does not cut event attribute values to the length limit.
			ev := sdktrace.Event{Name: "exception", Time: a.End}
			if f.limits.AttributePerEventCountLimit == 0 {
				ev.DroppedAttributeCount = 1
			} else {
				ev.Attributes = []attribute.KeyValue{semconv.ExceptionMessage(a.Err)}
			}
			if f.limits.EventCountLimit == 0 {
				s.DroppedEvents = 1
			} else {
				s.Events = []sdktrace.Event{ev}
			}
		}
		tree = append(tree, f.end(s, root))
		children++
	}

	attrs := rootAttributes(make([]attribute.KeyValue, 0, rootAttrCap), nodeAttr, r)
	s := tracetest.SpanStub{
		Name: SpanProgram, SpanContext: root, Parent: j.parent,
		StartTime: r.Trigger, EndTime: j.commit, ChildSpanCount: children,
	}
	s.Attributes, s.DroppedAttributes = f.limitAttrs(attrs, f.limits.AttributeCountLimit)
	tree = append(tree, f.end(s, trace.SpanContext{}))

	taken := false
	for _, g := range f.gates {
		if g.offer(tree) {
			taken = true
		}
	}
	clear(tree) // the queues hold the spans themselves, not this slice
	f.tree = tree[:0]
	return taken
}

// end completes s as a span of the tracer's: under parent (a root passes the
// zero context, which leaves the stub's own Parent and SpanContext in place),
// with a new span id, the resource and the scope.
func (f *finishedSpans) end(s tracetest.SpanStub, parent trace.SpanContext) sdktrace.ReadOnlySpan {
	if parent.IsValid() {
		s.Parent = parent
		s.SpanContext = parent.WithSpanID(newSpanID()).WithRemote(false)
	}
	s.SpanKind = trace.SpanKindInternal
	s.Resource, s.InstrumentationScope = f.resource, f.scope
	return s.Snapshot()
}

// limitAttrs applies the SDK's span limits as its recordingSpan does: at most
// countLimit attributes (negative: no limit), the rest dropped and counted, and
// string values cut to AttributeValueLengthLimit characters. With the default
// limits it returns attrs unchanged.
func (f *finishedSpans) limitAttrs(attrs []attribute.KeyValue, countLimit int) ([]attribute.KeyValue, int) {
	dropped := 0
	if countLimit >= 0 && len(attrs) > countLimit {
		dropped = len(attrs) - countLimit
		attrs = attrs[:countLimit]
	}
	if n := f.limits.AttributeValueLengthLimit; n >= 0 {
		for i, a := range attrs {
			attrs[i] = truncateString(a, n)
		}
	}
	return attrs, dropped
}

// truncateString cuts a string attribute's value to at most limit characters
// (runes), on a character boundary.
func truncateString(a attribute.KeyValue, limit int) attribute.KeyValue {
	if a.Value.Type() != attribute.STRING {
		return a
	}
	s := a.Value.AsString()
	if len(s) <= limit { // no more bytes than the limit: no more characters either
		return a
	}
	n := 0
	for i := range s {
		if n == limit {
			return a.Key.String(s[:i])
		}
		n++
	}
	return a
}
