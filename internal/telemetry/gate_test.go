package telemetry

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/npagent/npagent/internal/report"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

func roots(spans tracetest.SpanStubs) map[string]tracetest.SpanStub {
	out := map[string]tracetest.SpanStub{}
	for _, s := range spans {
		if s.Name == SpanProgram {
			out[attrMap(s.Attributes)[PolicyNameKey].AsString()] = s
		}
	}
	return out
}

// The point exists once the drawing goroutine reached it (no flush), and its
// exemplar names the root, under a traceparent too (as its child); the
// children have ids of their own.
func TestExemplarNamesTheRootUnderATraceparent(t *testing.T) {
	tel := newInMemory(t, WithTraceParenting(ParentingChild))
	r := record(base, "pe-tp", 30*time.Millisecond)
	r.TraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	tel.Report(r)

	var rm metricdata.ResourceMetrics // straight from the reader: nothing drained or flushed
	deadline := time.Now().Add(10 * drawInterval)
	for {
		rm = metricdata.ResourceMetrics{}
		if err := tel.reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		if len(latencyPoints(t, rm)) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(drawInterval / 4)
	}
	pts := latencyPoints(t, rm)
	if len(pts) != 1 || pts[0].Count != 1 || len(pts[0].Exemplars) != 1 {
		t.Fatalf("latency points %+v, want one point, count 1, one exemplar", pts)
	}
	ex := pts[0].Exemplars[0]

	spans := tel.endedSpans(t)
	root, ok := roots(spans)["pe-tp"]
	if !ok || len(spans) != 5 {
		t.Fatalf("spans %v, want a root and 4 children", names(spans))
	}
	tid, sid := root.SpanContext.TraceID(), root.SpanContext.SpanID()
	if string(ex.TraceID) != string(tid[:]) || string(ex.SpanID) != string(sid[:]) {
		t.Errorf("exemplar %x/%x, root %s/%s: want equal", ex.TraceID, ex.SpanID, tid, sid)
	}
	if tid.String() != "4bf92f3577b34da6a3ce929d0e0e4736" || root.Parent.SpanID().String() != "00f067aa0ba902b7" {
		t.Errorf("root trace %s parent %s, want the traceparent's", tid, root.Parent.SpanID())
	}
	seen := map[string]bool{}
	for _, s := range spans {
		id := s.SpanContext.SpanID().String()
		if seen[id] {
			t.Errorf("span id %s used twice (%s)", id, s.Name)
		}
		seen[id] = true
		if s.Name != SpanProgram && s.Parent.SpanID() != sid {
			t.Errorf("%s parent %s, want the root %s", s.Name, s.Parent.SpanID(), sid)
		}
	}
}

// A caller reusing the record (and its attempts) right after Report returns
// changes nothing of what was exported.
func TestReportKeepsNothingOfTheCallersRecord(t *testing.T) {
	tel := newInMemory(t)
	r := record(base, "pe-orig", 30*time.Millisecond)
	tel.Report(r)
	r.Name = "pe-changed"
	r.Attempts[0].Err = "changed"
	spans := tel.endedSpans(t)
	if _, ok := roots(spans)["pe-orig"]; !ok || len(spans) != 5 {
		t.Fatalf("spans %v, want the tree of pe-orig", names(spans))
	}
	for _, s := range spans {
		if s.Name == SpanCommit && s.Status.Description != "" {
			t.Errorf("commit span status %q: the caller's later change leaked in", s.Status.Description)
		}
	}
}

// A tree the span queue cannot hold is dropped whole, its spans counted, and
// its point still recorded, without an exemplar, so no exemplar names a trace
// that never comes; the tree before it, taken, is the one the exemplar names.
func TestFullSpanQueueRecordsThePointWithoutExemplar(t *testing.T) {
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "600000") // the processor holds what it took until the flush
	tel := newInMemory(t, WithSpanQueueSize(9))   // one tree of 5 fits, two do not
	tel.Report(record(base, "pe-kept", 30*time.Millisecond))
	tel.Report(record(base, "pe-dropped", 40*time.Millisecond))
	tel.handoff.drain(tel.draw)
	if spans, _ := tel.Dropped(); spans != 5 {
		t.Errorf("dropped %d spans, want 5 (the second record's tree)", spans)
	}
	pts := latencyPoints(t, tel.collect(t))
	if len(pts) != 1 || pts[0].Count != 2 {
		t.Fatalf("latency points %+v, want one point counting 2", pts)
	}
	spans := tel.endedSpans(t)
	kept, ok := roots(spans)["pe-kept"]
	if !ok || len(spans) != 5 {
		t.Fatalf("spans %v, want the kept record's tree only", names(spans))
	}
	if len(pts[0].Exemplars) != 1 {
		t.Fatalf("%d exemplars, want 1 (the kept record's)", len(pts[0].Exemplars))
	}
	ex := pts[0].Exemplars[0]
	tid, sid := kept.SpanContext.TraceID(), kept.SpanContext.SpanID()
	if string(ex.TraceID) != string(tid[:]) || string(ex.SpanID) != string(sid[:]) || ex.Value != 0.03 {
		t.Errorf("exemplar %x/%x value %v, want the kept root %s/%s, 0.03", ex.TraceID, ex.SpanID, ex.Value, tid, sid)
	}
}

