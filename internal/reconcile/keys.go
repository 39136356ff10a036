package reconcile

import (
	"cmp"

	"github.com/npagent/npagent/internal/telemetry/record"
)

// Kind is the kind of a policy object.
type Kind uint8

// Policy kinds.
const (
	KindPolicyEndpoint Kind = iota
	KindClusterPolicyEndpoint
	numKinds
)

// String returns the Kubernetes kind name, also the telemetry attribute value.
func (k Kind) String() string {
	if k == KindClusterPolicyEndpoint {
		return record.KindClusterPolicyEndpoint
	}
	return record.KindPolicyEndpoint
}

// Cause is why an object reached the loop.
type Cause uint8

// Delivery causes, as counted in Stats.Deliveries and handed to Sink.Delivered.
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
	numCauses
)

var causeNames = [numCauses]string{"add", "update", "resync", "relist", "requeue", "delete"}

// String returns the cause's name, the telemetry attribute value.
func (c Cause) String() string {
	if c < numCauses {
		return causeNames[c]
	}
	return "unknown"
}

// objectKey names an object in the workqueue and the informer caches. namespace is
// empty for ClusterPolicyEndpoints. It is a name, not an identity: the uid of the object
// under a key can change (delete and recreate).
type objectKey struct {
	kind            Kind
	namespace, name string
}

// storeKey is the informer cache's key (namespace/name, or name).
func (k objectKey) storeKey() string {
	if k.namespace == "" {
		return k.name
	}
	return k.namespace + "/" + k.name
}

func (k objectKey) String() string { return k.kind.String() + " " + k.storeKey() }

func (k objectKey) compare(o objectKey) int {
	return cmp.Or(cmp.Compare(k.kind, o.kind), cmp.Compare(k.namespace, o.namespace), cmp.Compare(k.name, o.name))
}
