package report

import "time"

// Sink receives what the reconcile loop reports as it happens. Calls come from
// workers concurrently; they must not block and never fail.
//
// Counts are not pushed through the Sink: each count has one owner (the loop, the
// seen-set) that keeps it as an atomic total, and the Sink's implementation reads
// a Counts snapshot when it collects.
type Sink interface {
	// Report hands over one reported trigger, after a successful commit. r is
	// the Sink's to keep.
	Report(r *Record)
	// Committed records one commit attempt of an object of kind k, failed (Err
	// set) or not, whether or not it reported a trigger.
	Committed(k Kind, a *Attempt)
}

// Counts is a snapshot of cumulative counters, filled by their owners.
type Counts struct {
	// Deliveries counts informer deliveries and requeues (reconcile).
	Deliveries [NumKinds][NumCauses]uint64
	// Suppressed counts trigger observations and pending triggers not reported,
	// by reason; the Accepted slot is zero (seen).
	Suppressed [NumReasons]uint64
	// TriggerMissing counts object versions delivered without the trigger
	// annotation, by kind (reconcile): their programming latency cannot be
	// measured (a controller that does not stamp it).
	TriggerMissing [NumKinds]uint64
	// InvalidObjects counts rejected object versions by kind and field
	// (reconcile). Field names carry no indexes; their set is fixed by the code.
	InvalidObjects map[InvalidObject]uint64
	// SeenObjects and SeenPending are the seen-set's size: uids tracked, and
	// trigger times pending a commit (seen).
	SeenObjects, SeenPending int64
	// SeenOldestPendingAge is how long ago the oldest trigger still pending a
	// commit was stamped: the snapshot's time minus its trigger time, the latency
	// it will have if committed now; 0 when nothing is pending (seen).
	SeenOldestPendingAge time.Duration

	// Watch is each informer's watch health (reconcile).
	Watch [NumKinds]WatchHealth

	// PodsIsolated counts pods denied (node traffic excepted) because their
	// policy could not be committed or an object naming them has no valid
	// version: never left open (reconcile).
	PodsIsolated uint64
	// PodsUnisolable counts endpoints of rejected PolicyEndpoints with no valid
	// version that could not be isolated: their hostIP or podIP does not parse, so
	// a pod of this node among them cannot be found (and is left as it was).
	PodsUnisolable uint64
	// PodsStrictDenied is how many pods strict mode denies now (node traffic
	// excepted) because no policy selecting them is committed (reconcile).
	PodsStrictDenied int64
	// NodeAddrsLeftOut is how many of the node's own addresses the dataplane's
	// node set could not hold (capacity): traffic between pods and them is
	// policed like any peer's (cmd/npagent).
	NodeAddrsLeftOut int64
	// Maps is the dataplane's map use (bpfmaps), read at each collection.
	Maps DataplaneMaps
}

// DataplaneMaps is the dataplane's map use: entries held against capacity. A Max
// of 0 means the backend does not have or report that map.
type DataplaneMaps struct {
	// Entries are the policy maps shared by every pod, [ingress, egress][IPv4, IPv6].
	Entries [2][2]MapUse
	// Pods are the pods holding state; Conntrack the connection table.
	Pods, Conntrack MapUse
}

// MapUse is one map's entries held and capacity.
type MapUse struct{ Used, Max int64 }

// WatchHealth is one informer's list-and-watch health.
type WatchHealth struct {
	// Established: a watch is open now.
	Established bool
	// LastEvent is when the informer last received something from the apiserver:
	// a watch event or bookmark, a list, or a watch opened. Zero before the first.
	LastEvent time.Time
	// Age is how long ago LastEvent was when the snapshot was taken; while the
	// watch is down it is at least how long it has been down.
	Age time.Duration
	// Stalled: the watch has been down for longer than the configured bound,
	// or open and silent (no event, no bookmark, not reopened) for longer than
	// its own timeout plus the bound.
	Stalled bool
	// ListErrors and WatchErrors count failed list requests, and watch requests
	// that failed or watches that ended with an error (410 Gone excluded: that
	// is a relist, counted in Relists).
	ListErrors, WatchErrors uint64
	// Relists counts lists after the initial one, by cause.
	Relists [NumRelistCauses]uint64
	// Refused is why a ready apiserver last refused a list or watch request
	// (forbidden, unauthorized, not found), "" once one succeeds again: the
	// reflector retries it with its backoff, and nothing else will cure it.
	Refused string
}

// InvalidObject names a counter of rejected object versions.
type InvalidObject struct {
	Kind  Kind
	Field string // the field path without indexes, e.g. "spec.ingress.cidr"
}

// Discard is a Sink that drops everything.
type Discard struct{}

// Report implements Sink.
func (Discard) Report(*Record) {}

// Committed implements Sink.
func (Discard) Committed(Kind, *Attempt) {}

var _ Sink = Discard{}
