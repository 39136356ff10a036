package reconcile

import (
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/translate"
)

// initialSync tracks the keys of the initial list until each was synced once.
type initialSync struct {
	mu      sync.Mutex
	pending map[translate.Key]struct{} // nil before begin and once every key was synced
	begun   bool
}

// begin starts tracking keys, the objects the caches held when they synced.
func (s *initialSync) begin(keys []translate.Key) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pending = make(map[translate.Key]struct{}, len(keys))
	for _, k := range keys {
		s.pending[k] = struct{}{}
	}
	s.begun = true
}

// synced notes that key was synced once; it reports true exactly once, when the last
// key of the initial list was.
func (s *initialSync) synced(key translate.Key) bool {
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
func (c *Controller) initialSynced(key translate.Key) {
	if c.initial.synced(key) {
		removed := c.pods.removeLeftovers()
		c.log.Info("initial sync done", "leftoverPodsRemoved", removed)
		if c.podWatch != nil && c.podWatch.strict {
			c.requeuePods()
		}
		if c.podStatus != nil {
			c.podStatus.start() // every pod's condition, from the state of every object
		}
	}
}

// restoreLastValid puts back in force, before the workers start, the last valid
// version a previous process saved of every object whose current version is invalid:
// its pods keep the policy they had (merged with the other objects by their first
// commit), as if the process had not restarted. It returns how many it restored.
func (c *Controller) restoreLastValid() int {
	if c.lastValid == nil {
		return 0
	}
	restored := 0
	for _, key := range c.lastValid.keys() { // objects with work here: fewer than the caches hold
		obj, ok, err := c.informers[key.Kind].GetIndexer().GetByKey(key.StoreKey())
		if err != nil || !ok {
			continue
		}
		m, err := meta.Accessor(obj)
		if err != nil || isStub(obj) { // a stub's version has no work here: nothing to keep
			continue
		}
		if _, err := c.compile(obj); err == nil {
			continue
		}
		saved, err := c.lastValid.load(key, m.GetUID())
		if err != nil {
			c.log.Warn("last valid version not restored", "object", key.String(), "err", err)
			continue
		}
		if saved == nil {
			continue
		}
		compiled, err := c.compile(saved)
		if err == nil {
			err = compiled.BuildSets(nil)
		}
		if err != nil {
			c.log.Warn("saved last valid version no longer compiles: not restored", "object", key.String(), "err", err)
			continue
		}
		c.pods.restore(key, compiled)
		restored++
		c.log.Info("current version invalid: the last valid version saved before the restart stays in force",
			"object", key.String(), "resourceVersion", m.GetResourceVersion(), "validResourceVersion", compiled.ResourceVersion)
	}
	return restored
}

// compile compiles a PolicyEndpoint or ClusterPolicyEndpoint, in the form the pod
// table keeps (see translate.Options.NodeLocal).
func (c *Controller) compile(obj any) (*translate.Compiled, error) {
	compiled, err := c.cfg.Compile.Compile(obj, c.cfg.NodeIP)
	if compiled = c.cfg.Compile.NodeLocal(compiled, obj, c.cfg.NodeIP); compiled != nil {
		compiled.Settle()
	}
	return compiled, err
}

// pruneSeen drops seen-set entries of objects that are gone (deleted while the agent
// was down), so restored state does not hold memory forever.
// It also drops the saved last valid versions of those objects.
func (c *Controller) pruneSeen() int {
	live := map[string]struct{}{}
	liveKeys := map[translate.Key]struct{}{}
	for kind, inf := range c.informers {
		for _, obj := range inf.GetStore().List() {
			if m, err := meta.Accessor(obj); err == nil {
				live[string(m.GetUID())] = struct{}{}
				liveKeys[translate.Key{Kind: report.Kind(kind), Namespace: m.GetNamespace(), Name: m.GetName()}] = struct{}{}
			}
		}
	}
	c.lastValid.prune(func(k translate.Key) bool { _, ok := liveKeys[k]; return ok })
	return c.cfg.Seen.Prune(func(uid string) bool { _, ok := live[uid]; return ok })
}
