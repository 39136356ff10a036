package telemetry

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
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
// tree only while the spans admitted and not yet handed to the exporter (inFlight,
// decremented by gatedExporter) stay within limit; with the processor's queue
// sized to the same limit it never overflows, and every span that does not reach
// the exporter is counted here. The processor runs in drop mode, so offer never
// blocks. Once the gate is closed (Shutdown) it admits nothing more: a tree is
// either in the processor's queue before the processor's Shutdown drains it, or
// counted as dropped.
type spanGate struct {
	next     sdktrace.SpanProcessor
	limit    int64
	inFlight *atomic.Int64
	dropped  *atomic.Uint64

	mu     sync.RWMutex // offer holds it shared; close exclusively
	closed bool
}

// offer hands a whole span tree to the processor, or, when the queue cannot
// hold all of it, none of it (counted as dropped): a tree never arrives without
// its root. It reports whether the tree was taken.
func (g *spanGate) offer(tree []sdktrace.ReadOnlySpan) bool {
	n := int64(len(tree))
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.closed {
		g.dropped.Add(uint64(n))
		return false
	}
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

// shutdown closes the gate, then stops the processor, which exports what it
// holds (within ctx).
func (g *spanGate) shutdown(ctx context.Context) error {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	return g.next.Shutdown(ctx)
}

// treeGate is the span processor behind the tracer. It holds the spans of a
// tree as they end (Report ends the children first) until their root ends, then
// offers the whole tree to each exporter's spanGate, so a queue near its limit
// never exports children without their root, and Report learns whether any
// queue took the tree before it records the point whose exemplar would name it.
//
// A tree is a root (a span with no parent, or a remote one) and its direct
// children: what Report draws. A span whose parent is not a pending root (none
// of Report's) is offered on its own. Only sampled spans are handled; the batch
// processor would ignore the others too.
type treeGate struct {
	gates []*spanGate // one per exporter: bounded queue, then batch span processor

	mu      sync.Mutex
	pending map[trace.SpanID]*gatedTree // by root span id, from its start to its end
}

// gatedTree is one tree in the gate. Report passes its own through the root's
// start context (withGatedTree) to read seen and accepted after the root ended.
type gatedTree struct {
	spans []sdktrace.ReadOnlySpan
	// seen: the root's end reached the gate (not so once the provider is shut
	// down); accepted: at least one exporter's queue took the tree.
	seen, accepted bool
}

type gatedTreeKey struct{}

// withGatedTree returns ctx carrying tree, for the root span's start.
func withGatedTree(ctx context.Context, tree *gatedTree) context.Context {
	return context.WithValue(ctx, gatedTreeKey{}, tree)
}

var _ sdktrace.SpanProcessor = (*treeGate)(nil)

func newTreeGate(gates []*spanGate) *treeGate {
	return &treeGate{gates: gates, pending: map[trace.SpanID]*gatedTree{}}
}

// localChild reports whether parent makes a span a child within this process.
func localChild(parent trace.SpanContext) bool { return parent.IsValid() && !parent.IsRemote() }

func (g *treeGate) OnStart(ctx context.Context, s sdktrace.ReadWriteSpan) {
	if !s.SpanContext().IsSampled() || localChild(s.Parent()) {
		return
	}
	tree, _ := ctx.Value(gatedTreeKey{}).(*gatedTree)
	if tree == nil {
		tree = &gatedTree{}
	}
	g.mu.Lock()
	g.pending[s.SpanContext().SpanID()] = tree
	g.mu.Unlock()
}

func (g *treeGate) OnEnd(s sdktrace.ReadOnlySpan) {
	if !s.SpanContext().IsSampled() {
		return
	}
	if parent := s.Parent(); localChild(parent) {
		g.mu.Lock()
		tree := g.pending[parent.SpanID()]
		if tree != nil {
			tree.spans = append(tree.spans, s)
		}
		g.mu.Unlock()
		if tree == nil {
			g.offer([]sdktrace.ReadOnlySpan{s})
		}
		return
	}
	id := s.SpanContext().SpanID()
	g.mu.Lock()
	tree := g.pending[id]
	delete(g.pending, id)
	g.mu.Unlock()
	if tree == nil {
		tree = &gatedTree{}
	}
	tree.spans = append(tree.spans, s)
	tree.seen = true
	tree.accepted = g.offer(tree.spans)
	clear(tree.spans) // the queues hold the spans themselves, not this slice
	tree.spans = tree.spans[:0]
}

// offer hands tree to every exporter's gate and reports whether any took it.
func (g *treeGate) offer(tree []sdktrace.ReadOnlySpan) bool {
	taken := false
	for _, sg := range g.gates {
		if sg.offer(tree) {
			taken = true
		}
	}
	return taken
}

// forget drops a pending tree whose root's end never reached the gate (the
// provider was shut down in between); its spans are counted by the caller.
func (g *treeGate) forget(root trace.SpanID) {
	g.mu.Lock()
	delete(g.pending, root)
	g.mu.Unlock()
}

func (g *treeGate) Shutdown(ctx context.Context) error {
	var errs []error
	for _, sg := range g.gates {
		errs = append(errs, sg.shutdown(ctx))
	}
	return errors.Join(errs...)
}

func (g *treeGate) ForceFlush(ctx context.Context) error {
	var errs []error
	for _, sg := range g.gates {
		errs = append(errs, sg.next.ForceFlush(ctx))
	}
	return errors.Join(errs...)
}

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
