package reconcile

import (
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/kubewatch"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/translate"
)

// Cold start. The reflector hands the informer nothing until the whole initial list is
// in (a List's every page, or a WatchList stream to its end), and on a large cluster
// that takes seconds, almost all of them spent on other nodes' objects. So the loop
// reads the list as it arrives (kubewatch.ListProgress) and programs this node's pods
// before the caches sync, as far as that is safe:
//
//   - A pod's policy merges every PolicyEndpoint listing it and every chunk of their
//     policies — all of the pod's namespace (a PolicyEndpoint selects pods of its own
//     namespace; its policy is of its namespace) — and the ClusterPolicyEndpoints. The
//     apiserver lists in key order (namespace, then name: the continue token of a
//     paged list is a key), so once the list is past a namespace, every object of it
//     has arrived: its objects with work here (and their policies' other chunks) form
//     a batch. A namespace that comes back (out of order) ends early starts.
//   - A batch waits for the ClusterPolicyEndpoints (a small list) and, when watched,
//     this node's pods to have synced; all ClusterPolicyEndpoints are put in the pod
//     table first (an admin Deny must never be missing from an early commit).
//   - An early worker compiles the batch, puts every object of it in the pod table,
//     then commits the pods its local objects reach: never from part of a pod's
//     objects. Anything that does not compile, cannot be fetched or fails is left to
//     the ordinary sync. The last namespace of the list completes when the list ends
//     (kubewatch.ListProgress's ListEnded, its last page): seconds before the caches
//     sync with many objects, as the informer still has the whole list to take in.
//   - Early commits touch only the pod table and the dataplane: no seen-set call, no
//     report, no last-valid file. Once the caches synced, every object is synced as
//     before: an early-committed policy commits again unchanged (no map write), and a
//     trigger is reported then — its latency ends at that sync, a little after the
//     policy was in force (an overestimate, never an underestimate).
type coldStart struct {
	nodeIP netip.Addr
	queue  workqueue.TypedInterface[*coldBatch]

	mu     sync.Mutex
	active bool // the initial list is in progress; false once stopped
	ns     string
	seen   map[string]struct{} // namespaces completed: one coming back ends early starts
	buf    []coldItem          // the objects of namespace ns so far
	held   []*coldBatch        // complete batches waiting for the gate
	open   bool                // the gate: ClusterPolicyEndpoints (and pods) synced

	batches, commits atomic.Uint64
	// syncedAt is when the caches synced (Unix nanoseconds), for tests and logs.
	syncedAt atomic.Int64
}

// coldItem is one object of the namespace being listed: a copy of it when it has work
// here, else only what a GET needs.
type coldItem struct {
	name, policyRef string
	uid             types.UID
	rv              string
	full            *v1alpha1.PolicyEndpoint // nil: no work here (fetched if a sibling has)
	local           bool
}

// coldBatch is a namespace's objects with work here and their policies' other chunks.
type coldBatch struct {
	namespace string
	items     []coldItem
}

func newColdStart(nodeIP netip.Addr) *coldStart {
	return &coldStart{nodeIP: nodeIP, active: true, seen: map[string]struct{}{},
		queue: workqueue.NewTyped[*coldBatch]()}
}

// listed takes one PolicyEndpoint of the initial list.
func (s *coldStart) listed(pe *v1alpha1.PolicyEndpoint) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.active {
		return
	}
	if pe.Namespace != s.ns {
		if _, back := s.seen[pe.Namespace]; back {
			s.stopLocked() // not in key order: early starts end here
			return
		}
		s.completeLocked()
		s.seen[s.ns] = struct{}{}
		s.ns, s.buf = pe.Namespace, s.buf[:0]
	}
	local := selectsPodOn(pe, s.nodeIP) || slices.ContainsFunc(pe.Spec.PodSelectorEndpoints, func(ep v1alpha1.PodEndpoint) bool {
		_, err := netip.ParseAddr(string(ep.HostIP))
		return err != nil
	})
	it := coldItem{name: pe.Name, policyRef: pe.Spec.PolicyRef.Name, uid: pe.UID, rv: pe.ResourceVersion, local: local}
	if local {
		it.full = pe.DeepCopy()
		it.full.ManagedFields = nil
	}
	s.buf = append(s.buf, it)
}

