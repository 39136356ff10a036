package reconcile

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/seen"
	"github.com/npagent/npagent/internal/telemetry"
)

// BenchmarkReconcileTelemetry is issue 5's comparison on the real loop: the whole
// reconcile of one genuine update with telemetry off, on (every trigger traced, the
// default) and sampled (WithSampling(100ms, 0.1): the sub-millisecond triggers here
// are "fast", so one in ten is traced; every one is still a histogram point).
//
// One op is one new trigger going the production path: the new object version enters
// the informer cache, the update handler observes its trigger (seen.Observe) and
// enqueues the key, a worker step (processNext) syncs it — compile, merge the pod's 10
// objects, commit to the dataplane — then seen.Committed persists the seen-set (write
// temp, fsync, rename, fsync dir; the state file lives in b.TempDir()) before the
// trigger is handed to the Sink. Only the apiserver and the informer's watch decoding
// are left out; they cost the same with telemetry on or off.
//
// Sub-benchmarks are named dataplane=…/telemetry=… so benchstat -col /telemetry puts
// the three side by side. Besides ns/op (wall, which includes the fsync waits) each
// reports cpu-ns/op: this process's user+system CPU per op, all goroutines included
// (the batch span processor's too), which other processes' load does not inflate.
func BenchmarkReconcileTelemetry(b *testing.B) {
	b.Run("dataplane=memory", func(b *testing.B) {
		benchTelemetryVariants(b, bpfmaps.NewMemory(), nil)
	})
	b.Run("dataplane=ebpf", func(b *testing.B) {
		if os.Geteuid() != 0 {
			b.Skip("needs root to load eBPF programs, pin maps under /sys/fs/bpf and create veth interfaces")
		}
		pin := filepath.Join("/sys/fs/bpf", fmt.Sprintf("npagent-reconcile-telemetry-bench-%d", os.Getpid()))
		b.Cleanup(func() { _ = os.RemoveAll(pin) })
		dp, err := bpfmaps.OpenEBPF(bpfmaps.EBPFOptions{PinPath: pin})
		if err != nil {
			b.Skipf("eBPF dataplane unavailable: %v", err)
		}
		b.Cleanup(func() { _ = dp.Close() })
		benchTelemetryVariants(b, dp, benchInterfaces(b, 10))
	})
}

// benchTelemetryVariants runs the three telemetry settings on one dataplane. The
// dataplane (and the eBPF programs and veths behind it) is shared; each variant gets
// its own controller, seen-set state file and Telemetry.
func benchTelemetryVariants(b *testing.B, dp bpfmaps.Dataplane, resolver InterfaceResolver) {
	b.Run("telemetry=off", func(b *testing.B) {
		benchTelemetrySync(b, dp, resolver, nil, nil)
	})
	b.Run("telemetry=on", func(b *testing.B) {
		spans := &discardSpanExporter{}
		benchTelemetrySync(b, dp, resolver, newOverheadTelemetry(b, spans), spans)
	})
	b.Run("telemetry=sampled", func(b *testing.B) {
		spans := &discardSpanExporter{}
		benchTelemetrySync(b, dp, resolver, newOverheadTelemetry(b, spans, telemetry.WithSampling(100*time.Millisecond, 0.1)), spans)
	})
}

// newOverheadTelemetry builds the production Telemetry with OTLP off and the spans going
// through the real bounded queue and batch span processor to spans, which discards
// them. Metrics are aggregated for the Prometheus registry New always builds.
func newOverheadTelemetry(b *testing.B, spans sdktrace.SpanExporter, opts ...telemetry.Option) *telemetry.Telemetry {
	b.Helper()
	opts = append([]telemetry.Option{
		telemetry.WithOTLP(false), telemetry.WithNodeName("node-" + benchNode), telemetry.WithTraceExporter(spans),
	}, opts...)
	tel, err := telemetry.New(context.Background(), opts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	return tel
}

// discardSpanExporter counts the spans the batch processor hands it and drops them.
type discardSpanExporter struct{ spans atomic.Int64 }

func (e *discardSpanExporter) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	e.spans.Add(int64(len(spans)))
	return nil
}

func (e *discardSpanExporter) Shutdown(context.Context) error { return nil }

