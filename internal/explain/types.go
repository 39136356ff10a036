package explain

import (
	"net/netip"
	"strings"
	"time"

	"github.com/npagent/npagent/internal/report"
)

// The wire types: what the debug socket answers, as JSON. Durations are
// time.Duration (nanoseconds in JSON).

// Object states, ObjectExplain.State.
const (
	// StateProgrammed: this node's dataplane holds the object's current version
	// for every local pod it applies to.
	StateProgrammed = "programmed"
	// StateNoLocalWork: the current version was synced and has nothing on this
	// node (no local pod, none removed).
	StateNoLocalWork = "no-local-work"
	// StateNotSynced: no worker has synced the current version yet.
	StateNotSynced = "not-synced"
	// StateWaiting: some local pods' interfaces are not there yet; retried.
	StateWaiting = "waiting-for-interfaces"
	// StateFailed: a commit failed; retried with backoff.
	StateFailed = "failed"
	// StateRejected: the current version is invalid and not programmed; the last
	// valid version stays in force for its pods.
	StateRejected = "rejected"
	// StateNotFound: no such object in the informer cache.
	StateNotFound = "not-found"
)

// Outcomes of a version's sync, VersionInfo.Outcome: StateProgrammed,
// StateNoLocalWork, StateWaiting, StateFailed or StateRejected; "" until a worker
// synced it.

// VersionInfo is one version of an object that reached this node.
type VersionInfo struct {
	ResourceVersion string    `json:"resourceVersion"`
	Trigger         time.Time `json:"trigger,omitzero"`  // the trigger annotation; zero if absent or invalid
	Received        time.Time `json:"received,omitzero"` // first event bringing it; zero if a worker read it first
	// Outcome is how its last sync ended; "" if not synced yet.
	Outcome  string    `json:"outcome,omitempty"`
	SyncedAt time.Time `json:"syncedAt,omitzero"`
	// Pods is how many local pods the last sync committed or removed.
	Pods int `json:"pods,omitempty"`
	// Detail is the error, or the pods waiting for an interface.
	Detail string `json:"detail,omitempty"`
	// LocalWork is what the loop recorded when the version's event arrived, and
	// decides whether its trigger is reported here: it selects a pod on this node,
	// or the object's previous version did. Absent if a worker read it first.
	LocalWork *bool `json:"localWork,omitempty"`
}

// HasLocalWork reports whether the version had work on this node: as recorded at
// event time (LocalWork) — a version coalesced into a later sync has it too — or,
// for a version no event brought, as far as its sync found out.
func (v *VersionInfo) HasLocalWork() bool {
	if v.LocalWork != nil {
		return *v.LocalWork
	}
	return v.Outcome != "" && v.Outcome != StateNoLocalWork && v.Outcome != StateRejected
}

// AttemptInfo is one commit attempt. Durations are time.Duration (nanoseconds in
// JSON).
type AttemptInfo struct {
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	// Programmed is when the attempt's last switch made its policy the one packets
	// see (End when none was recorded): a successful attempt's latency ends here.
	Programmed time.Time     `json:"programmed"`
	LockWait   time.Duration `json:"lockWait"`
	Duration   time.Duration `json:"duration"` // under the lock: merge and dataplane calls
	Phases     report.Phases `json:"phases"`
	Err        string        `json:"error,omitempty"`
}

// AttemptOf is a's wire form.
func AttemptOf(a *report.Attempt) AttemptInfo {
	return AttemptInfo{Start: a.Start, End: a.End, Programmed: a.ProgrammedAt(), LockWait: a.LockWait(), Duration: a.Duration(), Phases: a.Phases, Err: a.Err}
}

// ReportInfo is one reported trigger, as it was handed to the Sink.
type ReportInfo struct {
	UID             string        `json:"uid"`
	ResourceVersion string        `json:"resourceVersion"`
	Trigger         time.Time     `json:"trigger"`
	Committed       time.Time     `json:"committed"`
	Latency         time.Duration `json:"latency"`
	// Delivery (trigger → event received), Queue (received → worker start) and
	// Compute (the object's own compile): zero when not measured (the commit
	// that programmed it ran ahead of its event).
	Delivery time.Duration `json:"delivery"`
	Queue    time.Duration `json:"queue"`
	Compute  time.Duration `json:"compute"`
	// Attempts are the newest attempts, oldest first, the successful one last;
	// AttemptCount counts them all.
	Attempts     []AttemptInfo `json:"attempts"`
	AttemptCount int           `json:"attemptCount"`
	Pods         int           `json:"pods"`
	Entries      int           `json:"entries"`
	// WriterTraceID: see ObjectExplain.WriterTraceID.
	WriterTraceID string `json:"writerTraceID,omitempty"`
}

