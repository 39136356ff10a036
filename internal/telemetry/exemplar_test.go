package telemetry

import (
	"fmt"
	"math"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// markedRoots returns the exported root spans by trace id, and which of them
// carry the exemplar mark (failing on a mark that is not true).
func markedRoots(t *testing.T, tel *inMemory) (roots map[trace.TraceID]trace.SpanID, marked map[trace.TraceID]bool) {
	t.Helper()
	roots, marked = map[trace.TraceID]trace.SpanID{}, map[trace.TraceID]bool{}
	for _, s := range tel.endedSpans(t) {
		if s.Name != SpanProgram {
			continue
		}
		tid := s.SpanContext.TraceID()
		roots[tid] = s.SpanContext.SpanID()
		if v, ok := attrMap(s.Attributes)[ExemplarKey]; ok {
			if v != attribute.BoolValue(true) {
				t.Errorf("root of %s has %s=%s, want true or absent", tid, ExemplarMarkAttr, v.String())
			}
			marked[tid] = true
		}
	}
	return roots, marked
}

// The mark is exact: every exported exemplar names a marked root, every root
// the interval marked is named by an exemplar of that interval's collection,
// and the marks per interval are bounded (one per latency octave). Two
// intervals: exemplars carried over from the first still name marked roots.
func TestExemplarMarkIsExactAndBounded(t *testing.T) {
	tel := newInMemory(t)
	report := func(from, n int) {
		for i := from; i < from+n; i++ {
			// 1 ms .. ~30 s, spread over 15 octaves, several triggers each.
			latency := time.Duration(float64(time.Millisecond) * math.Pow(2, float64(i%15)) * (1 + float64(i%7)/10))
			tel.Report(record(base.Add(time.Duration(i)*time.Minute), fmt.Sprintf("pe-%d", i), latency))
		}
	}
	seenMarked := map[trace.TraceID]bool{}
	total := 0
	for interval, n := range []int{200, 100} {
		total += n
		report(interval*1000, n)
		pts := latencyPoints(t, tel.collect(t))
		roots, marked := markedRoots(t, tel)
		if len(roots) != total { // the in-memory exporter keeps every interval's
			t.Fatalf("interval %d: %d roots exported, want %d", interval, len(roots), total)
		}
		if len(pts) != 1 {
			t.Fatalf("interval %d: %d latency points, want 1", interval, len(pts))
		}
		named := map[trace.TraceID]bool{}
		for _, ex := range pts[0].Exemplars {
			tid := trace.TraceID(ex.TraceID)
			if !marked[tid] {
				t.Errorf("interval %d: exemplar %v names trace %s, whose root is not marked", interval, ex.Value, tid)
			}
			if sid := roots[tid]; sid != trace.SpanID(ex.SpanID) {
				t.Errorf("interval %d: exemplar names span %x, want the root %s", interval, ex.SpanID, sid)
			}
			named[tid] = true
		}
		newMarks := 0
		for tid := range marked {
			if seenMarked[tid] {
				continue
			}
			newMarks++
			seenMarked[tid] = true
			// One manual reader collected; the Prometheus reader, never
			// scraped, keeps only the first of each octave, which the
			// manual reader kept too: every new mark is in this collection.
			if !named[tid] {
				t.Errorf("interval %d: root of %s marked, but no exemplar of this interval names it", interval, tid)
			}
		}
		if newMarks == 0 || newMarks > markSlots {
			t.Errorf("interval %d: %d roots marked, want 1..%d (one per latency octave)", interval, newMarks, markSlots)
		}
		t.Logf("interval %d: %d triggers, %d exemplars, %d roots newly marked", interval, n, len(pts[0].Exemplars), newMarks)
		// The agent's own /metrics (the Prometheus reader, its own reservoir):
		// every exemplar there names a marked root too.
		promExemplars := 0
		for _, tid := range promExemplarTraces(t, tel) {
			promExemplars++
			if !marked[tid] {
				t.Errorf("interval %d: /metrics exemplar names trace %s, whose root is not marked", interval, tid)
			}
		}
		if promExemplars == 0 {
			t.Errorf("interval %d: /metrics shows no exemplar", interval)
		}
		if len(marked) > (interval+1)*markSlots {
			t.Errorf("after interval %d: %d of %d roots marked, want at most %d", interval, len(marked), len(roots), (interval+1)*markSlots)
		}
	}
}

// promExemplarTraces gathers the Prometheus registry behind MetricsHandler and
// returns the trace ids of the latency histogram's exemplars.
func promExemplarTraces(t *testing.T, tel *inMemory) []trace.TraceID {
	t.Helper()
	mfs, err := tel.prom.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	var out []trace.TraceID
	for _, mf := range mfs {
		if mf.GetName() != "npagent_policy_programming_latency_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, ex := range m.GetHistogram().GetExemplars() {
				for _, l := range ex.GetLabel() {
					if l.GetName() == "trace_id" {
						tid, err := trace.TraceIDFromHex(l.GetValue())
						if err != nil {
							t.Fatalf("exemplar trace_id %q: %v", l.GetValue(), err)
						}
						out = append(out, tid)
					}
				}
			}
		}
	}
	return out
}

// The reservoir keeps the first measurement of each octave per interval and
// says so through the tree in the context; without a tree (nothing to mark) it
// keeps nothing.
func TestMarkSlot(t *testing.T) {
	for _, tc := range []struct {
		v    float64
		want int
	}{
		{0, 0}, {-1, 0}, {math.NaN(), 0}, {1e-9, 0}, {math.Ldexp(1, -12) * 0.99, 0},
		{math.Ldexp(1, -12), 1}, {0.001, 3}, {0.5, 12}, {0.999, 12}, {1, 13}, {1.5, 13},
		{32, 18}, {63.9, 18}, {64, 19}, {3600, 19}, {math.Inf(1), 0},
	} {
		if got := markSlot(tc.v); got != tc.want {
			t.Errorf("markSlot(%v) = %d, want %d", tc.v, got, tc.want)
		}
	}
}
