package reconcile

import (
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"
)

// initialSync tracks the keys of the initial list until each was synced once.
type initialSync struct {
	mu      sync.Mutex
	pending map[objectKey]struct{} // nil before begin and once every key was synced
	begun   bool
}

// begin starts tracking keys, the objects the caches held when they synced.
func (s *initialSync) begin(keys []objectKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pending = make(map[objectKey]struct{}, len(keys))
	for _, k := range keys {
		s.pending[k] = struct{}{}
	}
	s.begun = true
}

// synced notes that key was synced once; it reports true exactly once, when the last
// key of the initial list was.
func (s *initialSync) synced(key objectKey) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pending == nil {
		return false
	}
	delete(s.pending, key)
	if len(s.pending) > 0 {
		return false
	}
	s.pending = nil
	return s.begun
}

// initialSynced notes that key was synced once; after the last key of the initial list,
// it collects the dataplane's leftovers.
func (c *Controller) initialSynced(key objectKey) {
	if c.initial.synced(key) {
		removed := c.pods.removeLeftovers()
		c.log.Info("initial sync done", "leftoverPodsRemoved", removed)
	}
}

// pruneSeen drops seen-set entries of objects that are gone (deleted while the agent
// was down), so restored state does not hold memory forever.
func (c *Controller) pruneSeen() int {
	live := map[string]struct{}{}
	for _, inf := range c.informers {
		for _, obj := range inf.GetStore().List() {
			if m, err := meta.Accessor(obj); err == nil {
				live[string(m.GetUID())] = struct{}{}
			}
		}
	}
	return c.cfg.Seen.Prune(func(uid string) bool { _, ok := live[uid]; return ok })
}
