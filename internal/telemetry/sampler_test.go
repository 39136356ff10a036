package telemetry

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/npagent/npagent/internal/report"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

const (
	unsampledParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
	sampledParent   = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
)

// sampledMix reports slow 250 ms and fast 10 ms triggers (under traceparent,
// if any) and returns how many of each were exported, after checking that
// every exemplar names an exported root, that the marked roots are exactly the
// ones the exemplars name (one reader, one collection), and that every
// exported root carries its latency.
func sampledMix(t *testing.T, tel *inMemory, slow, fast int, traceparent string) (keptSlow, keptFast int) {
	t.Helper()
	for i := range slow + fast {
		latency := 10 * time.Millisecond
		if i < slow {
			latency = 250 * time.Millisecond
		}
		r := record(base.Add(time.Duration(i)*time.Second), fmt.Sprintf("pe-%d", i), latency)
		r.TraceParent = traceparent
		tel.Report(r)
	}
	exported := map[trace.TraceID]map[trace.SpanID]bool{}
	marked := map[trace.SpanID]bool{}
	for _, s := range tel.endedSpans(t) {
		if s.Name != SpanProgram {
			continue
		}
		a := attrMap(s.Attributes)
		if v, ok := a[ExemplarKey]; ok {
			if v != attribute.BoolValue(true) {
				t.Errorf("root %s has %s=%v", s.SpanContext.SpanID(), ExemplarKey, v.String())
			}
			marked[s.SpanContext.SpanID()] = true
		}
		d := s.EndTime.Sub(s.StartTime)
		if got := a[LatencyKey].AsFloat64(); got != d.Seconds() {
			t.Errorf("root %s=%v, want its latency %v", LatencyKey, got, d.Seconds())
		}
		if d >= 100*time.Millisecond {
			keptSlow++
		} else {
			keptFast++
		}
		if exported[s.SpanContext.TraceID()] == nil {
			exported[s.SpanContext.TraceID()] = map[trace.SpanID]bool{}
		}
		exported[s.SpanContext.TraceID()][s.SpanContext.SpanID()] = true
	}
	if dropped, _ := tel.Dropped(); dropped != 0 {
		t.Fatalf("%d spans dropped: the span queue was too small for the test", dropped)
	}
	pts := latencyPoints(t, tel.collect(t))
	if len(pts) != 1 || pts[0].Count != uint64(slow+fast) {
		t.Fatalf("latency points %+v, want one point counting all %d triggers", pts, slow+fast)
	}
	named := map[trace.SpanID]bool{}
	for _, ex := range pts[0].Exemplars {
		if !exported[trace.TraceID(ex.TraceID)][trace.SpanID(ex.SpanID)] {
			t.Errorf("exemplar (value %v) names %x/%x, not an exported root", ex.Value, ex.TraceID, ex.SpanID)
		}
		if !marked[trace.SpanID(ex.SpanID)] {
			t.Errorf("exemplar (value %v) names root %x, which is not marked", ex.Value, ex.SpanID)
		}
		named[trace.SpanID(ex.SpanID)] = true
	}
	for id := range marked {
		if !named[id] {
			t.Errorf("root %s is marked but no exemplar names it", id)
		}
	}
	if keptSlow+keptFast > 0 && len(pts[0].Exemplars) == 0 {
		t.Error("traces were kept but the point carries no exemplar")
	}
	return keptSlow, keptFast
}

