package report

import "strconv"

// Kind is the kind of a policy object.
type Kind uint8

// Policy kinds.
const (
	KindPolicyEndpoint Kind = iota
	KindClusterPolicyEndpoint

	// NumKinds is the number of Kind values.
	NumKinds = int(KindClusterPolicyEndpoint) + 1
)

var kindNames = [NumKinds]string{"PolicyEndpoint", "ClusterPolicyEndpoint"}

// String returns the Kubernetes kind name, also the value of the
// npagent.policy.kind attribute.
func (k Kind) String() string {
	if int(k) < NumKinds {
		return kindNames[k]
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Cause is why an object reached the reconcile loop.
type Cause uint8

// Delivery causes.
const (
	// CauseAdd: the informer saw the object for the first time (initial list included).
	CauseAdd Cause = iota
	// CauseUpdate: a new resourceVersion (a genuine write).
	CauseUpdate
	// CauseResync: the informer's periodic resync re-delivered the cached object.
	CauseResync
	// CauseRelist: a list after a watch failure delivered the object again unchanged.
	CauseRelist
	// CauseRequeue: a worker put the key back (commit failure, interface not there yet).
	CauseRequeue
	// CauseDelete: the object was deleted.
	CauseDelete

	// NumCauses is the number of Cause values.
	NumCauses = int(CauseDelete) + 1
)

var causeNames = [NumCauses]string{"add", "update", "resync", "relist", "requeue", "delete"}

// String returns the cause's name, the value of the cause attribute.
func (c Cause) String() string {
	if int(c) < NumCauses {
		return causeNames[c]
	}
	return "Cause(" + strconv.Itoa(int(c)) + ")"
}

// Reason says why an observation or a pending trigger was not reported.
// Accepted is not a suppression: it is the seen-set's answer for a trigger that
// became pending.
type Reason uint8

const (
	// Accepted: the trigger became pending; it will end reported or counted
	// under exactly one of the reasons below.
	Accepted Reason = iota
	// Redelivered: the trigger equals a pending or consumed trigger of the uid
	// (resync, relist, requeue, restart).
	Redelivered
	// Stale: the trigger is older than the uid's consumed trigger.
	Stale
	// BeforeStart: the trigger is not newer than the start guard (the restored
	// watermark, or the process start without state) and nothing was persisted
	// or accepted for the uid.
	BeforeStart
	// InvalidAnnotation: the trigger annotation could not be parsed, or the
	// time is outside what int64 Unix nanoseconds can hold.
	InvalidAnnotation
	// NoLocalPods: a pending trigger consumed without a report: the object has
	// nothing on this node.
	NoLocalPods
	// Deleted: a pending trigger dropped because its object was deleted.
	Deleted
	// Overflow: a pending trigger dropped because the per-object bound was
	// exceeded (the oldest and the newest are always kept).
	Overflow
	// Future: the trigger is later than this node's clock plus the allowed skew.
	// It is not consumed: consuming it would make every later genuine trigger of
	// the object stale until the clock passed it.
	Future

	// NumReasons is the number of Reason values, Accepted included; it sizes
	// arrays indexed by Reason, whose Accepted slot stays zero.
	NumReasons = int(Future) + 1
)

var reasonNames = [NumReasons]string{
	Accepted:          "accepted",
	Redelivered:       "redelivered",
	Stale:             "stale",
	BeforeStart:       "before_start",
	InvalidAnnotation: "invalid_annotation",
	NoLocalPods:       "no_local_pods",
	Deleted:           "deleted",
	Overflow:          "overflow",
	Future:            "future",
}

// String returns the snake_case name, the value of the reason attribute
// ("redelivered", "before_start", ...; "accepted" for Accepted).
func (r Reason) String() string {
	if int(r) < NumReasons {
		return reasonNames[r]
	}
	return "Reason(" + strconv.Itoa(int(r)) + ")"
}

// Reasons returns every suppression reason (Accepted excluded), in declaration
// order.
func Reasons() []Reason {
	rs := make([]Reason, 0, NumReasons-1)
	for r := Redelivered; int(r) < NumReasons; r++ {
		rs = append(rs, r)
	}
	return rs
}

// RelistCause is why an informer listed its objects again after its initial list.
type RelistCause uint8

// Relist causes.
const (
	// RelistExpired: the watch's resourceVersion was gone (410: etcd compacted, or
	// the apiserver restarted its watch cache); the loop listed again in place,
	// without ending the reflector's watch.
	RelistExpired RelistCause = iota
	// RelistRestart: client-go's reflector ended its list-and-watch on an error it
	// could not resume from and listed again after its own backoff.
	RelistRestart

	// NumRelistCauses is the number of RelistCause values.
	NumRelistCauses = int(RelistRestart) + 1
)

var relistCauseNames = [NumRelistCauses]string{"expired", "restart"}

// String returns the cause's name, the value of the cause attribute.
func (c RelistCause) String() string {
	if int(c) < NumRelistCauses {
		return relistCauseNames[c]
	}
	return "RelistCause(" + strconv.Itoa(int(c)) + ")"
}
