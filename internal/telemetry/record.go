package telemetry

import handover "github.com/npagent/npagent/internal/telemetry/record"

// The hand-over types live in the leaf package record, so the reconcile loop depends
// on them without depending on the OpenTelemetry SDK; these names are the same types.

// Policy kinds, the only values of npagent.policy.kind.
const (
	KindPolicyEndpoint        = handover.KindPolicyEndpoint
	KindClusterPolicyEndpoint = handover.KindClusterPolicyEndpoint
)

// Record is one reported trigger time (see package record).
type Record = handover.Record

// Attempt is one dataplane commit attempt (see package record).
type Attempt = handover.Attempt
