package main

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/npagent/npagent/internal/telemetry"
)

// TestOpenTelemetryDegradesOnMalformedResourceAttributes: a pair without "=" in
// OTEL_RESOURCE_ATTRIBUTES makes telemetry.New fail; openTelemetry logs it and
// returns telemetry built without the variable, saying so.
func TestOpenTelemetryDegradesOnMalformedResourceAttributes(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	t.Setenv("OTEL_METRICS_EXPORTER", "none")
	t.Setenv(envResourceAttributes, "k8s.cluster.name") // restored after the test
	ctx := context.Background()
	if tel, err := telemetry.New(ctx); err == nil {
		tel.Shutdown(ctx)
		t.Fatalf("telemetry.New accepted %s=%q; this test needs a value it rejects", envResourceAttributes, os.Getenv(envResourceAttributes))
	}

	var logs bytes.Buffer
	tel, degraded := openTelemetry(ctx, slog.New(slog.NewTextHandler(&logs, nil)), telemetry.WithNodeName("n"))
	if tel == nil {
		t.Fatalf("openTelemetry gave up (%s); want telemetry without %s", degraded, envResourceAttributes)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		tel.Shutdown(sctx)
	}()
	if !strings.Contains(degraded, envResourceAttributes+" ignored") {
		t.Errorf("degraded = %q, want it to name %s as ignored", degraded, envResourceAttributes)
	}
	if n := strings.Count(logs.String(), "level=ERROR"); n != 1 || !strings.Contains(logs.String(), envResourceAttributes) {
		t.Errorf("want the rejected configuration logged once, naming %s:\n%s", envResourceAttributes, logs.String())
	}
	if tel.MetricsHandler() == nil {
		t.Error("no metrics handler")
	}
}

func TestOpenTelemetryAsConfiguredIsNotDegraded(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	t.Setenv("OTEL_METRICS_EXPORTER", "none")
	t.Setenv(envResourceAttributes, "k8s.cluster.name=c1")
	var logs bytes.Buffer
	tel, degraded := openTelemetry(context.Background(), slog.New(slog.NewTextHandler(&logs, nil)))
	if tel == nil || degraded != "" {
		t.Fatalf("openTelemetry = %v, %q; want telemetry as configured", tel, degraded)
	}
	defer tel.Shutdown(context.Background())
	if os.Getenv(envResourceAttributes) != "k8s.cluster.name=c1" {
		t.Errorf("a valid %s was changed", envResourceAttributes)
	}
	if logs.Len() != 0 {
		t.Errorf("logged with a valid configuration:\n%s", logs.String())
	}
}

// TestInstanceIDIsTheNode: service.instance.id is the node name, stable across agent
// restarts (the SDK's default, a random UUID per process, started new series at each
// restart and emptied per-node panels), unless OTEL_RESOURCE_ATTRIBUTES sets it.
func TestInstanceIDIsTheNode(t *testing.T) {
	for _, tc := range []struct{ attrs, want string }{
		{"", "node-a"},
		{"k8s.cluster.name=prod", "node-a"},
		{"k8s.cluster.name=prod, service.instance.id=pod-xyz", ""},
		{"service.instance.id=pod-xyz", ""},
		{"service.instance.idx=1", "node-a"},
	} {
		if got := instanceID("node-a", tc.attrs); got != tc.want {
			t.Errorf("instanceID(node-a, %q) = %q, want %q", tc.attrs, got, tc.want)
		}
	}
}
