// Package record holds the hand-over type between the reconcile loop and telemetry:
// one reported trigger time, as plain data. It is a leaf package (standard library
// only), so the reconcile loop can build records without importing the OpenTelemetry
// SDK; package telemetry re-exports these names and turns records into signals.
package record

import "time"

// Policy kinds, the only values of npagent.policy.kind.
const (
	KindPolicyEndpoint        = "PolicyEndpoint"
	KindClusterPolicyEndpoint = "ClusterPolicyEndpoint"
)

// Record is one reported trigger time, handed over by the reconcile loop after a
// successful commit. Times are wall-clock. A zero time leaves out the child span
// it bounds; the root span needs Trigger and at least one attempt.
type Record struct {
	Kind            string // KindPolicyEndpoint or KindClusterPolicyEndpoint
	Namespace       string // "" for cluster-scoped
	Name            string
	UID             string
	PolicyRef       string // NetworkPolicy name (spec.policyRef), "" if none
	ResourceVersion string
	Trigger         time.Time // the annotation's trigger time: root span start
	Received        time.Time // informer event received: end of "delivery"
	WorkerStart     time.Time // worker picked the key: end of "queue"
	ComputeStart    time.Time // deriving per-pod rules: the "compute" span
	ComputeEnd      time.Time
	Attempts        []Attempt // every commit attempt for this trigger, oldest first; the last one succeeded
	Pods            int       // pods committed on this node
	Entries         int       // map entries written
	TraceParent     string    // W3C traceparent annotation value, "" if none
}

// Attempt is one dataplane commit attempt.
type Attempt struct {
	Start, End time.Time
	Err        string // "" = success
}

// Committed returns the end of the last attempt (the commit time), or the zero
// time when there was no attempt.
func (r *Record) Committed() time.Time {
	if len(r.Attempts) == 0 {
		return time.Time{}
	}
	return r.Attempts[len(r.Attempts)-1].End
}

// Latency is the programming latency: commit time minus trigger time. It is
// negative under clock skew.
func (r *Record) Latency() time.Duration { return r.Committed().Sub(r.Trigger) }
