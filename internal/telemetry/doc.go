// Package telemetry turns the reconcile loop's reported trigger times into
// OpenTelemetry signals: one span tree and one point of the
// npagent.policy.programming.latency exponential histogram per reported trigger,
// the point carrying an exemplar that names the trace of that span tree.
//
// What it promises:
//
//   - Report, Suppressed, Delivered, CommitDone and InvalidObject never block on
//     export and never return errors, and do as little as possible on the
//     reconcile path. The counters are atomic totals the meter reads at each
//     collection. Report decides sampling and copies a traced record into the
//     build queue (a point alone, and CommitDone's duration, into a measurement
//     queue). A builder goroutine, woken every 20 ms or when a queue reaches a
//     tenth of its size (and asleep on the queues after a second with nothing
//     queued), parses the traceparent,
//     chooses the root's ids (the trace id inherited from a valid traceparent),
//     emits the span tree and records the histogram point in the root's
//     context, so its exemplar names the root. The builder hands finished
//     spans straight to the span queues, a whole tree or none of it (every
//     timestamp is known after the commit, so the tracer's live-span machinery
//     would be pure cost); they carry what the tracer would give them:
//     resource, scope, span limits, trace flags and state.
//   - Bounded everywhere: the build queue holds as many records as the span queue
//     holds spans; when it is full the tree is dropped, its spans counted as
//     dropped, and the point recorded without an exemplar. When the measurement
//     queue is full the point is recorded on the caller. Spans then go through a
//     bounded queue in front of the SDK's batch span processor; when it is full
//     (collector down) spans are dropped and counted, never queued without bound.
//     A batch whose export fails is counted as dropped; one in flight as the
//     collector dies may have been taken by it all the same (at-least-once: the
//     count can exceed the true loss by that one batch).
//   - Points and spans exist once the builder has reached them: within about
//     20 ms, and at the latest after ForceFlush, which builds and records
//     everything queued before flushing. A Prometheus scrape (MetricsHandler)
//     waits for the same; an OTLP metric export round does not, so a point
//     younger than 20 ms may leave in the next round. Shutdown stops admitting
//     work, waits for callers already admitted, builds what is queued, then
//     stops the builder; later Reports record their points directly and count
//     their spans as dropped. When OTEL_TRACES_SAMPLER is
//     set, Report does all of it itself, through the tracer, since only then
//     does it learn the SDK sampler's decision before recording the exemplar.
//   - Metrics are aggregated in memory and exported by a periodic reader
//     (cumulative temporality), so a collector outage loses no histogram
//     observations, only export rounds.
//   - Every reported trigger is one histogram observation, whatever the sampling
//     decision for its trace. Latency-aware sampling (WithSampling) decides before
//     any span exists: triggers slower than the threshold are always traced, a fixed
//     fraction of the faster ones are. An exemplar only ever names a trace that
//     was kept and taken by a span queue; with no span exporter at all no tree
//     is built and no point carries an exemplar. (With OTEL_TRACES_SAMPLER set,
//     spans pass the queues one by one, so a full queue can drop the root of a
//     tree whose point already names it; the drop is counted.)
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
