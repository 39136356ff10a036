package reconcile

import (
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/npagent/npagent/internal/report"
)

// Stats is a snapshot of the loop's counters, cumulative since New.
type Stats struct {
	// Deliveries counts informer deliveries and requeues, by Kind and Cause.
	Deliveries [report.NumKinds][report.NumCauses]uint64
	// Syncs counts keys a worker processed.
	Syncs uint64
	// Commits counts successful dataplane Commit calls (one per pod), Skipped included.
	Commits uint64
	// CommitsSkipped counts commits whose content was unchanged: nothing written.
	CommitsSkipped uint64
	// CommitFailures counts failed dataplane Commit and Remove calls.
	CommitFailures uint64
	// Removes counts pods removed from the dataplane: no policy selects them any more.
	Removes uint64
	// EntriesWritten counts map entries written by commits.
	EntriesWritten uint64
	// NoLocalWork counts syncs of objects with no pod on this node, now or before.
	NoLocalWork uint64
	// InvalidObjects counts rejected object versions (bad input, invalid trigger
	// annotation, or a merged policy the dataplane refuses).
	InvalidObjects uint64
	// TriggerMissing counts object versions delivered without the trigger
	// annotation, by Kind: nothing to measure them by (each version once).
	TriggerMissing [report.NumKinds]uint64
	// PodsIsolated counts pods denied (node traffic excepted) because their policy
	// could not be committed and they held no state, or because a PolicyEndpoint
	// naming them was rejected and has no valid version (in the directions it
	// names, each pod once per object): never left open.
	PodsIsolated uint64
	// PodsUnisolable counts endpoints of rejected PolicyEndpoints with no valid
	// version whose hostIP or podIP does not parse: a pod of this node among them
	// cannot be found, so it is not isolated.
	PodsUnisolable uint64
	// StrictDenials counts pods strict mode denied (node traffic excepted) because no
	// policy selecting them was committed: new pods, and pods whose last policy went.
	StrictDenials uint64
	// InterfaceWaits counts syncs that found a local pod's interface missing.
	InterfaceWaits uint64
	// Reports counts records handed to the Sink.
	Reports uint64
	// Objects is how many object keys the loop tracks; Pods how many local pods hold
	// committed state; PodsStrictDenied how many of those strict mode denies now,
	// until a policy selects them. Both count addresses: a dual-stack pod is two.
	Objects, Pods, PodsStrictDenied int
}

// DataplaneWrites is the number of dataplane calls that changed state: commits that
// were not skipped, and removes.
func (s Stats) DataplaneWrites() uint64 { return s.Commits - s.CommitsSkipped + s.Removes }

// Delivered returns the deliveries of one kind and cause.
func (s Stats) Delivered(k report.Kind, c report.Cause) uint64 { return s.Deliveries[k][c] }

type counters struct {
	deliveries     [report.NumKinds][report.NumCauses]atomic.Uint64
	triggerMissing [report.NumKinds]atomic.Uint64
	syncs          atomic.Uint64
	commits        atomic.Uint64
	commitsSkipped atomic.Uint64
	commitFailures atomic.Uint64
	removes        atomic.Uint64
	entriesWritten atomic.Uint64
	noLocalWork    atomic.Uint64
	invalidObjects atomic.Uint64
	interfaceWaits atomic.Uint64
	podsIsolated   atomic.Uint64
	podsUnisolable atomic.Uint64
	strictDenials  atomic.Uint64
	reports        atomic.Uint64

	// invalidByField splits invalidObjects by kind and field, for Counts.
	invalidMu      sync.Mutex
	invalidByField map[report.InvalidObject]uint64
}

// invalid counts one rejected object version of kind k in field.
func (c *counters) invalid(k report.Kind, field string) {
	c.invalidObjects.Add(1)
	c.invalidMu.Lock()
	if c.invalidByField == nil {
		c.invalidByField = map[report.InvalidObject]uint64{}
	}
	c.invalidByField[report.InvalidObject{Kind: k, Field: field}]++
	c.invalidMu.Unlock()
}

// Counts copies the counters the loop owns (deliveries by kind and cause,
// rejected object versions by kind and field) into dst, for telemetry.
func (c *Controller) Counts(dst *report.Counts) {
	for k := range dst.Deliveries {
		for cause := range dst.Deliveries[k] {
			dst.Deliveries[k][cause] = c.stats.deliveries[k][cause].Load()
		}
	}
	for k := range dst.TriggerMissing {
		dst.TriggerMissing[k] = c.stats.triggerMissing[k].Load()
	}
	c.stats.invalidMu.Lock()
	dst.InvalidObjects = maps.Clone(c.stats.invalidByField)
	c.stats.invalidMu.Unlock()
	c.watchCounts(dst, time.Now())
}

// Stats returns a snapshot of the counters.
func (c *Controller) Stats() Stats {
	var s Stats
	for k := range s.Deliveries {
		for cause := range s.Deliveries[k] {
			s.Deliveries[k][cause] = c.stats.deliveries[k][cause].Load()
		}
	}
	for k := range s.TriggerMissing {
		s.TriggerMissing[k] = c.stats.triggerMissing[k].Load()
	}
	s.Syncs = c.stats.syncs.Load()
	s.Commits = c.stats.commits.Load()
	s.CommitsSkipped = c.stats.commitsSkipped.Load()
	s.CommitFailures = c.stats.commitFailures.Load()
	s.Removes = c.stats.removes.Load()
	s.EntriesWritten = c.stats.entriesWritten.Load()
	s.NoLocalWork = c.stats.noLocalWork.Load()
	s.InvalidObjects = c.stats.invalidObjects.Load()
	s.InterfaceWaits = c.stats.interfaceWaits.Load()
	s.PodsIsolated = c.stats.podsIsolated.Load()
	s.PodsUnisolable = c.stats.podsUnisolable.Load()
	s.StrictDenials = c.stats.strictDenials.Load()
	s.Reports = c.stats.reports.Load()
	s.Objects, s.Pods, s.PodsStrictDenied = c.pods.size()
	return s
}
