package telemetry

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// The OTLP transports npagent exports over (OTEL_EXPORTER_OTLP_*PROTOCOL).
// http/json is left out: the Go SDK has no OTLP/JSON exporter.
const (
	protocolGRPC         = "grpc"
	protocolHTTPProtobuf = "http/protobuf"
	// defaultProtocol deviates from the specification's http/protobuf on
	// purpose: the chart, the demo and every documented endpoint use the
	// collector's gRPC port 4317, which an http/protobuf default would turn
	// into failing exports.
	defaultProtocol = protocolGRPC
)

// otlpProtocol resolves a signal's ("TRACES" or "METRICS") transport: the
// signal's own variable over the generic one, as the specification orders them.
func otlpProtocol(signal string) (string, error) {
	for _, key := range []string{"OTEL_EXPORTER_OTLP_" + signal + "_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		v, ok := os.LookupEnv(key)
		if !ok || strings.TrimSpace(v) == "" {
			continue
		}
		switch p := strings.TrimSpace(v); p {
		case protocolGRPC, protocolHTTPProtobuf:
			return p, nil
		default:
			return "", fmt.Errorf("%s=%q is not supported: want %s or %s", key, v, protocolGRPC, protocolHTTPProtobuf)
		}
	}
	return defaultProtocol, nil
}

// checkEndpoints validates the endpoint variables a signal reads. The SDK's
// exporters log an unparsable one outside the agent's logger and fall back to
// localhost, and take a scheme-less host:port for a URL whose scheme is the host,
// which gRPC resolves to no address 20 s later: both are refused here, naming the
// fix.
func checkEndpoints(signal string) error {
	for _, key := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_" + signal + "_ENDPOINT"} {
		v := os.Getenv(key)
		if v == "" {
			continue
		}
		u, err := url.Parse(v)
		if err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" {
			continue
		}
		// The fix, with the operator's host:port when there is one to keep.
		scheme, rest, hasScheme := strings.Cut(v, "://")
		hostPort := "host:port"
		switch {
		case !hasScheme:
			hostPort = v
		case scheme != "http" && scheme != "https" && rest != "":
			hostPort = rest
		}
		why := "is not an http:// or https:// URL"
		if err != nil {
			why = "does not parse (" + err.Error() + ")"
		}
		return fmt.Errorf("%s=%q %s: write http://%s for plaintext or https://%s for TLS", key, v, why, hostPort, hostPort)
	}
	return nil
}

// newTraceExporter builds the OTLP span exporter the environment asks for. The
// exporters read every other OTEL_EXPORTER_OTLP_* variable themselves (TLS,
// headers, timeout, compression; for http/protobuf the /v1/traces path appended
// to OTEL_EXPORTER_OTLP_ENDPOINT, a signal's own endpoint used as is).
func newTraceExporter(ctx context.Context) (sdktrace.SpanExporter, error) {
	protocol, err := otlpProtocol("TRACES")
	if err == nil {
		err = checkEndpoints("TRACES")
	}
	if err != nil {
		return nil, err
	}
	if protocol == protocolHTTPProtobuf {
		return otlptracehttp.New(ctx)
	}
	return otlptracegrpc.New(ctx, otlptracegrpc.WithDialOption(collectorReconnect))
}

// newMetricExporter is newTraceExporter for metrics. Cumulative whatever
// OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE says: Prometheus's OTLP
// endpoint rejects delta, and cumulative makes a failed export round lose
// nothing.
func newMetricExporter(ctx context.Context) (sdkmetric.Exporter, error) {
	protocol, err := otlpProtocol("METRICS")
	if err == nil {
		err = checkEndpoints("METRICS")
	}
	if err != nil {
		return nil, err
	}
	if protocol == protocolHTTPProtobuf {
		return otlpmetrichttp.New(ctx, otlpmetrichttp.WithTemporalitySelector(sdkmetric.DefaultTemporalitySelector))
	}
	return otlpmetricgrpc.New(ctx, otlpmetricgrpc.WithTemporalitySelector(sdkmetric.DefaultTemporalitySelector),
		otlpmetricgrpc.WithDialOption(collectorReconnect))
}

// routeSDKLogs sends what the OpenTelemetry SDK reports on its own — errors it
// handles (otel.Handle) and its internal log (bad OTEL_* values it ignores, such
// as malformed headers) — to l instead of the standard logger on stderr, so they
// are in the agent's format and stream. Both are process-wide: the last New with
// a logger wins, which in the agent is the only one. The SDK's internal log keeps
// its verbosity mapping (its warnings and info are logr V(1) and above, below
// slog's Info, hidden as the SDK's default logger hides them).
func routeSDKLogs(l *slog.Logger) {
	otel.SetLogger(logr.FromSlogHandler(l.Handler()))
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		l.Error("opentelemetry sdk error", "err", err)
	}))
}
