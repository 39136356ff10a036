package reconcile

import (
	"fmt"

	"k8s.io/apimachinery/pkg/types"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/lastvalid"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/translate"
)

// lastValidStore keeps each object's last valid version with work on this node
// across restarts (internal/lastvalid: one durable file per object): written when a
// valid version with work on this node was committed (sync), read only when a
// version is rejected and no valid one is known (restoreLastValid), removed when the
// object is deleted. It holds the objects as the informer had them. nil stores
// nothing.
type lastValidStore struct {
	store *lastvalid.Store[lastValidFile]
}

func newLastValidStore(dir string) (*lastValidStore, error) {
	s, err := lastvalid.Open[lastValidFile](dir, report.KindPolicyEndpoint.String(), report.KindClusterPolicyEndpoint.String())
	if s == nil || err != nil {
		return nil, err
	}
	return &lastValidStore{store: s}, nil
}

// lastValidFile is what a file holds: the object as the informer had it.
type lastValidFile struct {
	PolicyEndpoint        *v1alpha1.PolicyEndpoint        `json:"policyEndpoint,omitempty"`
	ClusterPolicyEndpoint *v1alpha1.ClusterPolicyEndpoint `json:"clusterPolicyEndpoint,omitempty"`
}

// Identity implements lastvalid.Version.
func (f lastValidFile) Identity() (key lastvalid.Key, uid, resourceVersion string, ok bool) {
	switch {
	case f.PolicyEndpoint != nil:
		o := f.PolicyEndpoint
		return lastValidKey(keyOf(report.KindPolicyEndpoint, o)), string(o.UID), o.ResourceVersion, true
	case f.ClusterPolicyEndpoint != nil:
		o := f.ClusterPolicyEndpoint
		return lastValidKey(keyOf(report.KindClusterPolicyEndpoint, o)), string(o.UID), o.ResourceVersion, true
	}
	return lastvalid.Key{}, "", "", false
}

func lastValidKey(k translate.Key) lastvalid.Key {
	return lastvalid.Key{Kind: k.Kind.String(), Namespace: k.Namespace, Name: k.Name}
}

// save records obj, a valid version of key just committed.
func (s *lastValidStore) save(key translate.Key, obj any) error {
	if s == nil {
		return nil
	}
	var f lastValidFile
	switch o := obj.(type) {
	case *v1alpha1.PolicyEndpoint:
		f.PolicyEndpoint = o
	case *v1alpha1.ClusterPolicyEndpoint:
		f.ClusterPolicyEndpoint = o
	default:
		return fmt.Errorf("last valid version: unexpected %T", obj)
	}
	return s.store.Save(f)
}

// load returns the saved version of key if it is of uid, else nil.
func (s *lastValidStore) load(key translate.Key, uid types.UID) (any, error) {
	if s == nil {
		return nil, nil
	}
	f, ok, err := s.store.Load(lastValidKey(key), string(uid))
	switch {
	case err != nil || !ok:
		return nil, err
	case key.Kind == report.KindPolicyEndpoint && f.PolicyEndpoint != nil:
		return f.PolicyEndpoint, nil
	case key.Kind == report.KindClusterPolicyEndpoint && f.ClusterPolicyEndpoint != nil:
		return f.ClusterPolicyEndpoint, nil
	}
	return nil, nil
}

// remove forgets key (the object was deleted).
func (s *lastValidStore) remove(key translate.Key) error {
	if s == nil {
		return nil
	}
	return s.store.Remove(lastValidKey(key))
}

// keys returns the keys with a saved version.
func (s *lastValidStore) keys() []translate.Key {
	if s == nil {
		return nil
	}
	var keys []translate.Key
	for _, k := range s.store.Keys() {
		if key, ok := objectKeyOf(k); ok {
			keys = append(keys, key)
		}
	}
	return keys
}

// prune removes the files of keys live does not hold (objects deleted while the agent
// was down), and returns how many it removed.
func (s *lastValidStore) prune(live func(translate.Key) bool) int {
	if s == nil {
		return 0
	}
	return s.store.Prune(func(k lastvalid.Key) bool {
		key, ok := objectKeyOf(k)
		return ok && live(key)
	})
}

// objectKeyOf is the translate.Key of a store's key; false for a kind the agent does not
// know.
func objectKeyOf(k lastvalid.Key) (translate.Key, bool) {
	for kind := range report.Kind(report.NumKinds) {
		if kind.String() == k.Kind {
			return translate.Key{Kind: kind, Namespace: k.Namespace, Name: k.Name}, true
		}
	}
	return translate.Key{}, false
}
