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
	SpanCompute  = "compute"        // deriving the object's rules
	SpanLockWait = "lock_wait"      // an attempt's wait for the node-wide commit lock
	SpanCommit   = "commit"         // one per dataplane commit attempt
)

// ExemplarMarkAttr is the name of the boolean root-span attribute that marks a
// trace an exemplar may name (ExemplarKey), for tail-sampling policies.
const ExemplarMarkAttr = "npagent.exemplar"

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
	// LinkKindKey says what a span link points to: "served", from a commit span
	// to the writer of another trigger the same commit served.
	LinkKindKey = attribute.Key("npagent.link.kind")
	// RemovedOnlyKey (true) marks a trigger whose version's only change on this
	// node was removing pods an earlier version selected (report.Record.RemovedOnly).
	RemovedOnlyKey = attribute.Key("npagent.commit.removed_only")
	// LatencyKey is the trigger's programming latency in seconds, a start
	// attribute of the root span: the sampler decides on it.
	LatencyKey = attribute.Key("npagent.policy.programming.latency")
	// ExemplarKey (true) marks the root span of a trace whose histogram point
	// the exemplar reservoir kept as an exemplar (markReservoir), set before
	// the root ends: every exported exemplar names a marked root, and the
	// marked roots per collection interval are bounded. A tail-sampling tier
	// keeps such traces so no exemplar names a missing one. Unmarked roots
	// carry no such attribute.
	ExemplarKey = attribute.Key(ExemplarMarkAttr)
	// Commit phase attributes (seconds, on the commit span; zero ones omitted):
	// where an attempt's time under the commit lock went (report.Phases).
	PhaseMergeKey   = attribute.Key("npagent.commit.phase.merge")
	PhaseCompileKey = attribute.Key("npagent.commit.phase.compile")
	PhaseAttachKey  = attribute.Key("npagent.commit.phase.attach")
	PhaseWriteKey   = attribute.Key("npagent.commit.phase.write")
	PhaseSwitchKey  = attribute.Key("npagent.commit.phase.switch")
	PhaseCleanupKey = attribute.Key("npagent.commit.phase.cleanup")
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
// exemplar names the root span when the tree was sampled and taken by a span
// queue (see the package doc). It never blocks on export: it checks the record
// and hands a copy to the drawing goroutine (handoff). A record whose commit
// precedes its trigger (clock skew) yields neither and is counted; so is one
// without a commit attempt or trigger time.
func (t *Telemetry) Report(r *report.Record) {
	if int(r.Kind) >= report.NumKinds {
		return // not a kind the loop hands over: nothing to attribute it to
	}
	commit := r.Committed()
	if commit.IsZero() || r.Trigger.IsZero() {
		t.rejected.add(r.Kind, rejectNoCommit)
		return
	}
	if commit.Sub(r.Trigger) < 0 {
		t.rejected.add(r.Kind, rejectClockSkew)
		return
	}
	if t.handoff.offer(r) {
		return
	}
	t.draw(r) // the queue is full or closing: drawn here, nothing lost
}

