// Package otelcollector holds no code: it is the home of the OpenTelemetry
// Collector builds and configs npagent ships (builder-config.yaml, backends.yaml,
// debug.yaml, and the node and gateway tiers under gateway/), and of the test that
// runs the tiers with real collectors, a real Jaeger and a real Prometheus
// (tiers_test.go).
package otelcollector
