// Package telemetry turns the reconcile loop's reported trigger times into
// OpenTelemetry signals: one span tree and one point of the
// npagent.policy.programming.latency exponential histogram per reported trigger,
// the point carrying an exemplar that names the trace of that span tree.
//
// What it promises:
//
//   - Report, Suppressed, Delivered, CommitDone and InvalidObject never block on
//     export and never return errors. Spans go through a bounded queue in front of
//     the SDK's batch span processor; when it is full (collector down) spans are
//     dropped and counted, never queued without bound. Metrics are aggregated in
//     memory and exported by a periodic reader (cumulative temporality), so a
//     collector outage loses no histogram observations, only export rounds.
//   - Every reported trigger is one histogram observation, whatever the sampling
//     decision for its trace. Latency-aware sampling (WithSampling) decides before
//     any span exists: triggers slower than the threshold are always traced, a fixed
//     fraction of the faster ones are; an exemplar only ever names a kept trace.
//   - A trigger whose commit precedes it (clock skew between the controller and
//     this node) yields no span and no point; it is counted under
//     npagent.policy.programming.rejected{reason="clock_skew"}.
//   - Suppressed and Delivered allocate nothing: their attribute sets are built once
//     and cached (distinct label pairs are capped; beyond the cap they fold into
//     "other", so cardinality stays bounded).
//
// Export: OTLP gRPC for traces and metrics, configured by the standard
// OTEL_EXPORTER_OTLP_* variables (endpoint, TLS, headers, timeout, compression), and
// a Prometheus registry served by MetricsHandler. The exponential histogram appears
// there as a Prometheus native histogram, which only the protobuf exposition
// carries: a scraping Prometheus needs scrape_protocols with PrometheusProto first.
//
// Nothing of Kubernetes is imported here: the reconcile loop hands over a plain
// Record.
package telemetry
