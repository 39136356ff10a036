package telemetry

import (
	"context"
	"testing"
	"time"

	"github.com/npagent/npagent/internal/report"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// inMemory is a Telemetry wired to the SDK's own in-memory span exporter and
// manual metric reader (real SDK parts; nothing is faked).
type inMemory struct {
	*Telemetry
	spans  *tracetest.InMemoryExporter
	reader *sdkmetric.ManualReader
}

func newInMemory(t testing.TB, opts ...Option) *inMemory {
	t.Helper()
	spans := tracetest.NewInMemoryExporter()
	reader := sdkmetric.NewManualReader()
	opts = append([]Option{
		WithOTLP(false), WithNodeName("node-a"), WithServiceVersion("v0.0.0-test"),
		WithTraceExporter(spans), WithMetricReader(reader),
	}, opts...)
	tel, err := New(context.Background(), opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	return &inMemory{Telemetry: tel, spans: spans, reader: reader}
}

// endedSpans flushes the batch processor and returns every span exported so far.
func (m *inMemory) endedSpans(t testing.TB) tracetest.SpanStubs {
	t.Helper()
	if err := m.ForceFlush(context.Background()); err != nil {
		t.Fatalf("ForceFlush: %v", err)
	}
	return m.spans.GetSpans()
}

// collect draws what is queued, then collects every metric.
func (m *inMemory) collect(t testing.TB) metricdata.ResourceMetrics {
	t.Helper()
	m.handoff.drain(m.draw) // what a scrape or ForceFlush does first
	var rm metricdata.ResourceMetrics
	if err := m.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatalf("Collect: %v", err)
	}
	return rm
}

func findMetric(rm metricdata.ResourceMetrics, name string) (metricdata.Metrics, bool) {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

// latencyPoints returns the latency histogram's data points (none when nothing
// was recorded).
func latencyPoints(t testing.TB, rm metricdata.ResourceMetrics) []metricdata.ExponentialHistogramDataPoint[float64] {
	t.Helper()
	m, ok := findMetric(rm, LatencyName)
	if !ok {
		return nil
	}
	h, ok := m.Data.(metricdata.ExponentialHistogram[float64])
	if !ok {
		t.Fatalf("%s: data is %T, want an exponential histogram", LatencyName, m.Data)
	}
	if h.Temporality != metricdata.CumulativeTemporality {
		t.Fatalf("%s: temporality %v, want cumulative", LatencyName, h.Temporality)
	}
	return h.DataPoints
}

// counterValue sums an Int64 sum instrument's points whose attributes include all
// of want.
func counterValue(t testing.TB, rm metricdata.ResourceMetrics, name string, want ...attribute.KeyValue) int64 {
	t.Helper()
	m, ok := findMetric(rm, name)
	if !ok {
		return 0
	}
	var total int64
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		// Every int64 sum here is a counter: monotonic, and cumulative as the
		// Prometheus and OTLP exports need.
		if !d.IsMonotonic || d.Temporality != metricdata.CumulativeTemporality {
			t.Fatalf("%s: monotonic %v, temporality %v; want a cumulative monotonic sum", name, d.IsMonotonic, d.Temporality)
		}
		for _, p := range d.DataPoints {
			if hasAll(p.Attributes, want) {
				total += p.Value
			}
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			if hasAll(p.Attributes, want) {
				total += p.Value
			}
		}
	default:
		t.Fatalf("%s: data is %T, want an int64 sum or gauge", name, m.Data)
	}
	return total
}

func hasAll(set attribute.Set, want []attribute.KeyValue) bool {
	for _, kv := range want {
		v, ok := set.Value(kv.Key)
		if !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// record builds a plausible record: trigger at base, received 40ms later, worker
// 5ms after that, compute 2ms, then the given attempts.
func record(base time.Time, name string, latency time.Duration) *report.Record {
	return &report.Record{
		Kind:            report.KindPolicyEndpoint,
		Namespace:       "team-a",
		Name:            name,
		UID:             "uid-" + name,
		PolicyRef:       "np-" + name,
		ResourceVersion: "1234",
		Trigger:         base,
		Received:        base.Add(latency / 4),
		WorkerStart:     base.Add(latency / 2),
		ComputeStart:    base.Add(latency / 2),
		ComputeEnd:      base.Add(latency * 3 / 4),
		Attempts:        []report.Attempt{{Start: base.Add(latency * 3 / 4), End: base.Add(latency)}},
		Pods:            3,
		Entries:         17,
	}
}

// attempt is a commit attempt of duration d starting at start; err "" = success.
func attempt(start time.Time, d time.Duration, err string) *report.Attempt {
	return &report.Attempt{Start: start, End: start.Add(d), Err: err}
}
