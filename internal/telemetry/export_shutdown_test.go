package telemetry

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/npagent/npagent/internal/testenv"
)

// blockingMetricExporter holds its first export until that export's context ends and
// returns the context's error, as a real exporter does whose round is still in flight
// when the reader is shut down; later exports succeed.
type blockingMetricExporter struct {
	calls   atomic.Int32
	started chan struct{}
}

func (e *blockingMetricExporter) Export(ctx context.Context, _ *metricdata.ResourceMetrics) error {
	if e.calls.Add(1) == 1 {
		close(e.started)
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

// TestShutdownCancelsNoFailure: the SDK's PeriodicReader cancels a periodic export
// still in flight when it shuts down, then exports once more itself. That
// cancellation is the agent's own shutdown, not a collector failure: it must not be
// counted in Dropped() nor logged as a failing export. (TestThroughRealCollector saw
// "1 metric exports" failed with a healthy collector under -race, when a round
// overlapped Shutdown.) Real SDK reader; the exporter is a stand-in for one whose
// round is slow.
func TestShutdownCancelsNoFailure(t *testing.T) {
	inner := &blockingMetricExporter{started: make(chan struct{})}
	var failed atomic.Uint64
	logs := &testenv.LogBuffer{}
	health := &exportHealth{signal: "metrics", effect: "test", logger: slog.New(slog.NewTextHandler(logs, nil))}
	exp := &countingMetricExporter{Exporter: inner, failed: &failed, health: health}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp, sdkmetric.WithInterval(10*time.Millisecond))))
	c, err := mp.Meter("t").Int64Counter("c")
	if err != nil {
		t.Fatal(err)
	}
	c.Add(context.Background(), 1)
	select {
	case <-inner.started:
	case <-time.After(10 * time.Second):
		t.Fatal("no periodic export started")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := mp.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if n := inner.calls.Load(); n < 2 {
		t.Fatalf("%d exports, want the cancelled one and the shutdown's own", n)
	}
	if n := failed.Load(); n != 0 {
		t.Errorf("%d metric exports counted failed; the only error was the shutdown's own cancellation", n)
	}
	if health.failing.Load() {
		t.Errorf("export health says failing after a shutdown cancellation; logs:\n%s", logs.String())
	}
}

// The rest of sdkmetric.Exporter, with the SDK's default temporality and aggregation.

func (*blockingMetricExporter) Temporality(k sdkmetric.InstrumentKind) metricdata.Temporality {
	return sdkmetric.DefaultTemporalitySelector(k)
}

func (*blockingMetricExporter) Aggregation(k sdkmetric.InstrumentKind) sdkmetric.Aggregation {
	return sdkmetric.DefaultAggregationSelector(k)
}

func (*blockingMetricExporter) ForceFlush(context.Context) error { return nil }
func (*blockingMetricExporter) Shutdown(context.Context) error   { return nil }
