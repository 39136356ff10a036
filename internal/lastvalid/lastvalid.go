package lastvalid

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/npagent/npagent/internal/atomicfile"
)

// Key names an object: its kind's name, its namespace ("" when cluster-scoped) and
// its name. It is a name, not an identity: the uid under a key can change.
type Key struct {
	Kind, Namespace, Name string
}

func (k Key) String() string {
	if k.Namespace == "" {
		return k.Kind + " " + k.Name
	}
	return k.Kind + " " + k.Namespace + "/" + k.Name
}

// Compare orders keys by kind, namespace, name.
func (k Key) Compare(o Key) int {
	return cmp.Or(cmp.Compare(k.Kind, o.Kind), cmp.Compare(k.Namespace, o.Namespace), cmp.Compare(k.Name, o.Name))
}

// Version is what a file holds, encoded as JSON: one version of one object.
type Version interface {
	// Identity returns the key, uid and resourceVersion of the version held; ok is
	// false when it holds none.
	Identity() (key Key, uid, resourceVersion string, ok bool)
}

// Store keeps the last valid version per key in a directory. A nil *Store stores
// nothing and fails nothing. Its methods are safe for concurrent use.
type Store[V Version] struct {
	dir   string
	kinds []string
	mu    sync.Mutex
	rv    map[Key]string // resourceVersion written per key, to skip re-writes
}

// Open returns the store in dir, creating dir (0700), and removes the temporaries a
// crash left there. kinds are the kind names a file name may carry; files of other
// kinds are not the store's. An empty dir returns nil: nothing is kept.
func Open[V Version](dir string, kinds ...string) (*Store[V], error) {
	if dir == "" {
		return nil, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("last valid versions: %w", err)
	}
	// A temporary left by a crash is never read: failing to remove it is harmless.
	_, _ = atomicfile.RemoveStale(dir)
	return &Store[V]{dir: dir, kinds: slices.Clone(kinds), rv: map[Key]string{}}, nil
}

// FileName is key's file name: kind_namespace_name.json, or, when that would pass
// maxFileName bytes (a 253-byte Kubernetes name can), its first bytes, "~" (never in
// a Kubernetes name) and a hash of the whole, so the name stays readable and unique.
func FileName(key Key) string {
	full := fmt.Sprintf("%s_%s_%s", key.Kind, key.Namespace, key.Name)
	if len(full)+len(".json") <= maxFileName {
		return full + ".json"
	}
	sum := sha256.Sum256([]byte(full))
	hash := hex.EncodeToString(sum[:16])
	return full[:maxFileName-len(".json")-len(hash)-1] + "~" + hash + ".json"
}

// maxFileName is the longest file name Linux file systems take (NAME_MAX).
const maxFileName = 255

func (s *Store[V]) path(key Key) string {
	return filepath.Join(s.dir, FileName(key))
}

// Save records v, a valid version just committed, under its key; a version with the
// resourceVersion last written for the key is not written again.
func (s *Store[V]) Save(v V) error {
	if s == nil {
		return nil
	}
	key, _, rv, ok := v.Identity()
	if !ok {
		return fmt.Errorf("last valid version: %T holds no object", v)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rv[key] == rv {
		return nil
	}
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("last valid version of %s: %w", key, err)
	}
	if err := atomicfile.Write(s.path(key), data, 0o600); err != nil {
		return fmt.Errorf("last valid version of %s: %w", key, err)
	}
	s.rv[key] = rv
	return nil
}

// Load returns the saved version of key if it is of uid; ok is false when none is
// saved or the saved one is another uid's (the object was recreated).
func (s *Store[V]) Load(key Key, uid string) (v V, ok bool, err error) {
	if s == nil {
		return v, false, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	data, err := os.ReadFile(s.path(key))
	if errors.Is(err, fs.ErrNotExist) {
		return v, false, nil
	}
	if err != nil {
		return v, false, fmt.Errorf("last valid version of %s: %w", key, err)
	}
	var f V
	if err := json.Unmarshal(data, &f); err != nil {
		return v, false, fmt.Errorf("last valid version of %s: %w", key, err)
	}
	got, gotUID, _, held := f.Identity()
	if !held || got != key { // a hashed name is another key's only if the hash collides
		return v, false, fmt.Errorf("last valid version of %s: the file holds %s", key, got)
	}
	if gotUID != uid {
		return v, false, nil // another uid's (the object was recreated): not this object's
	}
	return f, true, nil
}

// Remove forgets key (the object was deleted).
func (s *Store[V]) Remove(key Key) error {
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

// Keys returns the keys with a saved version.
func (s *Store[V]) Keys() []Key {
	if s == nil {
		return nil
	}
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil
	}
	var keys []Key
	for _, e := range ents {
		if strings.Contains(e.Name(), "~") {
			if key, ok := s.hashedKey(e.Name()); ok {
				keys = append(keys, key)
			}
			continue
		}
		if key, ok := s.parseName(e.Name()); ok {
			keys = append(keys, key)
		}
	}
	return keys
}

// hashedKey reads the key of a file whose name was cut (FileName) from the version
// it holds.
func (s *Store[V]) hashedKey(file string) (Key, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	data, err := os.ReadFile(filepath.Join(s.dir, file))
	if err != nil {
		return Key{}, false
	}
	var f V
	if json.Unmarshal(data, &f) != nil {
		return Key{}, false
	}
	key, _, _, ok := f.Identity()
	return key, ok && FileName(key) == file
}

// Prune removes the files of keys live does not hold (objects deleted while the
// agent was down), and returns how many it removed.
func (s *Store[V]) Prune(live func(Key) bool) int {
	removed := 0
	for _, k := range s.Keys() {
		if !live(k) && s.Remove(k) == nil {
			removed++
		}
	}
	return removed
}

// parseName reads the key of an uncut file name: kind_namespace_name.json, kind one
// of the store's.
func (s *Store[V]) parseName(file string) (Key, bool) {
	base, ok := strings.CutSuffix(file, ".json")
	if !ok {
		return Key{}, false
	}
	parts := strings.SplitN(base, "_", 3)
	if len(parts) != 3 || !slices.Contains(s.kinds, parts[0]) {
		return Key{}, false
	}
	return Key{Kind: parts[0], Namespace: parts[1], Name: parts[2]}, true
}
