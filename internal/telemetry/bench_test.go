package telemetry

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/npagent/npagent/internal/report"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"golang.org/x/sys/unix"
)

// newBenchTelemetry exports spans to the SDK's no-op exporter (the batch
// processor and gate still run) and metrics to a manual reader, so the figures
// are the cost on the reporting goroutine, not network I/O.
func newBenchTelemetry(b *testing.B, opts ...Option) *Telemetry {
	b.Helper()
	opts = append([]Option{
		WithOTLP(false), WithNodeName("node-bench"),
		WithTraceExporter(tracetest.NewNoopExporter()),
		WithMetricReader(sdkmetric.NewManualReader()),
	}, opts...)
	tel, err := New(context.Background(), opts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	return tel
}

// BenchmarkReport is the cost of one fully traced trigger on the calling
// goroutine: the five-span tree through the tracer and the tree gate into the
// span queue, one histogram observation and its exemplar. The span queue is
// flushed to the exporter with the timer stopped every buildChunk reports so
// none is dropped (dropped-spans/op says so), since a tight loop outruns the
// batch processor.
func BenchmarkReport(b *testing.B) {
	tel := newBenchTelemetry(b)
	r := record(time.Now(), "pe-bench", 80*time.Millisecond)
	r.TraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		tel.Report(r)
		if n++; n%buildChunk == 0 {
			b.StopTimer()
			drain(b, tel)
			b.StartTimer()
		}
	}
	dropped, _ := tel.Dropped()
	b.ReportMetric(float64(dropped)/float64(n), "dropped-spans/op")
}

// BenchmarkReportAndBuild is the whole per-trigger work, Report plus the export
// of its spans: the span queue is flushed to the no-op exporter with the timer
// running. cpu-ns/op is the process's CPU per trigger, every goroutine included
// (batch span processor, GC): what a traced trigger costs the node in all.
func BenchmarkReportAndBuild(b *testing.B) {
	tel := newBenchTelemetry(b)
	r := record(time.Now(), "pe-bench", 80*time.Millisecond)
	r.TraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	b.ReportAllocs()
	n := 0
	cpuStart := processCPU()
	for b.Loop() {
		tel.Report(r)
		if n++; n%64 == 0 {
			drain(b, tel)
		}
	}
	drain(b, tel)
	b.ReportMetric(float64((processCPU()-cpuStart).Nanoseconds())/float64(n), "cpu-ns/op")
	dropped, _ := tel.Dropped()
	b.ReportMetric(float64(dropped)/float64(n), "dropped-spans/op")
}

// processCPU is this process's user+system CPU time so far.
func processCPU() time.Duration {
	var ru unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// buildChunk is how many Reports a benchmark makes before flushing the span
// queue, whose trees (5 spans each) must fit it (2048 spans by default) until
// drain hands them to the exporter, so nothing is dropped.
const buildChunk = 256

// drain flushes the queued spans to the exporter.
func drain(b *testing.B, tel *Telemetry) {
	if err := tel.tp.ForceFlush(context.Background()); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkReportNotSampled is a trigger whose trace latency-aware sampling drops:
// the histogram observation alone.
func BenchmarkReportNotSampled(b *testing.B) {
	tel := newBenchTelemetry(b, WithSampling(time.Hour, 0))
	r := record(time.Now(), "pe-bench", 80*time.Millisecond)
	b.ReportAllocs()
	for b.Loop() {
		tel.Report(r)
	}
}

// reconcileWork stands in for the CPU part of one reconcile of a changed
// PolicyEndpoint on a node with a few pods: derive per-pod rules from the policy
// (16 peers × 4 ports × 3 pods), sort them, serialise them and hash the result per
// pod and direction, as the dataplane does to skip unchanged content. It does no
// I/O: the map writes a real commit makes (~3.5 µs per entry, RECIPES.md) would only
// make telemetry's share smaller.
type reconcileWork struct {
	peers []netip.Prefix
	ports []uint16
	buf   []byte
}

type rule struct {
	pod    int
	prefix netip.Prefix
	port   uint16
	proto  uint8
}

func newReconcileWork() *reconcileWork {
	w := &reconcileWork{}
	for i := range 16 {
		w.peers = append(w.peers, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i), 0, 0}), 16+i%8))
	}
	w.ports = []uint16{53, 80, 443, 8080}
	return w
}

func (w *reconcileWork) run(pods int) [32]byte {
	rules := make([]rule, 0, pods*len(w.peers)*len(w.ports))
	for pod := range pods {
		for _, p := range w.peers {
			for _, port := range w.ports {
				rules = append(rules, rule{pod: pod, prefix: p, port: port, proto: 6})
			}
		}
	}
	slices.SortFunc(rules, func(a, b rule) int {
		if a.pod != b.pod {
			return a.pod - b.pod
		}
		if c := a.prefix.Addr().Compare(b.prefix.Addr()); c != 0 {
			return c
		}
		return int(a.port) - int(b.port)
	})
	var sum [32]byte
	for pod := range pods {
		for dir := range 2 {
			w.buf = w.buf[:0]
			for _, r := range rules {
				if r.pod != pod {
					continue
				}
				w.buf = r.prefix.Addr().AppendTo(w.buf)
				w.buf = append(w.buf, byte(r.prefix.Bits()), r.proto, byte(dir))
				w.buf = binary.BigEndian.AppendUint16(w.buf, r.port)
			}
			h := sha256.Sum256(w.buf)
			for i := range sum {
				sum[i] ^= h[i]
			}
		}
	}
	return sum
}

