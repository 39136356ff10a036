package reconcile

import (
	"crypto/sha256"
	"encoding/hex"
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
	"github.com/npagent/npagent/internal/atomicfile"
	"github.com/npagent/npagent/internal/report"
)

// lastValidStore keeps, per object key, the newest valid version this node committed,
// in one file per key, so a process started after a restart can put back in force the
// last valid version of an object whose current version is invalid: the pinned
// enforcement of its pods came from a version the new process never saw, and without
// it their re-commit would merge the other objects alone (for a pod that object alone
// isolated in a direction, that direction would open).
//
// A file is written (internal/atomicfile: temp, fsync, rename, fsync the directory)
// when a valid version with work on this node was committed, read only when a version
// is rejected and no valid one is known, and removed when the object is deleted; the
// temporaries a crash left are removed when the store opens. A file is named
// kind_namespace_name.json; a name that would pass the file system's 255 bytes is cut
// and ends in a hash of the whole key (lastValidFileName), and the key is read back
// from the object the file holds. nil stores nothing.
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
	// A temporary left by a crash is never read: failing to remove it is harmless.
	_, _ = atomicfile.RemoveStale(dir)
	return &lastValidStore{dir: dir, rv: map[objectKey]string{}}, nil
}

// lastValidFile is what a file holds: the object as the informer had it.
type lastValidFile struct {
	PolicyEndpoint        *v1alpha1.PolicyEndpoint        `json:"policyEndpoint,omitempty"`
	ClusterPolicyEndpoint *v1alpha1.ClusterPolicyEndpoint `json:"clusterPolicyEndpoint,omitempty"`
}

// lastValidFileName is key's file name: kind_namespace_name.json, or, when that would
// pass maxFileName bytes (a 253-byte name can), its first bytes, "~" (never in a
// Kubernetes name) and a hash of the whole, so the name stays readable and unique.
func lastValidFileName(key objectKey) string {
	full := fmt.Sprintf("%s_%s_%s", key.kind, key.namespace, key.name)
	if len(full)+len(".json") <= maxFileName {
		return full + ".json"
	}
	sum := sha256.Sum256([]byte(full))
	hash := hex.EncodeToString(sum[:16])
	return full[:maxFileName-len(".json")-len(hash)-1] + "~" + hash + ".json"
}

// maxFileName is the longest file name Linux file systems take (NAME_MAX).
const maxFileName = 255

func (s *lastValidStore) path(key objectKey) string {
	return filepath.Join(s.dir, lastValidFileName(key))
}

// key returns the key of the object the file holds.
func (f *lastValidFile) key() (objectKey, bool) {
	switch {
	case f.PolicyEndpoint != nil:
		return keyOf(report.KindPolicyEndpoint, f.PolicyEndpoint), true
	case f.ClusterPolicyEndpoint != nil:
		return keyOf(report.KindClusterPolicyEndpoint, f.ClusterPolicyEndpoint), true
	}
	return objectKey{}, false
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
	if err := atomicfile.Write(s.path(key), data, 0o600); err != nil {
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
	if got, ok := f.key(); !ok || got != key { // a hashed name is another key's only if the hash collides
		return nil, fmt.Errorf("last valid version of %s: the file holds %s", key, got)
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
		if strings.Contains(e.Name(), "~") {
			if key, ok := s.hashedKey(e.Name()); ok {
				keys = append(keys, key)
			}
			continue
		}
		if kind, ns, name, ok := parseLastValidName(e.Name()); ok {
			keys = append(keys, objectKey{kind: kind, namespace: ns, name: name})
		}
	}
	return keys
}

// hashedKey reads the key of a file whose name was cut (lastValidFileName) from the
// object it holds.
func (s *lastValidStore) hashedKey(file string) (objectKey, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	data, err := os.ReadFile(filepath.Join(s.dir, file))
	if err != nil {
		return objectKey{}, false
	}
	var f lastValidFile
	if json.Unmarshal(data, &f) != nil {
		return objectKey{}, false
	}
	key, ok := f.key()
	return key, ok && lastValidFileName(key) == file
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