// countingExporter counts the spans exported to it; unlike the in-memory
// exporter it keeps its count through Shutdown.
type countingExporter struct{ spans atomic.Int64 }

func (e *countingExporter) ExportSpans(_ context.Context, s []sdktrace.ReadOnlySpan) error {
	e.spans.Add(int64(len(s)))
	return nil
}
func (*countingExporter) Shutdown(context.Context) error { return nil }

// Shutdown exports every tree reported before it; Report is harmless
// afterwards, its spans counted as dropped.
func TestShutdownExportsEveryReportedTree(t *testing.T) {
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "600000") // only Shutdown exports
	exp := &countingExporter{}
	tel, err := New(context.Background(), WithOTLP(false), WithTraceExporter(exp))
	if err != nil {
		t.Fatal(err)
	}
	const records = 50
	for i := range records {
		tel.Report(record(base, fmt.Sprintf("pe-%d", i), 30*time.Millisecond))
	}
	if err := tel.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if got := exp.spans.Load(); got != 5*records {
		t.Errorf("%d spans exported by Shutdown, want %d", got, 5*records)
	}
	tel.Report(record(base, "pe-late", 30*time.Millisecond))
	if got := exp.spans.Load(); got != 5*records {
		t.Errorf("%d spans exported after a Report that followed Shutdown, want still %d", got, 5*records)
	}
	if dropped, _ := tel.Dropped(); dropped != 5 {
		t.Errorf("%d spans counted dropped, want the late record's 5", dropped)
	}
	if err := tel.ForceFlush(context.Background()); err != nil {
		t.Errorf("ForceFlush after Shutdown: %v", err)
	}
}

// Reports and commit durations racing Shutdown (the hand-off's final drain and
// the tracer provider's shutdown) lose nothing uncounted: each one is a
// histogram point (queued before the final drain or drawn on its caller), each
// traced record's spans either arrive or are counted as dropped, and every
// exemplar names a trace that arrived.
func TestShutdownWhileReportingLosesNothing(t *testing.T) {
	for round := range 10 {
		exp := &countingExporter{}
		reader := sdkmetric.NewManualReader()
		tel, err := New(context.Background(), WithOTLP(false), WithTraceExporter(exp), WithMetricReader(reader))
		if err != nil {
			t.Fatal(err)
		}
		var reported atomic.Int64
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Go(func() {
				for i := range 150 {
					tel.Report(record(base, fmt.Sprintf("pe-%d-%d-%d", round, g, i), 30*time.Millisecond))
					tel.Committed(report.KindPolicyEndpoint, attempt(base, time.Millisecond, ""))
					reported.Add(1)
				}
			})
		}
		time.Sleep(time.Duration(round) * 100 * time.Microsecond)
		// Shutdown's first two steps, racing the reports: the hand-off's last
		// drain, then the tracing half; the meter stays up to be read below.
		tel.handoff.close()
		if err := tel.tp.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		n := reported.Load()
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		var points uint64
		for _, p := range latencyPoints(t, rm) {
			points += p.Count
		}
		m, _ := findMetric(rm, CommitDurationName)
		var commits uint64
		for _, p := range m.Data.(metricdata.ExponentialHistogram[float64]).DataPoints {
			commits += p.Count
		}
		spans := uint64(exp.spans.Load())
		dropped, _ := tel.Dropped()
		if points != uint64(n) || commits != uint64(n) || spans+dropped != 5*uint64(n) {
			t.Fatalf("round %d: %d reports: %d latency points, %d commit durations, %d spans + %d dropped (want %d)",
				round, n, points, commits, spans, dropped, 5*n)
		}
		if exemplars := len(latencyPoints(t, rm)[0].Exemplars); spans == 0 && exemplars != 0 {
			t.Errorf("round %d: %d exemplars, but no trace arrived", round, exemplars)
		}
		_ = tel.mp.Shutdown(context.Background())
	}
}

