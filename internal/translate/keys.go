package translate

import (
	"cmp"

	"github.com/npagent/npagent/internal/report"
)

// Key names an object (in internal/reconcile also its workqueue item and, as
// StoreKey, its informer cache key). Namespace is empty for ClusterPolicyEndpoints. It is a name, not an identity: the uid of the object
// under a key can change (delete and recreate).
type Key struct {
	Kind            report.Kind
	Namespace, Name string
}

// StoreKey is namespace/name, or name when cluster-scoped: the informer cache's key.
func (k Key) StoreKey() string {
	if k.Namespace == "" {
		return k.Name
	}
	return k.Namespace + "/" + k.Name
}

func (k Key) String() string { return k.Kind.String() + " " + k.StoreKey() }

// Compare orders keys by kind, namespace, name.
func (k Key) Compare(o Key) int {
	return cmp.Or(cmp.Compare(k.Kind, o.Kind), cmp.Compare(k.Namespace, o.Namespace), cmp.Compare(k.Name, o.Name))
}
