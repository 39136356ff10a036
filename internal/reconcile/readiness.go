package reconcile

import (
	"sync"

	"github.com/npagent/npagent/internal/translate"
)

// localReady tracks the objects of the initial list with a pod on this node until
// each was programmed (synced successfully) once: /readyz waits for them, so "ready"
// means the node's pods have their policy, not only that the caches hold the
// cluster's objects.
type localReady struct {
	mu      sync.Mutex
	begun   bool
	pending map[translate.Key]struct{}
}

// begin starts tracking the keys local reports true for, of keys (the objects the
// caches held when they synced).
func (r *localReady) begin(keys []translate.Key, local func(translate.Key) bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pending = map[translate.Key]struct{}{}
	for _, k := range keys {
		if local(k) {
			r.pending[k] = struct{}{}
		}
	}
	r.begun = true
}

// programmed notes that key was synced successfully.
func (r *localReady) programmed(key translate.Key) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.pending, key)
}

// LocalPending is how many objects of the initial list that select a pod on this
// node have not been programmed yet (synced successfully once), or -1 before the
// caches synced. /readyz waits for 0. An object deleted before its first sync counts
// as programmed once its deletion is.
func (c *Controller) LocalPending() int {
	c.ready.mu.Lock()
	defer c.ready.mu.Unlock()
	if !c.ready.begun {
		return -1
	}
	return len(c.ready.pending)
}
