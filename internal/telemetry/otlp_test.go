package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/npagent/npagent/internal/testenv"
	"github.com/npagent/npagent/internal/testenv/otlptest"
)

// otlpEnv are the variables these tests set; each test starts from none of them.
var otlpEnv = []string{
	"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
	"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
	"OTEL_EXPORTER_OTLP_HEADERS", "OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER",
}

func setOTLPEnv(t *testing.T, env map[string]string) {
	t.Helper()
	for _, k := range otlpEnv {
		t.Setenv(k, env[k])
	}
}

// newShutdown is New with a Shutdown at cleanup that waits for nothing.
func newShutdown(t *testing.T, opts ...Option) (*Telemetry, error) {
	t.Helper()
	tel, err := New(context.Background(), opts...)
	if err == nil {
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = tel.Shutdown(ctx)
		})
	}
	return tel, err
}

// An endpoint the exporters would misread (a scheme-less host:port, which the
// gRPC exporter dialled as an unknown scheme and reported "produced zero
// addresses" 20 s later) or could not parse (logged outside the agent's logger,
// then localhost) is refused by New with the variable, the value and the fix.
func TestOTLPEndpointRejected(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want []string // substrings of the error
	}{
		{"no scheme", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "otel-collector:4317"},
			[]string{`OTEL_EXPORTER_OTLP_ENDPOINT="otel-collector:4317"`, "http://otel-collector:4317 for plaintext", "https://otel-collector:4317 for TLS"}},
		{"ip without scheme", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "10.0.0.7:4317"},
			[]string{`OTEL_EXPORTER_OTLP_ENDPOINT="10.0.0.7:4317"`, "http://10.0.0.7:4317"}},
		{"unparsable", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://[::1:4317"},
			[]string{`OTEL_EXPORTER_OTLP_ENDPOINT="http://[::1:4317" does not parse`, "missing ']' in host", "http://host:port for plaintext"}},
		{"other scheme", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "grpc://c:4317"},
			[]string{`OTEL_EXPORTER_OTLP_ENDPOINT="grpc://c:4317"`, "http://c:4317 for plaintext"}},
		{"traces endpoint", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "c:4318/v1/traces", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
			[]string{`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="c:4318/v1/traces"`, "http://c:4318/v1/traces"}},
		{"metrics endpoint", map[string]string{"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://"},
			[]string{`OTEL_EXPORTER_OTLP_METRICS_ENDPOINT="http://" is not an http:// or https:// URL`, "http://host:port"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setOTLPEnv(t, tc.env)
			_, err := newShutdown(t)
			if err == nil {
				t.Fatalf("New accepted %v", tc.env)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}

	// Only the endpoints of exported signals are checked: the agent's fallback
	// without OTLP (WithOTLP(false)) must start whatever they say.
	setOTLPEnv(t, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "otel-collector:4317"})
	if _, err := newShutdown(t, WithOTLP(false)); err != nil {
		t.Errorf("New without OTLP rejected the endpoint: %v", err)
	}
	setOTLPEnv(t, map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "c:4317", "OTEL_TRACES_EXPORTER": "none"})
	if _, err := newShutdown(t); err != nil {
		t.Errorf("New rejected the endpoint of a signal that is off: %v", err)
	}
}

// OTEL_EXPORTER_OTLP_*PROTOCOL: grpc and http/protobuf, the signal's own
// variable first, grpc by default; anything else is refused by name.
func TestOTLPProtocol(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		env                  map[string]string
		wantTraces, wantMetr string
	}{
		{name: "default", wantTraces: "grpc", wantMetr: "grpc"},
		{name: "generic", env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, wantTraces: "http/protobuf", wantMetr: "http/protobuf"},
		{name: "signal wins", env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "grpc"},
			wantTraces: "http/protobuf", wantMetr: "grpc"},
		{name: "traces only", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, wantTraces: "http/protobuf", wantMetr: "grpc"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setOTLPEnv(t, tc.env)
			if got, err := otlpProtocol("TRACES"); got != tc.wantTraces || err != nil {
				t.Errorf("traces protocol %q, %v; want %q", got, err, tc.wantTraces)
			}
			if got, err := otlpProtocol("METRICS"); got != tc.wantMetr || err != nil {
				t.Errorf("metrics protocol %q, %v; want %q", got, err, tc.wantMetr)
			}
		})
	}
	for _, key := range []string{"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"} {
		for _, v := range []string{"http/json", "http", "HTTP/PROTOBUF"} {
			t.Run(key+"="+v, func(t *testing.T) {
				setOTLPEnv(t, map[string]string{key: v})
				_, err := newShutdown(t, WithOTLP(true))
				if err == nil {
					t.Fatalf("New accepted %s=%s", key, v)
				}
				if want := fmt.Sprintf("%s=%q is not supported: want grpc or http/protobuf", key, v); !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			})
		}
	}
}