// How WithSampling composes with OTEL_TRACES_SAMPLER: slow triggers are always
// kept; a fast one passes the systematic fraction, then the environment's
// sampler decides.
func TestSamplerComposesWithTheEnvironment(t *testing.T) {
	const slow, fast = 40, 300 // 1700 spans at most: within the default span queue
	for _, tc := range []struct {
		name, sampler, arg, traceparent string
		fraction                        float64
		wantFastMin, wantFastMax        int
		link                            bool // default parenting (link) instead of child
	}{
		{name: "unset keeps the fraction", fraction: 0.25, wantFastMin: 75, wantFastMax: 75},
		{name: "always_on after the fraction", sampler: "always_on", fraction: 0.25, wantFastMin: 75, wantFastMax: 75},
		{name: "always_off drops every fast one", sampler: "always_off", fraction: 1},
		{name: "traceidratio decides by trace id", sampler: "traceidratio", arg: "0.5", fraction: 1, wantFastMin: 100, wantFastMax: 200},
		{name: "parentbased follows an unsampled parent for fast ones", sampler: "parentbased_always_on",
			traceparent: unsampledParent, fraction: 1},
		{name: "parentbased follows a sampled parent", sampler: "parentbased_always_off",
			traceparent: sampledParent, fraction: 1, wantFastMin: fast, wantFastMax: fast},
		{name: "unset keeps fast ones under an unsampled parent", traceparent: unsampledParent,
			fraction: 1, wantFastMin: fast, wantFastMax: fast},
		// Linked, not parented: a parentbased sampler sees a root.
		{name: "parentbased decides as a root under a link", sampler: "parentbased_always_on",
			traceparent: unsampledParent, fraction: 1, wantFastMin: fast, wantFastMax: fast, link: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("OTEL_TRACES_SAMPLER", tc.sampler)
			t.Setenv("OTEL_TRACES_SAMPLER_ARG", tc.arg)
			parenting := ParentingChild
			if tc.link {
				parenting = ParentingLink
			}
			tel := newInMemory(t, WithSampling(100*time.Millisecond, tc.fraction), WithTraceParenting(parenting))
			keptSlow, keptFast := sampledMix(t, tel, slow, fast, tc.traceparent)
			if keptSlow != slow {
				t.Errorf("kept %d slow traces, want all %d", keptSlow, slow)
			}
			if keptFast < tc.wantFastMin || keptFast > tc.wantFastMax {
				t.Errorf("kept %d fast traces, want %d..%d", keptFast, tc.wantFastMin, tc.wantFastMax)
			}
		})
	}
}

// With the default threshold (0) every trigger is slow: OTEL_TRACES_SAMPLER
// has no fast trigger to decide for.
func TestDefaultSamplingKeepsAllWhateverTheEnvironment(t *testing.T) {
	t.Setenv("OTEL_TRACES_SAMPLER", "always_off")
	tel := newInMemory(t)
	if keptSlow, keptFast := sampledMix(t, tel, 5, 20, unsampledParent); keptSlow+keptFast != 25 {
		t.Errorf("kept %d traces, want all 25", keptSlow+keptFast)
	}
}

// The sampler on its own: the root decides on its latency start attribute,
// children follow their parent.
func TestLatencySamplerDecisions(t *testing.T) {
	s := newLatencySampler(100*time.Millisecond, 0.5, nil)
	tel := newInMemory(t, WithSampling(100*time.Millisecond, 0.5))
	tr := tel.tp.Tracer("test")
	start := func(parent trace.SpanContext, name string, attrs ...attribute.KeyValue) trace.Span {
		ctx := trace.ContextWithSpanContext(t.Context(), parent)
		_, sp := tr.Start(ctx, name, trace.WithAttributes(attrs...))
		return sp
	}
	slow := start(trace.SpanContext{}, SpanProgram, LatencyKey.Float64(0.1))
	if !slow.SpanContext().IsSampled() {
		t.Error("root at the threshold not sampled")
	}
	var fastKept int
	for range 10 {
		if start(trace.SpanContext{}, SpanProgram, LatencyKey.Float64(0.01)).SpanContext().IsSampled() {
			fastKept++
		}
	}
	if fastKept != 5 {
		t.Errorf("%d of 10 fast roots sampled, want 5", fastKept)
	}
	sampledRoot := slow.SpanContext()
	if !start(sampledRoot, SpanCommit).SpanContext().IsSampled() {
		t.Error("child of a sampled root not sampled")
	}
	unsampledRoot := sampledRoot.WithTraceFlags(0)
	if start(unsampledRoot, SpanCommit).SpanContext().IsSampled() {
		t.Error("child of an unsampled root sampled")
	}
	if d := s.Description(); !strings.Contains(d, "100ms") || !strings.Contains(d, "0.5") {
		t.Errorf("Description %q names neither threshold nor fraction", d)
	}
	if d := newLatencySampler(0, 1, envSamplerFor(t, "traceidratio", "0.1")).Description(); !strings.Contains(d, "TraceIDRatioBased{0.1}") {
		t.Errorf("Description %q does not name the environment's sampler", d)
	}
}

