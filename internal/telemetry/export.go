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

	mu     sync.RWMutex // offer and reserve hold it shared; close exclusively
	closed bool
	// reservations: trees reserved (reserve) and not yet offered or released;
	// shutdown waits for them, so a reserved tree reaches the processor before
	// the processor drains.
	reservations sync.WaitGroup
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

// reserve makes room for a tree of n spans before it is drawn, so the drawing
// code knows before the root ends that the tree will be taken (and may record
// the point whose exemplar names it, and mark the root). A reservation is
// settled by offerReserved or release.
func (g *spanGate) reserve(n int64) bool {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.closed {
		return false
	}
	if g.inFlight.Add(n) > g.limit {
		g.inFlight.Add(-n)
		return false
	}
	g.reservations.Add(1)
	return true
}

// offerReserved hands a tree reserved with n spans to the processor, even once
// the gate is closed (shutdown waits for it). A tree that came out smaller than
// reserved (spans the SDK did not record) gives the difference back.
func (g *spanGate) offerReserved(tree []sdktrace.ReadOnlySpan, n int64) {
	defer g.reservations.Done()
	g.inFlight.Add(int64(len(tree)) - n)
	for _, s := range tree {
		g.next.OnEnd(s)
	}
}

// release gives back a reservation of n spans whose tree never reached the gate.
func (g *spanGate) release(n int64) {
	g.inFlight.Add(-n)
	g.reservations.Done()
}

// shutdown closes the gate, waits for the trees already reserved (within ctx),
// then stops the processor, which exports what it holds (within ctx).
func (g *spanGate) shutdown(ctx context.Context) error {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	settled := make(chan struct{})
	go func() { // ends when the last reservation settles: a drawn root always does
		g.reservations.Wait()
		close(settled)
	}()
	select {
	case <-settled:
	case <-ctx.Done():
	}
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
// start context (withGatedTree): to reserve room for it before drawing, to read
// seen after the root ended, and for markReservoir to say it kept the point.
type gatedTree struct {
	spans []sdktrace.ReadOnlySpan
	// seen: the root's end reached the gate (not so once the provider is shut
	// down); accepted: at least one exporter's queue took the tree.
	seen, accepted bool
	// reserved, per gate: reserve made room for size spans there. held: a
	// reservation is outstanding (set by reserve, cleared when the root's end
	// offers the tree or release gives it back); without one a tree is offered
	// as it comes.
	reserved []bool
	size     int64
	held     bool
	// exemplar: the latency reservoir kept this tree's point (markReservoir).
	exemplar bool
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
	if tree.held {
		tree.accepted = g.offerReserved(tree)
	} else {
		tree.accepted = g.offer(tree.spans)
	}
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

// reserve makes room for tree, of n spans, in every exporter's queue that has
// it, and reports whether any has: then the tree will be taken when its root
// ends (see spanGate.reserve).
func (g *treeGate) reserve(tree *gatedTree, n int) bool {
	tree.reserved, tree.size, tree.held = tree.reserved[:0], int64(n), true
	room := false
	for _, sg := range g.gates {
		ok := sg.reserve(tree.size)
		tree.reserved = append(tree.reserved, ok)
		room = room || ok
	}
	return room
}

// offerReserved hands a reserved tree to the gates that made room for it and
// counts it as dropped at the others.
func (g *treeGate) offerReserved(tree *gatedTree) bool {
	tree.held = false
	taken := false
	for i, sg := range g.gates {
		if tree.reserved[i] {
			sg.offerReserved(tree.spans, tree.size)
			taken = true
		} else {
			sg.dropped.Add(uint64(len(tree.spans)))
		}
	}
	return taken
}

// release gives back the reservations of a tree whose root's end never reached
// the gate.
func (g *treeGate) release(tree *gatedTree) {
	if !tree.held {
		return
	}
	tree.held = false
	for i, sg := range g.gates {
		if tree.reserved[i] {
			sg.release(tree.size)
		}
	}
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
	if err != nil && errors.Is(ctx.Err(), context.Canceled) {
		// The periodic reader cancels a round still in flight when it shuts down,
		// then exports once more itself: our own shutdown, not a failing collector.
		// A slow collector ends a round by its deadline instead, and counts.
		return nil
	}
	if err != nil {
		e.failed.Add(1)
	}
	e.health.observe(err)
	return nil
}
