package telemetry

import (
	"context"
	"log/slog"
	"sync/atomic"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// exportHealth reports an exporter's trouble once per transition (healthy →
// failing → healthy), never once per failed batch: a dead collector must not
// flood the log.
type exportHealth struct {
	signal  string
	effect  string // what a failure costs, for the log line
	logger  *slog.Logger
	failing atomic.Bool
}

func (h *exportHealth) observe(err error) {
	if err != nil {
		if h.failing.CompareAndSwap(false, true) {
			h.logger.Warn("telemetry export failing", "signal", h.signal, "effect", h.effect, "err", err)
		}
		return
	}
	if h.failing.CompareAndSwap(true, false) {
		h.logger.Info("telemetry export recovered", "signal", h.signal)
	}
}

// spanGate bounds the spans waiting for one exporter and counts what it drops.
//
// The SDK's batch span processor drops spans when its queue is full but only
// exposes the count through experimental self-observability. So the gate admits a
// span only while fewer than limit admitted spans have not yet reached the
// exporter (counted in inFlight, decremented by gatedExporter when a batch is
// handed over); with the processor's queue sized to the same limit it can never
// overflow, and every span that does not reach the exporter is counted here
// (after Shutdown has stopped the processor nothing is handed to it any more).
// The processor runs in drop mode, so OnEnd never blocks.
type spanGate struct {
	next     sdktrace.SpanProcessor
	limit    int64
	inFlight *atomic.Int64
	dropped  *atomic.Uint64
}

var _ sdktrace.SpanProcessor = (*spanGate)(nil)

func (g *spanGate) OnStart(ctx context.Context, s sdktrace.ReadWriteSpan) { g.next.OnStart(ctx, s) }

func (g *spanGate) OnEnd(s sdktrace.ReadOnlySpan) {
	if !s.SpanContext().IsSampled() {
		return // the batch processor ignores these too
	}
	if g.inFlight.Add(1) > g.limit {
		g.inFlight.Add(-1)
		g.dropped.Add(1)
		return
	}
	g.next.OnEnd(s)
}

// offer hands a whole span tree to the processor, or, when the queue cannot
// hold all of it, none of it (counted as dropped): a tree never arrives without
// its root. It reports whether the tree was taken.
func (g *spanGate) offer(tree []sdktrace.ReadOnlySpan) bool {
	n := int64(len(tree))
	if g.inFlight.Add(n) > g.limit {
		g.inFlight.Add(-n)
		g.dropped.Add(uint64(n))
		return false
	}
	for _, s := range tree {
		g.next.OnEnd(s)
	}
	return true
}

func (g *spanGate) Shutdown(ctx context.Context) error   { return g.next.Shutdown(ctx) }
func (g *spanGate) ForceFlush(ctx context.Context) error { return g.next.ForceFlush(ctx) }

// gatedExporter releases the gate's slots for the spans it is handed, and counts
// the spans of batches whose export failed (after the exporter's own retries) as
// dropped: they will not arrive. The error is logged once per transition and not
// returned: the batch processor would hand it to the global otel error handler,
// which logs every failed batch — a line per second for as long as a collector
// is down.
type gatedExporter struct {
	sdktrace.SpanExporter
	inFlight *atomic.Int64
	failed   *atomic.Uint64
	health   *exportHealth
}

func (e *gatedExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	e.inFlight.Add(-int64(len(spans)))
	err := e.SpanExporter.ExportSpans(ctx, spans)
	if err != nil {
		e.failed.Add(uint64(len(spans)))
	}
	e.health.observe(err)
	return nil
}

// countingMetricExporter counts failed metric exports. With cumulative
// temporality a failed round loses no observation, only freshness: the next
// successful round carries the totals. Like gatedExporter it logs once per
// transition and returns nil, keeping the periodic reader from logging each
// failed round through the global error handler.
type countingMetricExporter struct {
	sdkmetric.Exporter
	failed *atomic.Uint64
	health *exportHealth
}

func (e *countingMetricExporter) Export(ctx context.Context, rm *metricdata.ResourceMetrics) error {
	err := e.Exporter.Export(ctx, rm)
	if err != nil {
		e.failed.Add(1)
	}
	e.health.observe(err)
	return nil
}