// ReportOf is r's wire form, with the newest maxAttempts of its attempts.
func ReportOf(r *report.Record) ReportInfo {
	ri := ReportInfo{
		UID: r.UID, ResourceVersion: r.ResourceVersion, Trigger: r.Trigger,
		Committed: r.Committed(), Latency: r.Latency(),
		Delivery:     span(r.Trigger, r.Received),
		Queue:        span(r.Received, r.WorkerStart),
		Compute:      span(r.ComputeStart, r.ComputeEnd),
		AttemptCount: len(r.Attempts),
		Pods:         r.Pods, Entries: r.Entries,
		WriterTraceID: TraceID(r.TraceParent),
	}
	kept := r.Attempts[max(len(r.Attempts)-maxAttempts, 0):]
	ri.Attempts = make([]AttemptInfo, len(kept))
	for i := range kept {
		ri.Attempts[i] = AttemptOf(&kept[i])
	}
	return ri
}

// span is end − start, 0 when either is unknown.
func span(start, end time.Time) time.Duration {
	if start.IsZero() || end.IsZero() {
		return 0
	}
	return end.Sub(start)
}

// TraceID returns the trace id of a W3C traceparent ("00-<trace id>-<span id>-<flags>"),
// "" when it is not one.
func TraceID(traceparent string) string {
	parts := strings.Split(traceparent, "-")
	if len(parts) < 4 || len(parts[1]) != 32 || strings.Trim(parts[1], "0123456789abcdef") != "" || strings.Trim(parts[1], "0") == "" {
		return ""
	}
	return parts[1]
}

// PendingInfo is one trigger pending a commit on this node.
type PendingInfo struct {
	Trigger  time.Time `json:"trigger"`
	Received time.Time `json:"received"`
	// Age is how long ago it was stamped (its latency so far); Waiting how long
	// ago this node received it.
	Age     time.Duration `json:"age"`
	Waiting time.Duration `json:"waiting"`
	// Failures counts the failed commits since it was accepted.
	Failures int `json:"failures"`
	// ProgrammedAt: an earlier commit already held it (the lister ran ahead of
	// its event); it is reported at the next commit.
	ProgrammedAt time.Time `json:"programmedAt,omitzero"`
}

// ObjectExplain is what this node knows of one PolicyEndpoint or
// ClusterPolicyEndpoint.
type ObjectExplain struct {
	Node      string    `json:"node"`
	At        time.Time `json:"at"` // when the snapshot was taken; ages are relative to it
	Kind      string    `json:"kind"`
	Namespace string    `json:"namespace,omitempty"`
	Name      string    `json:"name"`
	// The current version in the informer cache.
	UID             string    `json:"uid,omitempty"`
	ResourceVersion string    `json:"resourceVersion,omitempty"`
	PolicyRef       string    `json:"policyRef,omitempty"`
	Trigger         time.Time `json:"trigger,omitzero"`
	// WriterTraceID is the trace id of the version's traceparent annotation (the
	// writer's trace): the trace npagent's root span links to (or, parented,
	// joins). "" when the version carries none. npagent's own trace id is drawn
	// by telemetry after the report and is not known here; in a tracing backend,
	// its root policy.program carries npagent.policy.uid and
	// npagent.policy.resource_version.
	WriterTraceID string `json:"writerTraceID,omitempty"`
	// State is one of the State constants; Programmed is true for
	// StateProgrammed and StateNoLocalWork (nothing left to do on this node).
	State      string `json:"state"`
	Programmed bool   `json:"programmed"`
	Detail     string `json:"detail,omitempty"`
	// Notes say what the agent found worth knowing about the current version
	// (the trigger annotation missing, so nothing is measured).
	Notes []string `json:"notes,omitempty"`
	// LocalPods are the pods on this node the current version lists.
	LocalPods []string `json:"localPods,omitempty"`
	// Versions seen on this node, oldest first (the newest few).
	Versions []VersionInfo `json:"versions,omitempty"`
	// Consumed is the newest trigger reported or deliberately suppressed.
	Consumed time.Time     `json:"consumed,omitzero"`
	Pending  []PendingInfo `json:"pending,omitempty"`
	// FailedAttempts are the failed commits since the last success (with the
	// pending triggers they delay).
	FailedAttempts []AttemptInfo `json:"failedAttempts,omitempty"`
	// Reports are the last reported triggers, oldest first.
	Reports []ReportInfo `json:"reports,omitempty"`
}