// threadCPU is the CPU time consumed by the calling OS thread. On a shared
// machine wall time includes waiting for a core; thread CPU time does not, so the
// on/off comparison below stays meaningful under load.
func threadCPU(b *testing.B) time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		b.Fatalf("clock_gettime(CLOCK_THREAD_CPUTIME_ID): %v", err)
	}
	return time.Duration(ts.Nano())
}

// BenchmarkReconcileTelemetryOnVsOff runs the same simulated reconcile with and
// without Report in one run, alternating in chunks so machine noise hits both
// alike, and reports both costs and their ratio, in wall time and in the
// benchmark thread's CPU time (goal: on/off ≤ 1.05). Export (the batch
// processor's goroutine) is not in the thread CPU figure; it runs on the other
// core and does show in wall time when it competes for it. dropped-spans/op
// tells whether the export kept pace.
func BenchmarkReconcileTelemetryOnVsOff(b *testing.B) {
	// keep-all is the default: every trigger traced. fast-10pct traces every
	// trigger slower than 1 s and one in ten of the faster ones (the 80 ms
	// triggers here): the histogram still counts all of them.
	for _, bc := range []struct {
		name string
		opts []Option
	}{
		{"keep-all", nil},
		{"fast-10pct", []Option{WithSampling(time.Second, 0.1)}},
	} {
		b.Run(bc.name, func(b *testing.B) { benchOnVsOff(b, bc.opts...) })
	}
}

func benchOnVsOff(b *testing.B, opts ...Option) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	tel := newBenchTelemetry(b, opts...)
	w := newReconcileWork()
	r := record(time.Now(), "pe-bench", 80*time.Millisecond)
	const chunk = 64
	var off, on, cpuOff, cpuOn time.Duration
	var ops int
	var sink byte
	b.ReportAllocs()
	for b.Loop() {
		start, cpuStart := time.Now(), threadCPU(b)
		for range chunk {
			s := w.run(3)
			sink ^= s[0]
		}
		mid, cpuMid := time.Now(), threadCPU(b)
		for range chunk {
			s := w.run(3)
			sink ^= s[0]
			tel.Report(r)
		}
		end, cpuEnd := time.Now(), threadCPU(b)
		off += mid.Sub(start)
		on += end.Sub(mid)
		cpuOff += cpuMid - cpuStart
		cpuOn += cpuEnd - cpuMid
		ops += chunk
	}
	_ = sink
	b.ReportMetric(float64(cpuOff.Nanoseconds())/float64(ops), "cpu-ns-off/reconcile")
	b.ReportMetric(float64(cpuOn.Nanoseconds())/float64(ops), "cpu-ns-on/reconcile")
	b.ReportMetric(float64(cpuOn)/float64(cpuOff), "cpu-on/off")
	b.ReportMetric(float64(on)/float64(off), "wall-on/off")
	dropped, _ := tel.Dropped()
	b.ReportMetric(float64(dropped)/float64(ops), "dropped-spans/op")
}

// BenchmarkReportThreadCPU is BenchmarkReport in the calling thread's CPU time,
// the figure to trust on a loaded machine.
func BenchmarkReportThreadCPU(b *testing.B) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	tel := newBenchTelemetry(b)
	r := record(time.Now(), "pe-bench", 80*time.Millisecond)
	r.TraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	b.ReportAllocs()
	var cpu time.Duration
	var ops int
	for b.Loop() {
		c := threadCPU(b)
		for range 64 {
			tel.Report(r)
		}
		cpu += threadCPU(b) - c
		ops += 64
		drain(b, tel) // outside the measured thread CPU: the export is not the caller's
	}
	dropped, _ := tel.Dropped()
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(ops), "cpu-ns/report")
	b.ReportMetric(float64(dropped)/float64(ops), "dropped-spans/op")
}

// ExampleTelemetry_Report shows the reconcile loop's side of the contract.
func ExampleTelemetry_Report() {
	tel, err := New(context.Background(), WithNodeName("node-a"), WithOTLP(false))
	if err != nil {
		panic(err)
	}
	defer tel.Shutdown(context.Background())
	trigger := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	r := &report.Record{
		Kind: report.KindPolicyEndpoint, Namespace: "shop", Name: "allow-frontend-abc12", UID: "5f0c…",
		PolicyRef: "allow-frontend", ResourceVersion: "81723",
		Trigger: trigger, Received: trigger.Add(35 * time.Millisecond),
		WorkerStart:  trigger.Add(36 * time.Millisecond),
		ComputeStart: trigger.Add(36 * time.Millisecond), ComputeEnd: trigger.Add(37 * time.Millisecond),
		Attempts: []report.Attempt{{Start: trigger.Add(37 * time.Millisecond), End: trigger.Add(41 * time.Millisecond)}},
		Pods:     2, Entries: 12,
	}
	tel.Report(r)
	fmt.Println(r.Latency())
	// Output: 41ms
}
