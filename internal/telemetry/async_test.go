package telemetry

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/npagent/npagent/internal/report"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// pauseBuilder stops the builder goroutine without marking Telemetry closed, so
// Report keeps queueing and nothing drains the queue; resumeBuilder restarts it.
func pauseBuilder(t *testing.T, tel *Telemetry) {
	t.Helper()
	close(tel.stopBuilder)
	<-tel.builderDone
}

func resumeBuilder(tel *Telemetry) {
	tel.stopBuilder = make(chan struct{})
	tel.builderDone = make(chan struct{})
	go tel.runBuilder()
}

func roots(spans tracetest.SpanStubs) map[string]tracetest.SpanStub {
	out := map[string]tracetest.SpanStub{}
	for _, s := range spans {
		if s.Name == SpanProgram {
			out[attrMap(s.Attributes)[PolicyNameKey].AsString()] = s
		}
	}
	return out
}

// The exemplar is recorded before the span tree exists; once built, the root
// must carry exactly the ids the exemplar names, under a traceparent too, and
// its children must have ids of their own.
func TestAsyncRootTakesTheExemplarsIDs(t *testing.T) {
	tel := newInMemory(t)
	r := record(base, "pe-tp", 30*time.Millisecond)
	r.TraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	tel.Report(r)

	pts := latencyPoints(t, tel.collect(t)) // before any flush: the point exists when Report returns
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

// Report copies the record: a caller reusing it (and its attempts) right after
// Report returns changes nothing of the spans built later.
func TestAsyncBuildsFromACopyOfTheRecord(t *testing.T) {
	tel := newInMemory(t)
	pauseBuilder(t, tel.Telemetry)
	r := record(base, "pe-orig", 30*time.Millisecond)
	tel.Report(r)
	r.Name = "pe-changed"
	r.Attempts[0].Err = "changed"
	resumeBuilder(tel.Telemetry)
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

// A full build queue drops the whole tree, counts its spans, and still records
// the point, without an exemplar, so no exemplar names a trace that never comes.
func TestAsyncFullQueueRecordsThePointWithoutExemplar(t *testing.T) {
	const queue = 16
	tel := newInMemory(t, WithSpanQueueSize(queue))
	pauseBuilder(t, tel.Telemetry)
	// Occupy all but one slot with flush markers, so the second record finds the
	// queue full while the span processors (sized alike) have room for a tree.
	for range queue - 1 {
		tel.builds <- &spanJob{flushed: make(chan struct{})}
	}
	tel.Report(record(base, "pe-kept", 30*time.Millisecond))
	tel.Report(record(base, "pe-dropped", 40*time.Millisecond))
	if spans, _ := tel.Dropped(); spans != 5 {
		t.Errorf("dropped %d spans, want 5 (the second record's tree)", spans)
	}
	resumeBuilder(tel.Telemetry)
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

// Shutdown builds and exports every queued tree before it stops, and Report is
// a harmless no-op afterwards.
func TestShutdownDrainsTheBuildQueue(t *testing.T) {
	exp := &countingExporter{}
	tel, err := New(context.Background(), WithOTLP(false), WithTraceExporter(exp))
	if err != nil {
		t.Fatal(err)
	}
	pauseBuilder(t, tel)
	const records = 50
	for i := range records {
		tel.Report(record(base, fmt.Sprintf("pe-%d", i), 30*time.Millisecond))
	}
	if n := len(tel.builds); n != records {
		t.Fatalf("%d records queued, want %d", n, records)
	}
	resumeBuilder(tel)
	if err := tel.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if got := exp.spans.Load(); got != 5*records {
		t.Errorf("%d spans exported by Shutdown, want %d", got, 5*records)
	}
	tel.Report(record(base, "pe-late", 30*time.Millisecond))
	if n := len(tel.builds); n != 0 {
		t.Errorf("%d records queued after Shutdown, want 0", n)
	}
	if err := tel.ForceFlush(context.Background()); err != nil {
		t.Errorf("ForceFlush after Shutdown: %v", err)
	}
}

// The builder is woken by its ticker, not by each Report: a queued record is
// built within a few ticks without any flush asking for it.
func TestBuilderBuildsOnItsTicker(t *testing.T) {
	tel := newInMemory(t)
	tel.Report(record(base, "pe-ticked", 30*time.Millisecond))
	deadline := time.Now().Add(50 * buildInterval)
	for len(tel.builds) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("record still queued after %v (build interval %v)", 50*buildInterval, buildInterval)
		}
		time.Sleep(buildInterval / 4)
	}
	if spans := tel.endedSpans(t); len(spans) != 5 {
		t.Fatalf("spans %v, want the record's tree of 5", names(spans))
	}
}

// With nothing to do the builder stops its ticker and sleeps; a record reported
// then wakes it at once.
func TestBuilderParksWhenIdleAndWakesForWork(t *testing.T) {
	tel := newInMemory(t)
	waitParked(t, tel)
	tel.Report(record(base, "pe-after-quiet", 30*time.Millisecond))
	deadline := time.Now().Add(time.Second)
	for len(tel.builds) > 0 || tel.parked.Load() {
		if time.Now().After(deadline) {
			t.Fatalf("parked builder not woken by Report within 1s (queued %d, parked %v)", len(tel.builds), tel.parked.Load())
		}
		time.Sleep(time.Millisecond)
	}
	if spans := tel.endedSpans(t); len(spans) != 5 {
		t.Fatalf("spans %v, want the record's tree of 5", names(spans))
	}
}

// Reports and commit durations arriving while the builder stops are not lost:
// each one is a histogram point, and each traced record's spans either arrive
// or are counted as dropped.
func TestStopWhileReportingLosesNothing(t *testing.T) {
	for round := range 10 {
		tel := newInMemory(t)
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
		if err := tel.stopBuilds(context.Background()); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		n := reported.Load()
		rm := tel.collect(t)
		var points uint64
		for _, p := range latencyPoints(t, rm) {
			points += p.Count
		}
		m, _ := findMetric(rm, CommitDurationName)
		var commits uint64
		for _, p := range m.Data.(metricdata.ExponentialHistogram[float64]).DataPoints {
			commits += p.Count
		}
		spans := uint64(len(tel.endedSpans(t)))
		dropped, _ := tel.Dropped()
		if points != uint64(n) || commits != uint64(n) || spans+dropped != 5*uint64(n) {
			t.Fatalf("round %d: %d reports: %d latency points, %d commit durations, %d spans + %d dropped (want %d)",
				round, n, points, commits, spans, dropped, 5*n)
		}
	}
}

// A parked builder is woken by a point alone (Committed), not only by a
// traced record, and records it without any flush.
func TestParkedBuilderWokenByAPoint(t *testing.T) {
	tel := newInMemory(t)
	waitParked(t, tel)
	tel.Committed(report.KindPolicyEndpoint, attempt(base, 3*time.Millisecond, ""))
	deadline := time.Now().Add(time.Second)
	for {
		var rm metricdata.ResourceMetrics
		if err := tel.reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		if m, ok := findMetric(rm, CommitDurationName); ok {
			if pts := m.Data.(metricdata.ExponentialHistogram[float64]).DataPoints; len(pts) == 1 && pts[0].Count == 1 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("commit duration not recorded within 1s of CommitDone (builder parked: %v)", tel.parked.Load())
		}
		time.Sleep(time.Millisecond)
	}
}

// waitParked waits until the idle builder has parked.
func waitParked(t *testing.T, tel *inMemory) {
	t.Helper()
	idleFor := time.Duration(idleTicksBeforeParking) * buildInterval
	deadline := time.Now().Add(10 * idleFor)
	for !tel.parked.Load() {
		if time.Now().After(deadline) {
			t.Fatalf("builder not parked after %v idle (parks after %v)", 10*idleFor, idleFor)
		}
		time.Sleep(buildInterval)
	}
}

// stopBuilds waits for a caller admitted before Shutdown began to finish its
// send, and builds what it sent: the window between Report's check and its send
// cannot strand a record.
func TestStopWaitsForAdmittedSenders(t *testing.T) {
	tel := newInMemory(t)
	if !tel.admit() {
		t.Fatal("admit refused before Shutdown")
	}
	stopped := make(chan error, 1)
	go func() { stopped <- tel.stopBuilds(context.Background()) }()
	select {
	case err := <-stopped:
		t.Fatalf("stopBuilds returned (%v) while a caller was admitted and had not sent", err)
	case <-time.After(100 * time.Millisecond):
	}
	if tel.admit() {
		t.Error("admit accepted a caller after Shutdown began")
	}
	r := record(base, "pe-late-sender", 30*time.Millisecond)
	tel.builds <- newJob(r, r.Committed())
	tel.admitted()
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if spans := tel.endedSpans(t); len(spans) != 5 {
		t.Fatalf("spans %v, want the late sender's tree of 5", names(spans))
	}
	if pts := latencyPoints(t, tel.collect(t)); len(pts) != 1 || pts[0].Count != 1 {
		t.Fatalf("latency points %+v, want the late sender's point", pts)
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

// A Shutdown whose context has already ended still stops the builder before it
// returns, and what it could not build is accounted for: every record is a
// point, every tree's spans arrived or are counted as dropped.
func TestStopWithExpiredContextLosesNothingUncounted(t *testing.T) {
	tel := newInMemory(t)
	const records = 300
	for i := range records {
		tel.Report(record(base, fmt.Sprintf("pe-%d", i), 30*time.Millisecond))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = tel.stopBuilds(ctx) // ctx.Err() or nil, depending on how far the drain got
	select {
	case <-tel.builderDone:
	default:
		t.Fatal("stopBuilds returned with the builder still running")
	}
	if n := len(tel.builds); n != 0 {
		t.Errorf("%d jobs left queued after stopBuilds", n)
	}
	var points uint64
	for _, p := range latencyPoints(t, tel.collect(t)) {
		points += p.Count
	}
	spans := uint64(len(tel.endedSpans(t)))
	dropped, _ := tel.Dropped()
	if points != records || spans+dropped != 5*records {
		t.Fatalf("%d records: %d points, %d spans + %d dropped (want %d)", records, points, spans, dropped, 5*records)
	}
	t.Logf("%d trees built, %d abandoned", spans/5, dropped/5)
}
