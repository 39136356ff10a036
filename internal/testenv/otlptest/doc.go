// Package otlptest runs a real OpenTelemetry Collector (the otelcol tool that
// hack/tools.sh builds) in front of an OTLP/HTTP sink inside the test, so tests see
// exactly what a collector delivers: StartCollector forwards OTLP/gRPC and
// OTLP/HTTP (each on a free loopback port) to a Sink with no sending queue, so
// "accepted by the collector" means "arrived" and a killed collector loses
// nothing it acknowledged.
//
// The Sink decodes what arrives with the OTLP protobuf types and hands each
// request to the test's callbacks; what to keep is the test's business.
package otlptest