func envSamplerFor(t *testing.T, name, arg string) sdktrace.Sampler {
	t.Setenv("OTEL_TRACES_SAMPLER", name)
	t.Setenv("OTEL_TRACES_SAMPLER_ARG", arg)
	return envSampler(slog.New(slog.DiscardHandler))
}

// Each attempt's wait for the commit lock is a lock_wait span before its
// commit span (when Requested is known and not after Start), and the commit
// span carries the attempt's non-zero phases in seconds.
func TestLockWaitAndCommitPhases(t *testing.T) {
	tel := newInMemory(t)
	r := record(base, "pe-phases", 400*time.Millisecond)
	r.ComputeStart, r.ComputeEnd = base.Add(200*time.Millisecond), base.Add(210*time.Millisecond)
	r.Attempts = []report.Attempt{
		{ // waited 90 ms for the lock, then failed
			Requested: base.Add(210 * time.Millisecond), Start: base.Add(300 * time.Millisecond), End: base.Add(320 * time.Millisecond),
			Err:    "map full",
			Phases: report.Phases{Merge: time.Millisecond, Compile: 2 * time.Millisecond, Write: 17 * time.Millisecond},
		},
		{ // the wait was not measured
			Start: base.Add(330 * time.Millisecond), End: base.Add(340 * time.Millisecond),
		},
		{ // waited 50 ms, succeeded
			Requested: base.Add(340 * time.Millisecond), Start: base.Add(390 * time.Millisecond), End: base.Add(400 * time.Millisecond),
			Phases: report.Phases{Merge: 500 * time.Microsecond, Compile: time.Millisecond, Attach: 2 * time.Millisecond,
				Write: 3 * time.Millisecond, Switch: 4 * time.Millisecond, Cleanup: 5 * time.Millisecond},
		},
	}
	tel.Report(r)
	spans := tel.endedSpans(t)
	root := roots(spans)["pe-phases"]
	var waits, commits []tracetest.SpanStub
	for _, s := range spans {
		if s.Name != SpanProgram && s.Parent.SpanID() != root.SpanContext.SpanID() {
			t.Errorf("%s is not a child of the root", s.Name)
		}
		switch s.Name {
		case SpanLockWait:
			waits = append(waits, s)
		case SpanCommit:
			commits = append(commits, s)
		}
	}
	if len(spans) != 1+3+2+3 || len(waits) != 2 || len(commits) != 3 {
		t.Fatalf("spans %v, want root, delivery, queue, compute, 2 lock waits, 3 commits", names(spans))
	}
	for i, w := range waits {
		a := r.Attempts[2*i] // attempts 1 and 3 waited
		if !w.StartTime.Equal(a.Requested) || !w.EndTime.Equal(a.Start) {
			t.Errorf("lock_wait %d %v..%v, want %v..%v", i, w.StartTime, w.EndTime, a.Requested, a.Start)
		}
		if got := attrMap(w.Attributes)[AttemptKey]; got != attribute.IntValue(2*i+1) {
			t.Errorf("lock_wait %d attempt %v, want %d", i, got.String(), 2*i+1)
		}
	}
	secs := func(d time.Duration) attribute.Value { return attribute.Float64Value(d.Seconds()) }
	want := []map[attribute.Key]attribute.Value{
		{AttemptKey: attribute.IntValue(1), PhaseMergeKey: secs(time.Millisecond), PhaseCompileKey: secs(2 * time.Millisecond),
			PhaseWriteKey: secs(17 * time.Millisecond)},
		{AttemptKey: attribute.IntValue(2)},
		{AttemptKey: attribute.IntValue(3), PhaseMergeKey: secs(500 * time.Microsecond), PhaseCompileKey: secs(time.Millisecond),
			PhaseAttachKey: secs(2 * time.Millisecond), PhaseWriteKey: secs(3 * time.Millisecond),
			PhaseSwitchKey: secs(4 * time.Millisecond), PhaseCleanupKey: secs(5 * time.Millisecond)},
	}
	for i, c := range commits {
		got := attrMap(c.Attributes)
		if len(got) != len(want[i]) {
			t.Errorf("commit %d attributes %v, want %v", i+1, c.Attributes, want[i])
		}
		for k, v := range want[i] {
			if got[k] != v {
				t.Errorf("commit %d %s = %v, want %v", i+1, k, got[k].String(), v.String())
			}
		}
		if !c.StartTime.Equal(r.Attempts[i].Start) {
			t.Errorf("commit %d starts %v, want %v", i+1, c.StartTime, r.Attempts[i].Start)
		}
	}
	if commits[0].Status.Code != codes.Error || len(commits[0].Events) != 1 {
		t.Errorf("failed attempt: status %v, events %v", commits[0].Status, commits[0].Events)
	}
	if got := attrMap(root.Attributes)[AttemptsKey]; got != attribute.IntValue(3) {
		t.Errorf("root attempts %v, want 3", got.String())
	}
	// Drawn order: each lock_wait ends before its commit span ends (children end
	// in the order drawn, so the exporter sees lock_wait first).
	var order []string
	for _, s := range spans {
		if s.Name == SpanLockWait || s.Name == SpanCommit {
			order = append(order, s.Name)
		}
	}
	if got := strings.Join(order, ","); got != "lock_wait,commit,commit,lock_wait,commit" {
		t.Errorf("span order %s, want each lock_wait before its commit", got)
	}
}