// ended takes the end of the initial list: its last namespace is complete too.
func (s *coldStart) ended() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.active {
		return
	}
	s.completeLocked()
	s.seen[s.ns] = struct{}{}
	s.ns, s.buf = "", nil // anything listed after the end comes back: early starts end
}

// completeLocked makes the namespace listed so far a batch, if anything of it has work
// here; s.mu held.
func (s *coldStart) completeLocked() {
	policies := map[string]bool{}
	for _, it := range s.buf {
		if it.local {
			policies[it.policyRef] = true
		}
	}
	if len(policies) == 0 {
		return
	}
	b := &coldBatch{namespace: s.ns}
	for _, it := range s.buf {
		if it.local || (it.policyRef != "" && policies[it.policyRef]) {
			b.items = append(b.items, it)
		}
	}
	if s.open {
		s.queue.Add(b)
		return
	}
	s.held = append(s.held, b)
}

// openGate releases the batches held for the ClusterPolicyEndpoints.
func (s *coldStart) openGate() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.open = true
	for _, b := range s.held {
		s.queue.Add(b)
	}
	s.held = nil
}

func (s *coldStart) isActive() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.active
}

// stop ends early starts: the caches synced (or the list was not in key order).
func (s *coldStart) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked()
}

func (s *coldStart) stopLocked() {
	s.active, s.buf, s.held, s.seen = false, nil, nil, nil
	s.queue.ShutDown()
}

var _ kubewatch.ListProgress = relistObserver{}

// Listed implements kubewatch.ListProgress: the initial list's PolicyEndpoints go to
// the cold start.
func (o relistObserver) Listed(obj runtime.Object) {
	if o.kind != report.KindPolicyEndpoint || o.c.relists[o.kind].current() != 1 || o.c.cold == nil {
		return
	}
	if pe, ok := obj.(*v1alpha1.PolicyEndpoint); ok {
		o.c.cold.listed(pe)
	}
}

// ListEnded implements kubewatch.ListProgress: the initial list of PolicyEndpoints is
// complete.
func (o relistObserver) ListEnded() {
	if o.kind != report.KindPolicyEndpoint || o.c.relists[o.kind].current() != 1 || o.c.cold == nil {
		return
	}
	o.c.cold.ended()
}

// coldWorker commits the batches of the cold start until it stops.
func (c *Controller) coldWorker() {
	for {
		b, shutdown := c.cold.queue.Get()
		if shutdown {
			return
		}
		if c.cold.isActive() { // batches queued when the caches synced are the workers'
			c.commitBatch(b)
		}
		c.cold.queue.Done(b)
	}
}

