package report

import "time"

// Where a pod's network became usable, the start of its enforcement window
// (PodRecord.Source).
const (
	// SourceReadyToStartContainers: the pod's PodReadyToStartContainers condition's
	// lastTransitionTime (the kubelet sets it once the sandbox and its network are up).
	SourceReadyToStartContainers = "ready_to_start_containers"
	// SourceFirstSeenIP: the agent's clock when it first saw the pod with an IP (the
	// condition is absent: an older kubelet).
	SourceFirstSeenIP = "first_seen_ip"
)

// PodRecord is one new pod's enforcement window: from when its network became
// usable to the commit that first programmed its policy on its node (in strict
// mode: the time it stayed denied). Reported once per pod uid.
type PodRecord struct {
	Namespace, Name, UID string
	Node                 string
	NetworkReady         time.Time // the window's start
	Source               string    // SourceReadyToStartContainers or SourceFirstSeenIP
	Programmed           time.Time // the commit that first programmed its policy
	Strict               bool      // strict enforcing mode: the pod was denied, not open, meanwhile
	// Objects names the objects whose versions programmed it ("PolicyEndpoint
	// ns/name"), and TraceParents their versions' traceparents (W3C; "" skipped),
	// for the span's links.
	Objects      []string
	TraceParents []string
}

// PodSink receives new pods' enforcement windows. A Sink may implement it; calls
// come from the pod condition's worker and must not block.
type PodSink interface {
	// PodProgrammed hands over one pod's window; r is the PodSink's to keep.
	PodProgrammed(r *PodRecord)
	// PodUnselected counts a new pod no policy selected when its condition was first
	// computed: counted, not observed (its window has no end).
	PodUnselected()
}