// draw turns one checked record into its span tree and histogram point.
func (t *Telemetry) draw(r *report.Record) {
	commit := r.Committed()
	latency := commit.Sub(r.Trigger)
	// The writer's context (a valid traceparent annotation): by default a link
	// from a root of our own (KEP-5915), with ParentingChild the root's parent.
	parent := context.Background()
	var link trace.SpanContext
	if r.TraceParent != "" {
		if psc := t.remoteParent(r); psc.IsValid() {
			if t.cfg.parenting == ParentingChild {
				parent = trace.ContextWithRemoteSpanContext(parent, psc)
			} else {
				link = psc
			}
		}
	}
	// A sampled tree a span queue has made room for gets its point recorded in
	// the root's context, before the root ends (spanTree), so the exemplar
	// reservoir can have the root marked; any other point is recorded here
	// with no span, so no exemplar names a trace dropped or not sampled.
	if t.spanExporters > 0 && t.spanTree(parent, link, r, commit, latency) {
		return
	}
	// With no span exporter no trace would leave the process: no tree, no exemplar.
	t.latency.Record(context.Background(), latency.Seconds(), t.latencySets[r.Kind].rec...)
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

// servedLink marks a commit span's link to the writer of another trigger the same
// commit served (report.Record.Served).
var servedLink = []attribute.KeyValue{LinkKindKey.String("served")}

// linkServed links the successful commit span to the writers of the other triggers
// it served: versions coalesced into one commit are reported one trace each, and
// the links join them. Traceparents that do not parse are skipped: each trigger's
// own report counts its own.
func (t *Telemetry) linkServed(s trace.Span, r *report.Record) {
	for _, tp := range r.Served {
		carrier := traceparentCarrier(tp)
		if sc := trace.SpanContextFromContext(traceContext.Extract(context.Background(), &carrier)); sc.IsValid() {
			s.AddLink(trace.Link{SpanContext: sc, Attributes: servedLink})
		}
	}
}

// spanTree starts the root span with the latency and kind as start attributes,
// so the sampler (latencySampler) decides; when it is sampled, reserves room
// for the whole tree in the span queues (treeGate.reserve) and, when one has
// room, records the histogram point in the root's context, so the point's
// exemplar can name the root; the reservoir (markReservoir) says whether it
// kept it, and only then is the root marked (ExemplarKey). Then it draws the
// children, all ended with the record's timestamps, and ends the root, whose
// end hands the tree to the queues that made room. It reports whether it
// recorded the point.
func (t *Telemetry) spanTree(parent context.Context, link trace.SpanContext, r *report.Record, commit time.Time, latency time.Duration) bool {
	sc := scratchPool.Get().(*spanScratch)
	defer sc.release()
	tree := &sc.tree
	sc.startAttrs = append(sc.startAttrs[:0], LatencyKey.Float64(latency.Seconds()), KindKey.String(r.Kind.String()))
	ctx, root := t.tracer.Start(withGatedTree(parent, tree), SpanProgram, sc.rootStart(r.Trigger, link)...)
	if !root.SpanContext().IsSampled() {
		root.End(sc.end(commit)...) // not recorded, or recorded and never exported
		return false
	}
	recorded := false
	if t.trees.reserve(tree, treeSpans(r)) {
		// The tree will be taken (a queue made room for it, and Shutdown waits
		// for it): the point may name it. Recorded before the root ends, so a
		// kept exemplar's root is marked; Record calls the reservoir
		// synchronously, on this goroutine.
		t.latency.Record(ctx, latency.Seconds(), t.latencySets[r.Kind].rec...)
		recorded = true
	}
	// The mark first, so that tight span limits (OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT)
	// drop the object's attributes before it.
	sc.attrs = sc.attrs[:0]
	if tree.exemplar {
		sc.attrs = append(sc.attrs, ExemplarKey.Bool(true))
	}
	sc.attrs = rootAttributes(sc.attrs, t.nodeAttr, r)
	root.SetAttributes(sc.attrs...)

	spans := uint64(1)
	child := func(start time.Time, name string) trace.Span {
		_, s := t.tracer.Start(ctx, name, sc.start(start)...)
		spans++
		return s
	}
	for _, p := range phasesOf(r) {
		if p.drawn() {
			child(p.start, p.name).End(sc.end(p.end)...)
		}
	}
	for i := range r.Attempts {
		a := &r.Attempts[i]
		n := AttemptKey.Int(i + 1)
		if w := (phase{SpanLockWait, a.Requested, a.Start}); w.drawn() {
			s := child(w.start, SpanLockWait)
			sc.attrs = append(sc.attrs[:0], n)
			s.SetAttributes(sc.attrs...)
			s.End(sc.end(w.end)...)
		}
		s := child(a.Start, SpanCommit)
		sc.attrs = commitAttributes(sc.attrs[:0], n, &a.Phases)
		s.SetAttributes(sc.attrs...)
		if i == len(r.Attempts)-1 {
			t.linkServed(s, r)
		}
		if a.Err != "" {
			s.SetStatus(codes.Error, a.Err)
			s.AddEvent("exception", trace.WithTimestamp(a.End),
				trace.WithAttributes(semconv.ExceptionMessage(a.Err)))
		}
		s.End(sc.end(a.End)...)
	}
	root.End(sc.end(commit)...)
	if !tree.seen {
		// The provider was shut down while the tree was drawn (only when
		// Shutdown's context ran out before this reserved tree was drawn, or
		// nothing reserved it): its processors, and with them the queues, never
		// saw the root end.
		t.trees.release(tree)
		t.trees.forget(root.SpanContext().SpanID())
		t.spansDropped.Add(spans * uint64(t.spanExporters))
	}
	return recorded
}

// treeSpans is the number of spans spanTree draws for r when its root is
// sampled: the root, each drawn phase, and per attempt its commit and, when
// measured, its lock wait.
func treeSpans(r *report.Record) int {
	n := 1
	for _, p := range phasesOf(r) {
		if p.drawn() {
			n++
		}
	}
	for i := range r.Attempts {
		a := &r.Attempts[i]
		n++
		if (phase{SpanLockWait, a.Requested, a.Start}).drawn() {
			n++
		}
	}
	return n
}

// spanScratch holds what one spanTree hands the tracer, reused through
// scratchPool: through the Tracer interface every variadic option slice
// escapes, and each WithTimestamp boxes its time, so without it a tree would
// allocate a slice per start and end and a box per bound. The SDK copies what it
// keeps (attributes, times), so nothing of the scratch outlives the call; the
// gated tree is done with once the root has ended (the queues hold the spans).
type spanScratch struct {
	tree       gatedTree
	startAttrs []attribute.KeyValue
	attrs      []attribute.KeyValue
	rootOpts   [3]trace.SpanStartOption
	links      [1]trace.Link
	startOpts  [1]trace.SpanStartOption
	endOpts    [1]trace.SpanEndOption
	// stamps memoises this tree's timestamp options: its spans share bounds
	// (delivery ends when queue starts, the root starts with delivery and ends
	// with the last attempt).
	stamps [8]stampOption
	nStamp int
}

type stampOption struct {
	at  time.Time
	opt trace.SpanEventOption
}

var scratchPool = sync.Pool{New: func() any {
	return &spanScratch{startAttrs: make([]attribute.KeyValue, 0, 2), attrs: make([]attribute.KeyValue, 0, rootAttrCap)}
}}

// stamp returns the timestamp option for at, boxing it only the first time
// this tree asks for that exact time (== compares wall clock, monotonic reading
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

// rootStart is the root's start options: its time and start attributes (which
// the sampler reads), and a link to the writer's context when link is valid.
func (sc *spanScratch) rootStart(at time.Time, link trace.SpanContext) []trace.SpanStartOption {
	sc.rootOpts = [3]trace.SpanStartOption{sc.stamp(at), trace.WithAttributes(sc.startAttrs...)}
	if !link.IsValid() {
		return sc.rootOpts[:2]
	}
	sc.links[0] = trace.Link{SpanContext: link} // the SDK copies it: no slice of its own per root
	sc.rootOpts[2] = trace.WithLinks(sc.links[:]...)
	return sc.rootOpts[:]
}

func (sc *spanScratch) start(at time.Time) []trace.SpanStartOption {
	sc.startOpts[0] = sc.stamp(at)
	return sc.startOpts[:]
}

func (sc *spanScratch) end(at time.Time) []trace.SpanEndOption {
	sc.endOpts[0] = sc.stamp(at)
	return sc.endOpts[:]
}

// release clears what the scratch references (record strings, boxed options,
// the tree's flags) so a pooled scratch keeps nothing alive, and returns it.
func (sc *spanScratch) release() {
	clear(sc.startAttrs[:cap(sc.startAttrs)])
	clear(sc.attrs[:cap(sc.attrs)])
	sc.startAttrs, sc.attrs = sc.startAttrs[:0], sc.attrs[:0]
	sc.tree = gatedTree{spans: sc.tree.spans[:0], reserved: sc.tree.reserved[:0]}
	sc.rootOpts, sc.startOpts, sc.endOpts = [3]trace.SpanStartOption{}, [1]trace.SpanStartOption{}, [1]trace.SpanEndOption{}
	sc.stamps, sc.nStamp = [8]stampOption{}, 0
	sc.links = [1]trace.Link{}
	scratchPool.Put(sc)
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

// rootAttributes appends the root span's attributes for r to dst, beyond the
// start attributes (latency, kind): the node, the object (namespace when
// namespaced, name, uid, the policy it came from), the version and trigger
// time, and what the commit did.
func rootAttributes(dst []attribute.KeyValue, node attribute.KeyValue, r *report.Record) []attribute.KeyValue {
	if node.Valid() {
		dst = append(dst, node)
	}
	if r.Namespace != "" {
		dst = append(dst, semconv.K8SNamespaceName(r.Namespace))
	}
	dst = append(dst, PolicyNameKey.String(r.Name), PolicyUIDKey.String(r.UID))
	if r.PolicyRef != "" {
		dst = append(dst, PolicyRefKey.String(r.PolicyRef))
	}
	dst = append(dst,
		PolicyResourceVersionKey.String(r.ResourceVersion),
		TriggerTimeKey.String(r.Trigger.UTC().Format(time.RFC3339Nano)),
		AttemptsKey.Int(len(r.Attempts)),
		PodsKey.Int(r.Pods),
		EntriesKey.Int(r.Entries),
	)
	if r.RemovedOnly {
		dst = append(dst, RemovedOnlyKey.Bool(true))
	}
	return dst
}

// rootAttrCap is the most attributes spanTree sets on a root after its start:
// the mark and what rootAttributes appends.
const rootAttrCap = 12

// commitAttributes appends a commit span's attributes to dst: the attempt
// number, then each non-zero phase in seconds.
func commitAttributes(dst []attribute.KeyValue, attempt attribute.KeyValue, p *report.Phases) []attribute.KeyValue {
	dst = append(dst, attempt)
	for _, ph := range [...]struct {
		key attribute.Key
		d   time.Duration
	}{
		{PhaseMergeKey, p.Merge}, {PhaseCompileKey, p.Compile}, {PhaseAttachKey, p.Attach},
		{PhaseWriteKey, p.Write}, {PhaseSwitchKey, p.Switch}, {PhaseCleanupKey, p.Cleanup},
	} {
		if ph.d != 0 {
			dst = append(dst, ph.key.Float64(ph.d.Seconds()))
		}
	}
	return dst
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

// Committed records one dataplane commit attempt's duration and outcome.
func (t *Telemetry) Committed(k report.Kind, a *report.Attempt) {
	if int(k) >= report.NumKinds {
		return
	}
	outcome := 0
	if a.Err != "" {
		outcome = 1
		t.commitFailures.add(k, 0)
	}
	t.commitDuration.Record(context.Background(), a.Duration().Seconds(), t.commitSets[outcome][k].rec...)
}