// commitBatch compiles a namespace's batch, puts it in the pod table and commits the
// pods its local objects reach (see the top of the file). It gives up on the batch,
// leaving it to the ordinary sync, if any object of it does not compile or cannot be
// fetched.
func (c *Controller) commitBatch(b *coldBatch) {
	type version struct {
		key      translate.Key
		compiled *translate.Compiled
		local    bool
	}
	versions := make([]version, 0, len(b.items))
	for _, it := range b.items {
		key := translate.Key{Kind: report.KindPolicyEndpoint, Namespace: b.namespace, Name: it.name}
		pe := it.full
		if pe == nil { // a chunk with no pod here of a policy with one: fetched
			stub := &v1alpha1.PolicyEndpoint{}
			stub.Namespace, stub.Name, stub.UID, stub.ResourceVersion = b.namespace, it.name, it.uid, it.rv
			full, err := c.stubs.full(c.rc, stub)
			if err != nil {
				return
			}
			pe = full
		}
		compiled, err := c.cfg.Compile.PolicyEndpoint(pe, c.cfg.NodeIP)
		if err != nil {
			return
		}
		compiled = c.cfg.Compile.NodeLocal(compiled, pe, c.cfg.NodeIP)
		if err := compiled.BuildSets(nil); err != nil {
			return
		}
		versions = append(versions, version{key, compiled, it.local})
	}
	var pods []netip.Addr
	var local translate.Key
	for _, v := range versions {
		c.pods.preindex(v.key, v.compiled)
	}
	for _, v := range versions {
		if v.local {
			local = v.key
			pods = union(pods, c.pods.reachOf(v.key))
		}
	}
	if !c.pods.commitEarly(local, pods) {
		for _, v := range versions { // over its namespace's share: the ordinary sync rejects it
			c.pods.unpreindex(v.key, v.compiled)
		}
		return
	}
	for _, v := range versions {
		v.compiled.Settle()
	}
	c.cold.commits.Add(uint64(len(pods)))
	c.cold.batches.Add(1)
}

// preindexClusterPolicies puts every ClusterPolicyEndpoint in the pod table before
// any early commit; false if one does not compile (early starts are then given up:
// its last valid version is not known yet).
func (c *Controller) preindexClusterPolicies() bool {
	for _, obj := range c.informers[report.KindClusterPolicyEndpoint].GetStore().List() {
		cpe, ok := obj.(*v1alpha1.ClusterPolicyEndpoint)
		if !ok {
			return false
		}
		compiled, err := c.cfg.Compile.ClusterPolicyEndpoint(cpe, c.cfg.NodeIP)
		if err == nil {
			err = compiled.BuildSets(nil)
		}
		if err != nil {
			return false
		}
		c.pods.preindex(keyOf(report.KindClusterPolicyEndpoint, cpe), compiled)
	}
	return true
}

// runColdStart runs the cold start's gate and workers until the caches synced
// (synced closes); it returns once every early worker stopped.
func (c *Controller) runColdStart(synced <-chan struct{}, gate ...cache.InformerSynced) {
	var wg sync.WaitGroup
	for range c.cfg.Workers {
		wg.Go(c.coldWorker)
	}
	go func() {
		if cache.WaitForCacheSync(synced, gate...) {
			select {
			case <-synced:
				return
			default:
			}
			if c.preindexClusterPolicies() {
				c.cold.openGate()
				return
			}
			c.log.Warn("a ClusterPolicyEndpoint does not compile: this node's pods are programmed once the caches synced, not before")
			c.cold.stop()
		}
	}()
	<-synced
	c.cold.syncedAt.Store(time.Now().UnixNano())
	c.cold.stop()
	wg.Wait()
}

// reachOf returns the local pods key's version reaches.
func (t *podTable) reachOf(key translate.Key) []netip.Addr {
	t.mu.Lock()
	defer t.mu.Unlock()
	if st := t.objects[key]; st != nil {
		return t.reach(st.compiled)
	}
	return nil
}

// commitEarly merges and commits pods (all of key's namespace) from what the table
// holds — the cold start's commit: no object version changes — unless that takes the
// namespace over its share of a trie (see share.go): then it commits nothing and
// returns false.
func (t *podTable) commitEarly(key translate.Key, pods []netip.Addr) bool {
	if len(pods) == 0 {
		return true
	}
	res := t.lock()
	defer t.mu.Unlock()
	counts, over := t.measureShare(key, pods, true)
	if over != nil {
		return false
	}
	t.commitLocked(&res, pods)
	t.recordShare(key.Namespace, counts)
	return true
}

// unpreindex drops key's state if it is still the version preindex put there.
func (t *podTable) unpreindex(key translate.Key, compiled *translate.Compiled) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if st := t.objects[key]; st != nil && st.compiled == compiled && len(st.dirty)+len(st.held) == 0 {
		t.index(st, nil)
		delete(t.objects, key)
	}
}