// PodQuery names a pod by namespace and name, or by IP (IP wins when set).
type PodQuery struct {
	Namespace, Name string
	IP              netip.Addr
}

// PodObject is one object whose rules apply to a pod.
type PodObject struct {
	Kind            string `json:"kind"`
	Namespace       string `json:"namespace,omitempty"`
	Name            string `json:"name"`
	UID             string `json:"uid,omitempty"`
	ResourceVersion string `json:"resourceVersion,omitempty"`
	PolicyRef       string `json:"policyRef,omitempty"`
	// Lists: its current version lists the pod. False for another chunk of the
	// same policy (its rules apply to the pod too), or for an object whose
	// programmed version listed the pod and whose current one does not (or
	// that was deleted): the pod's state changes when that is committed.
	Lists bool `json:"lists"`
	// State is the object's state for this pod (see ObjectExplain.State);
	// Programmed: this node's dataplane holds its current version for the pod
	// (for a deleted object: its removal).
	State      string `json:"state"`
	Programmed bool   `json:"programmed"`
}

// PodExplain is what this node knows of one pod's policy.
type PodExplain struct {
	Node      string    `json:"node"`
	At        time.Time `json:"at"`
	Namespace string    `json:"namespace,omitempty"`
	Name      string    `json:"name,omitempty"`
	IP        string    `json:"ip,omitempty"`
	// HostIP is the node the objects place the pod on; OnNode is true when that
	// is this node (or when no object lists the pod).
	HostIP string `json:"hostIP,omitempty"`
	OnNode bool   `json:"onNode"`
	// Synced: the informer caches hold every object (until then a pod no object
	// lists yet may be one whose objects have not been listed).
	Synced bool `json:"synced"`
	// Ifindex is the interface holding the pod's committed state; 0 if none.
	Ifindex int         `json:"ifindex,omitempty"`
	Objects []PodObject `json:"objects"`
	// Programmed: Synced, OnNode, and every object Programmed (true when no
	// object applies to the pod: nothing to enforce).
	Programmed bool `json:"programmed"`
	// StrictDenied: strict mode denies the pod (node traffic excepted) until a
	// policy selecting it is committed.
	StrictDenied bool `json:"strictDenied,omitempty"`
	// Verdicts are what the dataplane decided for the pod's packets since the agent
	// started, read from the kernel's counters (the interface's; none without one).
	Verdicts []PodVerdict `json:"verdicts,omitempty"`
	// Window is the pod's new-pod enforcement window as this process saw it; nil
	// when the agent does not measure it (no pod condition) or has not seen the pod.
	Window *PodWindow `json:"window,omitempty"`
	// RecentDenials are the last packets the policy denied for the pod, newest
	// first, as flow events named them (none with --flow-events=off).
	RecentDenials []PodFlow `json:"recentDenials,omitempty"`
}

// PodWindow is a new pod's enforcement window: from its network becoming usable to
// the switch that first put a policy selecting it in force on this node.
type PodWindow struct {
	NetworkReady time.Time `json:"networkReady"`
	// Source says where NetworkReady comes from: ready_to_start_containers (the
	// pod's condition) or first_seen_ip (when this process first saw its address).
	Source string `json:"source"`
	// Programmed is when the window closed; zero while it is open, or when it
	// closed without a policy (nothing selects the pod).
	Programmed time.Time `json:"programmed,omitzero"`
	// Unselected: no policy selected the pod when its condition was first
	// computed; the window is counted, not measured.
	Unselected bool `json:"unselected,omitempty"`
}

// PodVerdict is one of a pod's verdict counters: packets of one direction decided
// one way, and what decided them.
type PodVerdict struct {
	Direction string `json:"direction"` // ingress, egress
	Verdict   string `json:"verdict"`   // allow, deny, would_deny (audit mode)
	Reason    string `json:"reason"`
	// PolicyKind and Policy name the deciding object (several isolating objects
	// joined by "+"); Rule is the deciding rule's index, -1 when none.
	PolicyKind string `json:"policyKind,omitempty"`
	Policy     string `json:"policy,omitempty"`
	Rule       int    `json:"rule"`
	Packets    uint64 `json:"packets"`
	Bytes      uint64 `json:"bytes"`
}
