package report

import "time"

// Record is one reported trigger time, handed over after a successful commit.
// Times are wall-clock. A zero time leaves out the child span it bounds; the root
// span needs Trigger and at least one attempt.
type Record struct {
	Kind            Kind
	Namespace       string // "" for cluster-scoped
	Name            string
	UID             string
	PolicyRef       string // NetworkPolicy name (spec.policyRef), "" if none
	ResourceVersion string
	Trigger         time.Time // the annotation's trigger time: root span start
	Received        time.Time // informer event received: end of "delivery"
	WorkerStart     time.Time // worker picked the key: end of "queue"
	// ComputeStart and ComputeEnd bound the object's own compile (object → rules),
	// which ends before the worker waits for the node-wide commit lock: that wait
	// is each attempt's LockWait.
	ComputeStart, ComputeEnd time.Time
	Attempts                 []Attempt // commit attempts for this trigger, oldest first; the last one succeeded
	Pods                     int       // pods committed on this node
	Entries                  int       // map entries written
	TraceParent              string    // W3C traceparent annotation value, "" if none
	// RemovedOnly: the trigger's version selects no pod on this node; its change here
	// was removing the pods an earlier version of the object selected.
	RemovedOnly bool
	// Served are the traceparents of the other triggers the same commit reported
	// (versions coalesced into it), for links from this trigger's commit span to
	// their writers; nil when the commit served this trigger alone.
	Served []string
}

// Committed returns the end of the last attempt (the commit time), or the zero
// time when there was no attempt.
func (r *Record) Committed() time.Time {
	if len(r.Attempts) == 0 {
		return time.Time{}
	}
	return r.Attempts[len(r.Attempts)-1].ProgrammedAt()
}

// Latency is the programming latency: commit time minus trigger time. It is
// negative under clock skew.
func (r *Record) Latency() time.Duration { return r.Committed().Sub(r.Trigger) }

// Attempt is one commit attempt of an object's pods: the wait for the node-wide
// commit lock, then, under it, the merge of each pod's objects and the dataplane
// calls.
type Attempt struct {
	// Requested is when the worker asked for the commit lock; Start when it got
	// it; End when the last dataplane call returned. A zero Requested means the
	// wait was not measured (LockWait is then 0).
	Requested, Start, End time.Time
	// Programmed is when the last of the attempt's pods switched to its new policy
	// (bpfmaps.CommitResult.Switched): packets are decided by it from then on. The
	// cleanup after a switch changes no verdict, so the latency ends here, not at
	// End. Zero when no pod switched (then End stands in).
	Programmed time.Time
	Err        string // "" = success
	Phases     Phases
}

// ProgrammedAt is when the attempt's policy took effect: Programmed, or End when
// no switch was recorded.
func (a *Attempt) ProgrammedAt() time.Time {
	if a.Programmed.IsZero() {
		return a.End
	}
	return a.Programmed
}

// LockWait is how long the attempt waited for the node-wide commit lock.
func (a *Attempt) LockWait() time.Duration {
	if a.Requested.IsZero() {
		return 0
	}
	return a.Start.Sub(a.Requested)
}

// Duration is how long the attempt held the commit lock.
func (a *Attempt) Duration() time.Duration { return a.End.Sub(a.Start) }

// Phases is where an attempt's time under the lock went, summed over its pods:
// Merge is the reconcile loop's merge of every object selecting a pod; the rest
// are what the dataplane measured (bpfmaps.CommitResult).
type Phases struct {
	Merge   time.Duration // objects → one policy per pod
	Compile time.Duration // validate, hash, flatten into map entries (or take another pod's compile), and the difference from the committed entries
	Attach  time.Duration // programs attached to a new pod's interface
	Write   time.Duration // the inactive entry set brought to the new entries
	Switch  time.Duration // the store that makes that set active
	Cleanup time.Duration // the other set brought level with it (a delta), or deleted
}