// An exemplar names only a trace that can arrive: with no span exporter no tree
// is built, and a tree no span queue takes leaves its point without exemplar.
func TestNoExemplarForATraceThatCannotArrive(t *testing.T) {
	t.Run("no span exporter", func(t *testing.T) {
		reader := sdkmetric.NewManualReader()
		tel, err := New(context.Background(), WithOTLP(false), WithMetricReader(reader))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
		tel.Report(record(base, "pe-untraced", 30*time.Millisecond))
		if err := tel.ForceFlush(context.Background()); err != nil {
			t.Fatal(err)
		}
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		pts := latencyPoints(t, rm)
		if len(pts) != 1 || pts[0].Count != 1 || len(pts[0].Exemplars) != 0 {
			t.Fatalf("latency points %+v, want one observation and no exemplar", pts)
		}
		if spans, _ := tel.Dropped(); spans != 0 {
			t.Errorf("%d spans counted dropped with no exporter to drop them from", spans)
		}
	})
	t.Run("tree larger than the span queue", func(t *testing.T) {
		tel := newInMemory(t, WithSpanQueueSize(4)) // a tree is 5 spans
		tel.Report(record(base, "pe-too-big", 30*time.Millisecond))
		if spans := tel.endedSpans(t); len(spans) != 0 {
			t.Fatalf("spans %v exported, want none: the tree goes whole or not at all", names(spans))
		}
		pts := latencyPoints(t, tel.collect(t))
		if len(pts) != 1 || pts[0].Count != 1 || len(pts[0].Exemplars) != 0 {
			t.Fatalf("latency points %+v, want one observation and no exemplar", pts)
		}
		if spans, _ := tel.Dropped(); spans != 5 {
			t.Errorf("%d spans counted dropped, want the tree's 5", spans)
		}
	})
}

// The spans of concurrent Reports reach the exporter as whole trees: every
// exported child's root is exported too, with as many children as it counts.
func TestConcurrentReportsExportWholeTrees(t *testing.T) {
	tel := newInMemory(t, WithSpanQueueSize(64)) // small: some trees are refused
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 100 {
				tel.Report(record(base, fmt.Sprintf("pe-%d-%d", g, i), 30*time.Millisecond))
			}
		})
	}
	wg.Wait()
	spans := tel.endedSpans(t)
	children := map[trace.SpanID]int{}
	rootSpans := map[trace.SpanID]tracetest.SpanStub{}
	for _, s := range spans {
		if s.Name == SpanProgram {
			rootSpans[s.SpanContext.SpanID()] = s
		} else {
			children[s.Parent.SpanID()]++
		}
	}
	for id, n := range children {
		root, ok := rootSpans[id]
		if !ok {
			t.Fatalf("%d children of root %s exported without it", n, id)
		}
		if n != root.ChildSpanCount {
			t.Errorf("root %s: %d children exported, it counts %d", id, n, root.ChildSpanCount)
		}
	}
	dropped, _ := tel.Dropped()
	if uint64(len(spans))+dropped != 5*400 {
		t.Errorf("%d spans exported + %d dropped, want all %d accounted for", len(spans), dropped, 5*400)
	}
	t.Logf("%d trees exported, %d spans dropped", len(rootSpans), dropped)
}

// The hand-off loses nothing and delays nothing a reader asks for: with its queue
// full the caller draws the record itself, and a scrape drains the queue before it
// serves, so it counts every trigger reported before it.
func TestHandoffFullQueueAndScrapeLoseNothing(t *testing.T) {
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")
	tel := newInMemory(t, WithSpanQueueSize(4)) // 4 records queued at most
	const n = 50
	for i := range n {
		tel.Report(record(base, fmt.Sprintf("pe-%d", i), 30*time.Millisecond))
	}
	srv := httptest.NewServer(tel.MetricsHandler())
	defer srv.Close()
	req, err := http.NewRequest(http.MethodGet, srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if want := "npagent_policy_programming_latency_seconds_count{"; !strings.Contains(string(body), want) {
		t.Fatalf("exposition lacks %s:\n%s", want, body)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "npagent_policy_programming_latency_seconds_count{") && !strings.HasSuffix(line, fmt.Sprintf(" %d", n)) {
			t.Errorf("scrape right after %d reports: %s, want the count %d", n, line, n)
		}
	}
	spans, dropped := len(tel.endedSpans(t)), func() uint64 { d, _ := tel.Dropped(); return d }()
	if uint64(spans)+dropped != 5*n {
		t.Errorf("%d spans arrived + %d dropped, want %d (5 per report)", spans, dropped, 5*n)
	}
}
