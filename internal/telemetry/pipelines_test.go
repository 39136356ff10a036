package telemetry

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"

	"github.com/npagent/npagent/internal/testenv"
	"github.com/npagent/npagent/internal/testenv/otlptest"
)

// These tests run the pipeline configs shipped in otel-collector/ unchanged, with
// only their environment variables pointing at servers inside the test.

// otlpGRPCTraceSink stands where Jaeger's OTLP/gRPC receiver would.
type otlpGRPCTraceSink struct {
	coltracepb.UnimplementedTraceServiceServer
	mu    sync.Mutex
	names []string
}

func (s *otlpGRPCTraceSink) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				s.names = append(s.names, sp.GetName())
			}
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func (s *otlpGRPCTraceSink) count(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int
	for _, x := range s.names {
		if x == name {
			n++
		}
	}
	return n
}

func startShippedCollector(t *testing.T, config string, env ...string) *otlptest.Collector {
	addr := otlptest.FreeLoopbackAddr(t)
	env = append(env, "OTLP_GRPC_ENDPOINT="+addr, "OTLP_HTTP_ENDPOINT="+otlptest.FreeLoopbackAddr(t))
	return otlptest.RunCollector(t, filepath.Join(testenv.RepoRoot(), "otel-collector", config), addr, env...)
}

func reportAndFlush(t *testing.T, tel *Telemetry, n int) {
	t.Helper()
	for i := range n {
		tel.Report(record(base, fmt.Sprintf("pe-%d", i), time.Duration(i+1)*7*time.Millisecond))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := tel.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if spans, exports := tel.Dropped(); spans != 0 || exports != 0 {
		t.Errorf("Dropped() = %d spans, %d metric exports", spans, exports)
	}
}

func TestBackendsPipeline(t *testing.T) {
	prom := newOTLPSink(t) // answers at /api/v1/otlp/v1/metrics like Prometheus
	jaeger := &otlpGRPCTraceSink{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, jaeger)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	promURL, _ := url.Parse(prom.URL)
	col := startShippedCollector(t, "backends.yaml",
		"PROMETHEUS_HOST="+promURL.Host, "JAEGER_OTLP_GRPC_ENDPOINT="+lis.Addr().String())
	tel := newCollectorTelemetry(t, col)
	const n = 10
	reportAndFlush(t, tel, n)

	testenv.Eventually(t, 20*time.Second, "traces at the Jaeger endpoint and the histogram at the Prometheus endpoint", func() bool {
		p := prom.lastLatencyPoint()
		return jaeger.count(SpanProgram) == n && p != nil && p.GetCount() == n
	})
	if got := jaeger.count(SpanCommit); got != n {
		t.Errorf("%d commit spans at the Jaeger endpoint, want %d", got, n)
	}
	if p := prom.lastLatencyPoint(); len(p.GetExemplars()) == 0 {
		t.Error("histogram point at the Prometheus endpoint has no exemplars")
	}
}

func TestDebugPipeline(t *testing.T) {
	col := startShippedCollector(t, "debug.yaml")
	tel := newCollectorTelemetry(t, col)
	reportAndFlush(t, tel, 3)
	testenv.Eventually(t, 20*time.Second, "the debug exporter to print the span and the histogram", func() bool {
		out := col.Logs()
		return strings.Contains(out, SpanProgram) && strings.Contains(out, LatencyName)
	})
}
