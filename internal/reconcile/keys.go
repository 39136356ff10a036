package reconcile

import (
	"cmp"

	"github.com/npagent/npagent/internal/report"
)

// objectKey names an object in the workqueue and the informer caches. namespace is
// empty for ClusterPolicyEndpoints. It is a name, not an identity: the uid of the object
// under a key can change (delete and recreate).
type objectKey struct {
	kind            report.Kind
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
