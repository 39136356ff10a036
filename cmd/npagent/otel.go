package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/npagent/npagent/internal/telemetry"
)

// envResourceAttributes is the one OTEL_* variable whose syntax telemetry.New
// rejects outright (a pair without "=", a bad escape).
const envResourceAttributes = "OTEL_RESOURCE_ATTRIBUTES"

// openTelemetry builds telemetry as the OTEL_* environment configures it. A bad
// setting must not stop enforcement (a crash loop would also stop it), so when
// telemetry.New fails, the error is logged once and the agent degrades a step at a
// time, keeping as much as works:
//
//  1. without OTEL_RESOURCE_ATTRIBUTES (removed from the process environment, which
//     telemetry reads): exports go on, without the operator's resource attributes;
//  2. also with OTLP export off: the Prometheus /metrics endpoint still serves every
//     instrument;
//  3. no telemetry at all (nil): policies are still enforced, nothing is measured,
//     /metrics answers 503.
//
// degraded says what was given up, for /readyz and the log; empty when nothing.
func openTelemetry(ctx context.Context, log *slog.Logger, opts ...telemetry.Option) (tel *telemetry.Telemetry, degraded string) {
	tel, err := telemetry.New(ctx, opts...)
	if err == nil {
		return tel, ""
	}
	log.Error("telemetry configuration rejected; running with less telemetry instead of exiting", "err", err)
	first := err
	if v := os.Getenv(envResourceAttributes); v != "" {
		os.Unsetenv(envResourceAttributes)
		if tel, err = telemetry.New(ctx, opts...); err == nil {
			degraded = fmt.Sprintf("telemetry: %s ignored (%v)", envResourceAttributes, first)
			log.Warn("telemetry degraded: "+envResourceAttributes+" ignored", "value", v)
			return tel, degraded
		}
	}
	if tel, err = telemetry.New(ctx, append(opts, telemetry.WithOTLP(false))...); err == nil {
		degraded = fmt.Sprintf("telemetry: OTLP export off, /metrics only (%v)", first)
		log.Warn("telemetry degraded: OTLP export off, /metrics only")
		return tel, degraded
	}
	log.Error("telemetry off: nothing is measured; policies are still enforced", "err", err)
	return nil, fmt.Sprintf("telemetry off (%v)", err)
}

// instanceID is the agent's service.instance.id: the node name, so that per-node
// series and dashboard panels keyed by it continue across agent restarts (one agent
// per node; the SDK's default is a random UUID per process, which starts a new series
// at every restart). An operator's service.instance.id in OTEL_RESOURCE_ATTRIBUTES
// (resourceAttrs) wins: then "" (no option) leaves it to the environment.
func instanceID(nodeName, resourceAttrs string) string {
	for _, kv := range strings.Split(resourceAttrs, ",") {
		if k, _, _ := strings.Cut(kv, "="); strings.TrimSpace(k) == "service.instance.id" {
			return ""
		}
	}
	return nodeName
}
