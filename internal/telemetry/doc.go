// Package telemetry turns the reconcile loop's reported trigger times into
// OpenTelemetry signals: one span tree and one point of the
// npagent.policy.programming.latency exponential histogram per reported trigger,
// the point carrying an exemplar that names the trace of that span tree.
//
// What it promises:
//
//   - One path: Report draws the span tree through the SDK's tracer, every span
//     started and ended with the record's timestamps (all known after the
//     commit), so resource, scope, ids, trace state and the span limits the SDK
//     reads from OTEL_SPAN_* and OTEL_ATTRIBUTE_* are the SDK's own. The tree:
//     root policy.program (trigger → commit) with the object's attributes, its
//     latency (npagent.policy.programming.latency, seconds) and, when its
//     point became an exemplar, npagent.exemplar=true; children delivery, queue, compute, and per commit
//     attempt a lock_wait (lock requested → acquired, when measured) then a
//     commit span carrying the attempt's non-zero phases
//     (npagent.commit.phase.merge, .compile, .attach, .write, .switch,
//     .cleanup, seconds); a failed attempt has error status and an exception
//     event. A valid traceparent annotation (the record's TraceParent) is, by
//     default (ParentingLink, KEP-5915), the target of one span link from a
//     root that starts a trace of its own: parenting would stretch the
//     writer's trace to the slowest node's commit, and a trace per node keeps
//     each node's sampling and exemplars its own. With ParentingChild
//     (--trace-parenting=child) it parents the root (trace id and state
//     inherited). An invalid one is counted and the root starts a trace with
//     no link.
//   - Report, Committed and ObserveCounts' collection never block on export and
//     never return errors. Report is safe for concurrent use. It checks the
//     record and hands a copy to one drawing goroutine (handoff.go), which wakes
//     every 20 ms and draws what is queued back to back, through the one path
//     below: between two reports a worker waits for an fsync, so a tree drawn on
//     the worker ran with cold caches at several times the cost. A trigger's
//     point is recorded when its tree is drawn: within 20 ms, and before any
//     scrape (MetricsHandler), ForceFlush or Shutdown, which drain the queue
//     first. When the queue is full, or once Shutdown has begun, the caller
//     draws the record itself: nothing is lost and memory stays bounded.
//   - Sampling is an sdktrace.Sampler (latency-aware, WithSampling), deciding
//     at the root's start from its latency start attribute; the children follow
//     the root. A trigger at least slowThreshold slow is always traced, even
//     under a remote parent that was not sampled (the node's part of a change is
//     worth keeping on its own) and whatever OTEL_TRACES_SAMPLER says. A faster
//     one passes the systematic fastFraction (exactly one in 1/fastFraction),
//     then, when OTEL_TRACES_SAMPLER is set, that sampler decides (it sees the
//     remote parent under ParentingChild, so parentbased_* follow the writer's
//     decision; under the default link the root has no parent and
//     parentbased_* decide as for a root; traceidratio thins by trace id);
//     unset, it is kept. With the default
//     threshold 0 every trigger is slow and OTEL_TRACES_SAMPLER changes nothing;
//     OTEL_TRACES_EXPORTER=none turns traces off.
//   - Every reported trigger is one histogram observation, whatever the sampling
//     decision for its trace. When the root is sampled, the tree's room in the
//     span queues is reserved before it is drawn (treeGate.reserve; Shutdown
//     waits for reserved trees), and only when a queue has room is the point
//     recorded in the root span's context, before the root ends; otherwise it
//     is recorded in a context holding no span. So the SDK's trace-based
//     exemplar filter gives exemplars only to sampled roots that will be
//     exported, and an exemplar never names a trace that was not sampled or was
//     dropped. With no span exporter at all no tree is drawn and no point
//     carries an exemplar.
//   - The exemplar mark is exact (exemplar.go): the latency histogram's
//     reservoir (markReservoir, through the View's
//     ExemplarReservoirProviderSelector) keeps the first measurement of each
//     latency octave per collection interval — at most 20 per kind and metric
//     reader — and, since the SDK offers it synchronously within Record, tells
//     the drawing code through the root's context that it kept it; only then
//     is the root marked npagent.exemplar=true (ExemplarMarkAttr), before it
//     ends. Record and the whole tree run on one goroutine (the drawing one, or
//     the caller's when the hand-off is full), so the mark cannot land after
//     End. Hence every exported exemplar names a marked root, unmarked traces
//     have no exemplar, and a tail-sampling tier that keeps every marked trace
//     keeps a bounded number of traces per interval and leaves no exemplar
//     dangling.
//   - Whole trees: the tracer's span processor (treeGate) holds the children
//     as they end until their root ends, then offers the whole tree to each
//     exporter's bounded queue, which takes all of it or none (a refused tree's
//     spans are counted as dropped). A tree never arrives without its root.
//   - Bounded everywhere: each exporter sits behind a queue of
//     OTEL_BSP_MAX_QUEUE_SIZE (or WithSpanQueueSize) spans in front of the SDK's
//     batch span processor; when it is full (collector down) trees are dropped
//     and counted, never queued without bound. A batch whose export fails is
//     counted as dropped; one in flight as the collector dies may have been
//     taken by it all the same (at-least-once: the count can exceed the true
//     loss by that one batch). Export trouble is logged once per transition
//     (failing, recovered), not per batch.
//   - Shutdown exports every tree a queue took and stops the exporters; a Report
//     racing it or after it still records its point and counts the spans that
//     will not be exported as dropped.
//   - Metrics are aggregated in memory and exported by a periodic reader
//     (cumulative temporality), so a collector outage loses no histogram
//     observations, only export rounds.
//   - A trigger whose commit precedes it (clock skew between the controller and
//     this node) yields no span and no point; it is counted under
//     npagent.policy.programming.rejected{reason="clock_skew"}.
//   - Each informer's watch health (npagent.watch.*: last arrival age, stalled,
//     established, errors by request, relists by cause) is exported from the same
//     Counts snapshot; the stall verdict is the reconcile loop's.
//   - The counters are read from their owners at collection (ObserveCounts)
//     and the attribute sets they are exported under are built once; distinct
//     field names are capped (beyond the cap they fold into "other"), so
//     cardinality stays bounded.
//   - Verdict counters (verdicts.go) are read from the dataplane's owner at
//     collection (ObserveVerdicts) and exported as npagent.policy.verdicts
//     (packets) and npagent.policy.verdict.bytes, by pod, direction, verdict,
//     reason, policy and rule. At most WithVerdictSeriesLimit series: later
//     ones fold into one otel.metric.overflow series per direction and verdict,
//     kept as a sum of increases (it never goes down when a folded counter
//     goes away), and are counted (npagent.policy.verdicts.overflowed).
//   - Flow events (flows.go), named by the reconcile loop (report.FlowEvent), are
//     OpenTelemetry log records (event npagent.flow, semantic-convention attribute
//     names) through the Logs SDK's batch processor, over OTLP when logs are on;
//     FlowFile writes them as rotated JSON lines. Their counters (emitted,
//     suppressed, dropped) are read at collection (ObserveFlows).
//
// Export: OTLP for traces and metrics, configured by the standard
// OTEL_EXPORTER_OTLP_* variables (endpoint, protocol, TLS, headers, timeout,
// compression), and a Prometheus registry served by MetricsHandler. The protocol
// (OTEL_EXPORTER_OTLP_{TRACES_,METRICS_,}PROTOCOL, the signal's own first) is grpc
// or http/protobuf; grpc is the default, deliberately unlike the specification,
// because the chart and the demo use the collector's 4317. Over http/protobuf the
// exporters append /v1/traces and /v1/metrics to OTEL_EXPORTER_OTLP_ENDPOINT and use
// a signal's own endpoint as given. New refuses, naming the variable, another
// protocol and an endpoint that is not an http:// or https:// URL (a scheme-less
// host:port, which the exporters would misread or replace by localhost). With
// WithLogger, the SDK's error handler and internal log write to that logger
// (otel.SetErrorHandler, otel.SetLogger: process-wide). The exponential
// histogram appears in the registry as a Prometheus native histogram, which only
// the protobuf exposition carries: a scraping Prometheus needs scrape_protocols
// with PrometheusProto first. A client that asks for a text format is warned
// about in the log, once per User-Agent (at most 16): nothing else would tell
// why the quantiles are empty.
//
// Nothing of Kubernetes is imported here: the reconcile loop hands over a plain
// Record.
package telemetry
