// Command churn plays the policy controller against a cluster: it creates,
// updates and deletes PolicyEndpoint objects at a given rate, each write stamped
// with the trigger annotation (RFC3339Nano, UTC, the time of the write) and a W3C
// traceparent annotation, so npagent has real changes to measure.
//
// Usage:
//
//	churn --kubeconfig=kc --host-ip=10.0.0.5 --local-pod-ips=10.250.0.2,10.250.0.3 \
//	      --objects=20 --rate=10 --duration=30s
//
// It first creates --objects objects and --static-objects more (one trigger each;
// the static ones never change again, so a relist re-delivers them unchanged), then, until --duration
// has passed since the start, picks an object at random at --rate writes per second
// and changes its spec with a new trigger (or, with --recreate-fraction, deletes and
// recreates it: a new UID). Every object selects one pod on --host-ip (taken in turn
// from --local-pod-ips) and --remote-pods pods on other nodes, which npagent on
// --host-ip must ignore.
//
// When OTEL_EXPORTER_OTLP_ENDPOINT is set, each write is also a span
// ("policy.change", service churn) exported over OTLP gRPC, and the traceparent
// annotation names it: npagent's span for the change then joins that trace. Without
// it the traceparent carries random ids, marked sampled.
//
// At the end it prints one JSON object on stdout (and to --summary-file): the triggers it wrote (creates +
// updates + recreates that succeeded), per operation, and the write errors.
package main