// A lock wait whose request follows its start (a bogus record) is left out, as
// a phase with bounds out of order is.
func TestLockWaitOutOfOrderIsLeftOut(t *testing.T) {
	tel := newInMemory(t)
	r := record(base, "pe-bogus", 100*time.Millisecond)
	r.Attempts[0].Requested = r.Attempts[0].Start.Add(time.Millisecond)
	tel.Report(r)
	for _, s := range tel.endedSpans(t) {
		if s.Name == SpanLockWait {
			t.Errorf("lock_wait %v..%v drawn backwards", s.StartTime, s.EndTime)
		}
	}
}

// Span limits come from the SDK, which reads OTEL_SPAN_* and OTEL_ATTRIBUTE_*.
func TestSpanLimitsFromEnvironment(t *testing.T) {
	t.Setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "5")
	t.Setenv("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "6")
	t.Setenv("OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT", "0")
	tel := newInMemory(t)
	r := record(base, "pe-"+strings.Repeat("ü", 20), 80*time.Millisecond)
	r.Attempts[0].Err = "map full"
	tel.Report(r)
	var root, commit tracetest.SpanStub
	for _, s := range tel.endedSpans(t) {
		switch s.Name {
		case SpanProgram:
			root = s
		case SpanCommit:
			commit = s
		}
	}
	if len(root.Attributes) != 5 || root.DroppedAttributes == 0 {
		t.Errorf("root: %d attributes, %d dropped; want 5 kept, the rest counted", len(root.Attributes), root.DroppedAttributes)
	}
	a := attrMap(root.Attributes)
	if a[ExemplarKey] != attribute.BoolValue(true) || a[LatencyKey].AsFloat64() != 0.08 {
		t.Errorf("root keeps %v; want the start attributes and the exemplar mark first", root.Attributes)
	}
	for _, kv := range root.Attributes {
		if kv.Value.Type() == attribute.STRING && len([]rune(kv.Value.AsString())) > 6 {
			t.Errorf("root %s = %q, longer than the 6-character limit", kv.Key, kv.Value.AsString())
		}
	}
	if len(commit.Events) != 1 || len(commit.Events[0].Attributes) != 0 || commit.Events[0].DroppedAttributeCount != 1 {
		t.Errorf("commit events %+v, want one exception event with its attribute dropped", commit.Events)
	}
}
