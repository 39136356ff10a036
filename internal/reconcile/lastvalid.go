package reconcile

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/report"
)

// lastValidStore keeps, per object key, the newest valid version this node committed,
// in one file per key, so a process started after a restart can put back in force the
// last valid version of an object whose current version is invalid: the pinned
// enforcement of its pods came from a version the new process never saw, and without
// it their re-commit would merge the other objects alone (for a pod that object alone
// isolated in a direction, that direction would open).
//
// A file is written (temp, fsync, rename) when a valid version with work on this node
// was committed, read only when a version is rejected and no valid one is known, and
// removed when the object is deleted. nil stores nothing.
type lastValidStore struct {
	dir string
	mu  sync.Mutex
	rv  map[objectKey]string // resourceVersion written per key, to skip re-writes
}

func newLastValidStore(dir string) (*lastValidStore, error) {
	if dir == "" {
		return nil, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("last valid versions: %w", err)
	}
	return &lastValidStore{dir: dir, rv: map[objectKey]string{}}, nil
}

// lastValidFile is what a file holds: the object as the informer had it.
type lastValidFile struct {
	PolicyEndpoint        *v1alpha1.PolicyEndpoint        `json:"policyEndpoint,omitempty"`
	ClusterPolicyEndpoint *v1alpha1.ClusterPolicyEndpoint `json:"clusterPolicyEndpoint,omitempty"`
}

func (s *lastValidStore) path(key objectKey) string {
	return filepath.Join(s.dir, fmt.Sprintf("%s_%s_%s.json", key.kind, key.namespace, key.name))
}

// save records obj, a valid version of key just committed.
func (s *lastValidStore) save(key objectKey, obj any) error {
	if s == nil {
		return nil
	}
	var f lastValidFile
	var rv string
	switch o := obj.(type) {
	case *v1alpha1.PolicyEndpoint:
		f.PolicyEndpoint, rv = o, o.ResourceVersion
	case *v1alpha1.ClusterPolicyEndpoint:
		f.ClusterPolicyEndpoint, rv = o, o.ResourceVersion
	default:
		return fmt.Errorf("last valid version: unexpected %T", obj)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rv[key] == rv {
		return nil
	}
	data, err := json.Marshal(&f)
	if err != nil {
		return fmt.Errorf("last valid version of %s: %w", key, err)
	}
	if err := writeFileAtomic(s.path(key), data); err != nil {
		return fmt.Errorf("last valid version of %s: %w", key, err)
	}
	s.rv[key] = rv
	return nil
}

// load returns the saved version of key if it is of uid, else nil.
func (s *lastValidStore) load(key objectKey, uid types.UID) (any, error) {
	if s == nil {
		return nil, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	data, err := os.ReadFile(s.path(key))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("last valid version of %s: %w", key, err)
	}
	var f lastValidFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("last valid version of %s: %w", key, err)
	}
	switch {
	case key.kind == report.KindPolicyEndpoint && f.PolicyEndpoint != nil && f.PolicyEndpoint.UID == uid:
		return f.PolicyEndpoint, nil
	case key.kind == report.KindClusterPolicyEndpoint && f.ClusterPolicyEndpoint != nil && f.ClusterPolicyEndpoint.UID == uid:
		return f.ClusterPolicyEndpoint, nil
	}
	return nil, nil // another uid's (the object was recreated): not this object's
}

// remove forgets key (the object was deleted).
func (s *lastValidStore) remove(key objectKey) error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.rv, key)
	if err := os.Remove(s.path(key)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("last valid version of %s: %w", key, err)
	}
	return nil
}

// keys returns the keys with a saved version.
func (s *lastValidStore) keys() []objectKey {
	if s == nil {
		return nil
	}
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil
	}
	var keys []objectKey
	for _, e := range ents {
		if kind, ns, name, ok := parseLastValidName(e.Name()); ok {
			keys = append(keys, objectKey{kind: kind, namespace: ns, name: name})
		}
	}
	return keys
}

// prune removes the files of keys live does not hold (objects deleted while the agent
// was down), and returns how many it removed.
func (s *lastValidStore) prune(live func(objectKey) bool) int {
	removed := 0
	for _, k := range s.keys() {
		if !live(k) && s.remove(k) == nil {
			removed++
		}
	}
	return removed
}

func parseLastValidName(file string) (report.Kind, string, string, bool) {
	base, ok := strings.CutSuffix(file, ".json")
	if !ok {
		return 0, "", "", false
	}
	parts := strings.SplitN(base, "_", 3)
	if len(parts) != 3 {
		return 0, "", "", false
	}
	for k := range report.Kind(report.NumKinds) {
		if k.String() == parts[0] {
			return k, parts[1], parts[2], true
		}
	}
	return 0, "", "", false
}

// writeFileAtomic writes data to path through a temporary file, fsynced and renamed,
// so a crash leaves the old file or the new one.
func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after a successful rename: already gone
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