// benchTelemetrySync measures genuine updates of 100 objects selecting 10 local pods
// (as BenchmarkSync does), through the event handler and a worker step, with a
// persisted seen-set. tel nil is telemetry off (the loop's discard sink).
func benchTelemetrySync(b *testing.B, dp bpfmaps.Dataplane, resolver InterfaceResolver, tel *telemetry.Telemetry, spans *discardSpanExporter) {
	const objects, pods = 100, 10
	if resolver == nil {
		r := newLookupTableResolver()
		for i := range pods {
			r.set(fmt.Sprintf("10.60.0.%d", i+1), 100+i)
		}
		resolver = r
	}
	set, err := seen.New(time.Now().Add(-time.Hour), seen.WithStatePath(filepath.Join(b.TempDir(), "seen.state")))
	if err != nil {
		b.Fatal(err)
	}
	var sink Sink // nil: New installs the discard sink, as the agent does with telemetry off
	if tel != nil {
		sink = tel
	}
	c, err := New(&rest.Config{Host: "https://127.0.0.1:1"}, Config{
		NodeIP: netip.MustParseAddr(benchNode), Dataplane: dp, Seen: set, Resolver: resolver, Sink: sink, Logger: testLogger(b),
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.queue.ShutDown)
	ctx := context.Background()
	store := c.informers[KindPolicyEndpoint].GetIndexer()
	h := c.handler(KindPolicyEndpoint)

	// The initial list: every object added and synced once (reported too: their
	// triggers are newer than the seen-set's start).
	pes := make([]*v1alpha1.PolicyEndpoint, objects)
	for i := range pes {
		pes[i] = benchPE(i, pods)
		pes[i].Annotations[v1alpha1.AnnotationLastChangeTriggerTime] = nextTrigger().Format(time.RFC3339Nano)
		if err := store.Add(pes[i]); err != nil {
			b.Fatal(err)
		}
		h.OnAdd(pes[i], true)
		if !c.processNext(ctx) {
			b.Fatal("worker stopped during the initial sync")
		}
	}
	if s := c.Stats(); s.Reports != objects {
		b.Fatalf("initial sync reported %d of %d triggers", s.Reports, objects)
	}

	before, seenBefore := c.Stats(), set.Stats()
	var spansBefore int64
	if tel != nil {
		if err := tel.ForceFlush(ctx); err != nil {
			b.Fatal(err)
		}
		spansBefore = spans.spans.Load()
	}
	cpuStart := cpuTime()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		old := pes[i%objects]
		pe := old.DeepCopy()
		pe.ResourceVersion = strconv.Itoa(100000 + i)
		pe.Spec.Ingress[0].Ports[0].Port = ptr(int32(1000 + i%20000))
		pe.Annotations[v1alpha1.AnnotationLastChangeTriggerTime] = nextTrigger().Format(time.RFC3339Nano)
		if err := store.Update(pe); err != nil {
			b.Fatal(err)
		}
		pes[i%objects] = pe
		h.OnUpdate(old, pe)
		if !c.processNext(ctx) {
			b.Fatal("worker stopped")
		}
		i++
	}
	cpu := cpuTime() - cpuStart
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")

	// Every op was a genuine update that wrote, persisted and reported one trigger.
	s, ss := c.Stats(), set.Stats()
	if n := s.Reports - before.Reports; n != uint64(b.N) {
		b.Fatalf("%d reports for %d new triggers", n, b.N)
	}
	if w := s.DataplaneWrites() - before.DataplaneWrites(); w < uint64(b.N) {
		b.Fatalf("%d dataplane writes for %d genuine updates", w, b.N)
	}
	if p := ss.Persists - seenBefore.Persists; p < uint64(b.N) {
		b.Fatalf("%d seen-set state writes for %d reports (persist errors: %d)", p, b.N, ss.PersistErrors)
	}
	if tel == nil {
		return
	}
	// The spans were really processed: flushed through the batch processor to the
	// exporter, or counted as dropped by the bounded queue.
	if err := tel.ForceFlush(ctx); err != nil {
		b.Fatal(err)
	}
	dropped, _ := tel.Dropped()
	exported := spans.spans.Load() - spansBefore
	if exported+int64(dropped) == 0 {
		b.Fatalf("no span reached the exporter or the drop count for %d reports", b.N)
	}
	b.Logf("N=%d: %d spans exported, %d dropped", b.N, exported, dropped)
}