// Over http/protobuf, spans and metrics reach a real collector's OTLP/HTTP
// receiver, from the base endpoint (/v1/traces and /v1/metrics appended by the
// exporters).
func TestOTLPHTTPThroughRealCollector(t *testing.T) {
	sink := newOTLPSink(t)
	col := otlptest.StartCollector(t, sink.URL)
	setOTLPEnv(t, map[string]string{
		"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://" + col.HTTPAddr,
	})
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
	tel, err := New(context.Background(), WithNodeName("node-http"), WithMeterExportInterval(200*time.Millisecond))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	const n = 10
	start := time.Now().Add(-time.Hour)
	for i := range n {
		tel.Report(record(start.Add(time.Duration(i)*time.Minute), fmt.Sprintf("pe-http-%d", i), 20*time.Millisecond))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := tel.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown (flush through the collector): %v", err)
	}
	testenv.Eventually(t, 20*time.Second, "spans and the latency histogram over OTLP/HTTP", func() bool {
		spans, _ := sink.snapshot()
		p := sink.lastLatencyPoint()
		return len(spans) >= n*5 && p != nil && p.GetCount() >= n
	})
	if dropped, failed := tel.Dropped(); dropped != 0 || failed != 0 {
		t.Errorf("Dropped() = %d spans, %d metric exports with a healthy collector", dropped, failed)
	}
	if out := col.Logs(); strings.Contains(out, "error") {
		t.Logf("collector output:\n%s", out)
	}
}

// Over http/protobuf a signal's own endpoint is used as is and the base endpoint
// gets the signal's path, as the specification says (the exporters do it; this
// checks they do it from the environment New hands them). The sink serves
// /v1/traces, /v1/metrics and /api/v1/otlp/v1/metrics, and answers 404 elsewhere.
func TestOTLPHTTPEndpointPaths(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  func(sinkURL string) map[string]string
	}{
		{"base gets the signal paths", func(u string) map[string]string {
			return map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": u}
		}},
		{"signal endpoints as is", func(u string) map[string]string {
			return map[string]string{
				"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT":  u + "/v1/traces",
				"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": u + "/api/v1/otlp/v1/metrics",
			}
		}},
		{"base with a path", func(u string) map[string]string {
			// Prometheus's OTLP receiver as the base: metrics to /api/v1/otlp/v1/metrics.
			return map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": u + "/api/v1/otlp", "OTEL_TRACES_EXPORTER": "none"}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sink := newOTLPSink(t)
			env := tc.env(sink.URL)
			env["OTEL_EXPORTER_OTLP_PROTOCOL"] = "http/protobuf"
			setOTLPEnv(t, env)
			t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
			tel, err := New(context.Background(), WithMeterExportInterval(100*time.Millisecond))
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			tel.Report(record(time.Now().Add(-time.Hour), "pe-path", 20*time.Millisecond))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := tel.Shutdown(ctx); err != nil {
				t.Fatalf("Shutdown: %v", err)
			}
			wantSpans := 5
			if env["OTEL_TRACES_EXPORTER"] == "none" {
				wantSpans = 0
			}
			spans, _ := sink.snapshot()
			p := sink.lastLatencyPoint()
			if len(spans) != wantSpans || p.GetCount() != 1 {
				t.Errorf("sink got %d spans and a latency count of %d, want %d and 1 (from %v)", len(spans), p.GetCount(), wantSpans, env)
			}
			if dropped, failed := tel.Dropped(); dropped != 0 || failed != 0 {
				t.Errorf("Dropped() = %d spans, %d metric exports: an endpoint path was wrong", dropped, failed)
			}
		})
	}
}

// failingExporter fails every export, as an exporter whose collector is gone.
type failingExporter struct{}

func (failingExporter) Temporality(k sdkmetric.InstrumentKind) metricdata.Temporality {
	return sdkmetric.DefaultTemporalitySelector(k)
}

func (failingExporter) Aggregation(k sdkmetric.InstrumentKind) sdkmetric.Aggregation {
	return sdkmetric.DefaultAggregationSelector(k)
}

func (failingExporter) Export(context.Context, *metricdata.ResourceMetrics) error {
	return errors.New("collector unreachable: test export failure")
}

func (failingExporter) ForceFlush(context.Context) error { return nil }
func (failingExporter) Shutdown(context.Context) error   { return nil }

// The SDK's own reports go to the logger given to New, not to the standard
// logger on stderr: errors it handles (here a metric reader whose export
// fails, which the SDK passes to otel.Handle), and its internal log (here a
// malformed OTEL_EXPORTER_OTLP_HEADERS, which the exporter ignores with a line).
func TestSDKErrorsThroughLogger(t *testing.T) {
	prev := otel.GetErrorHandler()
	t.Cleanup(func() {
		otel.SetErrorHandler(prev)
		otel.SetLogger(logr.FromSlogHandler(slog.Default().Handler()))
	})
	sink := newOTLPSink(t)
	setOTLPEnv(t, map[string]string{
		"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
		"OTEL_EXPORTER_OTLP_ENDPOINT": sink.URL,
		"OTEL_EXPORTER_OTLP_HEADERS":  "no-equals-sign",
	})
	logs := &testenv.LogBuffer{}
	failing := sdkmetric.NewPeriodicReader(failingExporter{}, sdkmetric.WithInterval(50*time.Millisecond))
	_, err := newShutdown(t, WithLogger(slog.New(slog.NewTextHandler(logs, nil))), WithMetricReader(failing))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	testenv.Eventually(t, 10*time.Second, "the SDK's export error in the agent's log", func() bool {
		return strings.Contains(logs.String(), "test export failure")
	})
	out := logs.String()
	if !strings.Contains(out, `level=ERROR msg="opentelemetry sdk error" err="collector unreachable: test export failure"`) {
		t.Errorf("the handled export error is not an ERROR line of the logger:\n%s", out)
	}
	if !strings.Contains(out, "parse headers") || !strings.Contains(out, "no-equals-sign") {
		t.Errorf("the SDK's line about the malformed OTEL_EXPORTER_OTLP_HEADERS is not in the logger:\n%s", out)
	}
}
