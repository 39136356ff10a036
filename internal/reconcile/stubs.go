package reconcile

import (
	"context"
	"fmt"
	"hash/maphash"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/translate"
)

// Stubs. Every agent receives every PolicyEndpoint of the cluster, and on a large one
// almost none of them has work on this node. The informer's transform (stubIndex.
// transform) keeps in full only the objects that may have: those selecting a pod here
// (or rules-only chunks: they apply to their siblings' pods), and every chunk of a
// policy one of whose chunks has. Any other object is cut down, in place, to a stub:
// its identity (uid, name, namespace, resourceVersion), the trigger and traceparent
// annotations, spec.policyRef, and its endpoints' hostIP (the nodes it selects) and
// podIP (explain places a pod of another node by it) — and its podSelector when the pod condition is written (it marks pods a policy
// selects before the controller lists them). Stubbed in place, because the ListWatch
// keeps the object it delivered (to re-deliver it on a relist): a copy would keep the
// full object alive there.
//
// A stub is marked by its generation, stubGeneration: the apiserver sets generation
// to 1 or more on every object, so a stub cannot be forged.
//
// Event handling is unchanged: the handlers record the stub's version and tell the
// seen-set its trigger at event time, as for any object. The worker syncs a stub of a
// policy with no work here without compiling it: nothing of it is, or was, on this
// node (or its previous version's pods are removed), and its trigger is consumed
// without a report. It is not validated either: an invalid object with no work here
// is not counted on this node (it is on the nodes of its pods) — except one with a
// hostIP that does not parse, which may be this node's: kept in full, it is rejected
// and counted as before. A stub's earlier version's last valid file stays (not
// restored: restoreLastValid skips stubs, whose version has no work here).
//
// When a policy gains work here (a chunk gains a pod on this node), its stubbed
// chunks are needed again: the worker fetches each one from the apiserver (a GET;
// kept in fetched until the informer holds the object in full, at its next write) and
// compiles it. Before committing any chunk of such a policy, the worker makes sure
// every chunk the cache holds is in the pod table (settleSiblings): a pod's policy is
// never committed from part of its chunks.
const stubGeneration = -1

// isStub reports whether obj is a PolicyEndpoint the transform cut down to a stub.
func isStub(obj any) bool {
	pe, ok := obj.(*v1alpha1.PolicyEndpoint)
	return ok && pe.Generation == stubGeneration
}

// stubIndex decides, in the informer's transform, which PolicyEndpoints are kept in
// full, and keeps the full versions of stubs fetched again. O(objects with work
// here), plus a few bytes per policy that got a stub.
type stubIndex struct {
	nodeIP        netip.Addr
	annotations   []string // the annotation keys a stub keeps
	keepSelector  bool     // a stub keeps its podSelector
	seed          maphash.Seed
	stubsMade     atomic.Uint64
	fetches       atomic.Uint64
	fetchFailures atomic.Uint64

	mu sync.Mutex
	// policies holds the policies with a chunk that has work here: chunk name →
	// whether it selects a pod here itself. Every chunk listed is kept in full.
	policies map[translate.PolicyKey]map[string]bool
	// stubbed holds a hash of every policy a stub was made of (a hint: a false
	// positive costs one scan of the cache, see scan).
	stubbed map[uint64]struct{}
	// scan holds the policies that gained work here while stubs of them may be
	// cached: their chunks are looked up in the cache once (Controller.siblings).
	scan map[translate.PolicyKey]struct{}
	// fetched holds full versions of stubs, fetched from the apiserver, by key.
	fetched map[translate.Key]*v1alpha1.PolicyEndpoint
}

func newStubIndex(nodeIP netip.Addr, keepAnnotations []string, keepSelector bool) *stubIndex {
	return &stubIndex{
		nodeIP: nodeIP, annotations: keepAnnotations, keepSelector: keepSelector, seed: maphash.MakeSeed(),
		policies: map[translate.PolicyKey]map[string]bool{},
		stubbed:  map[uint64]struct{}{},
		scan:     map[translate.PolicyKey]struct{}{},
		fetched:  map[translate.Key]*v1alpha1.PolicyEndpoint{},
	}
}

func (s *stubIndex) hash(p translate.PolicyKey) uint64 {
	var h maphash.Hash
	h.SetSeed(s.seed)
	h.WriteString(p.Namespace)
	h.WriteByte(0)
	h.WriteString(p.Name)
	return h.Sum64()
}

// transform is the PolicyEndpoint informer's transform: it drops managedFields and
// stubs an object with no work here (see the top of the file). It runs on the
// reflector's goroutine, on every object a list, stream or event brings, before the
// informer caches it and before its handlers run. A stub it is handed again (a relist
// re-delivers the cached object) is left as it is.
func (s *stubIndex) transform(obj any) (any, error) {
	pe, ok := obj.(*v1alpha1.PolicyEndpoint)
	if !ok {
		return transform(obj)
	}
	if pe.Generation == stubGeneration {
		return pe, nil
	}
	pe.ManagedFields = nil
	if s.keep(pe) {
		return pe, nil
	}
	s.stub(pe)
	s.stubsMade.Add(1)
	return pe, nil
}

// keep reports whether pe is kept in full, and records it in policies.
func (s *stubIndex) keep(pe *v1alpha1.PolicyEndpoint) bool {
	// An endpoint whose hostIP does not parse may be this node's: the worker rejects
	// the object (counted, its pods isolated if it has no valid version), as before.
	local := selectsPodOn(pe, s.nodeIP) || slices.ContainsFunc(pe.Spec.PodSelectorEndpoints, func(ep v1alpha1.PodEndpoint) bool {
		_, err := netip.ParseAddr(string(ep.HostIP))
		return err != nil
	})
	policy := translate.PolicyOf(report.KindPolicyEndpoint, pe.Namespace, pe.Spec.PolicyRef.Name)
	if policy == (translate.PolicyKey{}) {
		return local
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	chunks := s.policies[policy]
	switch {
	case local && chunks == nil:
		chunks = map[string]bool{}
		s.policies[policy] = chunks
		if _, ok := s.stubbed[s.hash(policy)]; ok {
			s.scan[policy] = struct{}{}
		}
		fallthrough
	case local:
		chunks[pe.Name] = true
		return true
	case chunks != nil:
		// A sibling has work here: kept. If this chunk had a pod here and was the
		// last to, the policy has none left; this version is kept still (its sync
		// removes its pods), later ones are stubbed.
		chunks[pe.Name] = false
		if !anyLocal(chunks) {
			s.dropPolicy(policy)
		}
		return true
	}
	s.stubbed[s.hash(policy)] = struct{}{}
	return false
}

func anyLocal(chunks map[string]bool) bool {
	for _, local := range chunks {
		if local {
			return true
		}
	}
	return false
}

// dropPolicy forgets a policy with no work here; s.mu held.
func (s *stubIndex) dropPolicy(policy translate.PolicyKey) {
	for name := range s.policies[policy] {
		delete(s.fetched, translate.Key{Kind: report.KindPolicyEndpoint, Namespace: policy.Namespace, Name: name})
	}
	delete(s.policies, policy)
	delete(s.scan, policy)
}

// stub cuts pe down to a stub, in place.
func (s *stubIndex) stub(pe *v1alpha1.PolicyEndpoint) {
	var ann map[string]string
	for _, k := range s.annotations {
		if v, ok := pe.Annotations[k]; ok {
			if ann == nil {
				ann = make(map[string]string, len(s.annotations))
			}
			ann[k] = v
		}
	}
	// Each endpoint's hostIP (the nodes it selects) and podIP (explain finds a pod of
	// another node by it); the pod's name and namespace go.
	var eps []v1alpha1.PodEndpoint
	if n := len(pe.Spec.PodSelectorEndpoints); n > 0 {
		eps = make([]v1alpha1.PodEndpoint, n)
		for i, ep := range pe.Spec.PodSelectorEndpoints {
			eps[i] = v1alpha1.PodEndpoint{HostIP: ep.HostIP, PodIP: ep.PodIP}
		}
	}
	selector := pe.Spec.PodSelector
	if !s.keepSelector {
		selector = nil
	}
	pe.ObjectMeta = metav1.ObjectMeta{
		Name: pe.Name, Namespace: pe.Namespace, UID: pe.UID, ResourceVersion: pe.ResourceVersion,
		Generation: stubGeneration, DeletionTimestamp: pe.DeletionTimestamp, Annotations: ann,
	}
	pe.Spec = v1alpha1.PolicyEndpointSpec{PodSelector: selector, PolicyRef: pe.Spec.PolicyRef, PodSelectorEndpoints: eps}
}

// needed reports whether the stub's policy has work here: the stub is then needed in
// full. It records the stub as one of the policy's chunks.
func (s *stubIndex) needed(pe *v1alpha1.PolicyEndpoint) bool {
	policy := translate.PolicyOf(report.KindPolicyEndpoint, pe.Namespace, pe.Spec.PolicyRef.Name)
	s.mu.Lock()
	defer s.mu.Unlock()
	chunks := s.policies[policy]
	if chunks == nil {
		return false
	}
	if _, ok := chunks[pe.Name]; !ok {
		chunks[pe.Name] = false
	}
	return true
}

// forget drops a deleted object's chunk and fetched version.
func (s *stubIndex) forget(key translate.Key, policyRef string) {
	policy := translate.PolicyOf(report.KindPolicyEndpoint, key.Namespace, policyRef)
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.fetched, key)
	if chunks := s.policies[policy]; chunks != nil {
		delete(chunks, key.Name)
		if !anyLocal(chunks) {
			s.dropPolicy(policy)
		}
	}
}

// chunks returns the names of policy's chunks known to have or need work here, after
// looking its stubs up with find when a scan is due (a policy with stubs cached gained
// work here). find runs under the index's lock: no chunk is missed while it runs.
func (s *stubIndex) chunks(policy translate.PolicyKey, find func(translate.PolicyKey) []string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	chunks := s.policies[policy]
	if chunks == nil {
		return nil
	}
	if _, ok := s.scan[policy]; ok {
		delete(s.scan, policy)
		for _, name := range find(policy) {
			if _, ok := chunks[name]; !ok {
				chunks[name] = false
			}
		}
	}
	names := make([]string, 0, len(chunks))
	for name := range chunks {
		names = append(names, name)
	}
	return names
}

// dropFetched drops the fetched version of key: the informer holds it in full, or it
// is not needed any more.
func (s *stubIndex) dropFetched(key translate.Key) {
	s.mu.Lock()
	delete(s.fetched, key)
	s.mu.Unlock()
}

// full returns the stub's object in full: fetched before (same uid and
// resourceVersion), or fetched now from the apiserver with a GET. A GET that finds a
// newer version returns it (the worker then runs ahead of the event, as when it reads
// the cache before the event reaches a handler); one that finds another uid (the
// object was recreated) or none is an error: the watch brings the change.
func (s *stubIndex) full(rc rest.Interface, stub *v1alpha1.PolicyEndpoint) (*v1alpha1.PolicyEndpoint, error) {
	key := keyOf(report.KindPolicyEndpoint, stub)
	s.mu.Lock()
	pe := s.fetched[key]
	s.mu.Unlock()
	if pe != nil && pe.UID == stub.UID && pe.ResourceVersion == stub.ResourceVersion {
		return pe, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), fetchTimeout)
	defer cancel()
	pe = &v1alpha1.PolicyEndpoint{}
	err := rc.Get().Namespace(stub.Namespace).Resource(v1alpha1.ResourcePolicyEndpoints).Name(stub.Name).Do(ctx).Into(pe)
	if err == nil && pe.UID != stub.UID {
		err = fmt.Errorf("the apiserver holds another object (uid %s) under its name: recreated", pe.UID)
	}
	if err != nil {
		s.fetchFailures.Add(1)
		return nil, fmt.Errorf("fetch the full object of a stub: %w", err)
	}
	s.fetches.Add(1)
	pe.ManagedFields = nil
	s.mu.Lock()
	s.fetched[key] = pe
	s.mu.Unlock()
	return pe, nil
}

// fetchTimeout bounds one GET of a stub's full object.
const fetchTimeout = 30 * time.Second

// syncStub syncs a stub of a policy with no work here: nothing is compiled. If the
// pod table holds an earlier version of the object (it had work here), this version
// replaces it with no pods and no rules, which re-commits the pods it had here.
func (c *Controller) syncStub(key translate.Key, pe *v1alpha1.PolicyEndpoint, workerStart time.Time) outcome {
	times := syncTimes{workerStart: workerStart, computeStart: time.Now()}
	v := c.versions.checkout(pe)
	times.computeEnd = times.computeStart
	log := c.log.With("kind", key.Kind.String(), "namespace", key.Namespace, "name", key.Name, "uid", v.uid, "resourceVersion", v.resourceVersion)
	var res commitResult
	if c.pods.holds(key) {
		empty := &translate.Compiled{Key: key, UID: v.uid, ResourceVersion: v.resourceVersion,
			Policy: translate.PolicyOf(key.Kind, key.Namespace, pe.Spec.PolicyRef.Name)}
		res = c.pods.commitVersion(key, v.uid, empty, nil, func(res *commitResult) { c.synced(v, res, nil) })
		defer func() { c.statusSynced(key, v.uid, v.resourceVersion, res.affected) }()
	} else {
		res.noLocalWork = true
		c.synced(v, &res, nil)
	}
	c.forgetDeleted(key, res.replaced)
	if res.rejected != nil {
		return c.rejected(key, v, res.rejected, &res, log)
	}
	return c.recordOutcome(key, v, pe.Spec.PolicyRef.Name, &res, times, log)
}

// settleSiblings makes sure, before a chunk of a policy with work here is committed,
// that the pod table holds a version of every other chunk of the policy the cache
// holds: a chunk not synced yet is compiled (fetched in full first if it is a stub)
// and indexed without a commit — the commit that follows merges it — and queued for
// its own sync (which reports its trigger). An invalid one is left to its own sync
// (rejected there, as always).
func (c *Controller) settleSiblings(key translate.Key, pe *v1alpha1.PolicyEndpoint) error {
	policy := translate.PolicyOf(report.KindPolicyEndpoint, pe.Namespace, pe.Spec.PolicyRef.Name)
	if policy == (translate.PolicyKey{}) {
		return nil
	}
	store := c.informers[report.KindPolicyEndpoint].GetIndexer()
	for _, name := range c.stubs.chunks(policy, c.findChunks) {
		sk := translate.Key{Kind: report.KindPolicyEndpoint, Namespace: policy.Namespace, Name: name}
		if sk == key {
			continue
		}
		obj, ok, err := store.GetByKey(sk.StoreKey())
		if err != nil || !ok {
			continue
		}
		sib, ok := obj.(*v1alpha1.PolicyEndpoint)
		if !ok || c.pods.holdsUID(sk, sib.UID) {
			continue
		}
		if isStub(sib) {
			if sib, err = c.stubs.full(c.rc, sib); err != nil {
				return fmt.Errorf("%s: %w", sk, err)
			}
		}
		compiled, err := c.compile(sib)
		if err == nil {
			err = compiled.BuildSets(nil)
		}
		if err == nil {
			c.pods.preindex(sk, compiled)
		}
		c.local.set(sk, true)
		c.queue.Add(sk)
	}
	return nil
}

// findChunks returns the names of policy's chunks in the PolicyEndpoint cache: a scan
// of every object, made once when a policy with stubs cached gains work here.
func (c *Controller) findChunks(policy translate.PolicyKey) []string {
	var names []string
	for _, obj := range c.informers[report.KindPolicyEndpoint].GetStore().List() {
		if pe, ok := obj.(*v1alpha1.PolicyEndpoint); ok && pe.Namespace == policy.Namespace && pe.Spec.PolicyRef.Name == policy.Name {
			names = append(names, pe.Name)
		}
	}
	return names
}

// holdsUID reports whether the table holds state for key of uid (a valid version, or a
// rejected one).
func (t *podTable) holdsUID(key translate.Key, uid types.UID) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.objects[key]
	return st != nil && st.uid == uid
}

// preindex indexes compiled, a valid version of a chunk not synced yet, as the key's
// version without committing anything: the commit of a sibling chunk that follows
// merges it (see settleSiblings). A key with state already is left alone.
func (t *podTable) preindex(key translate.Key, compiled *translate.Compiled) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.objects[key] != nil {
		return
	}
	st := &objectState{uid: compiled.UID}
	t.objects[key] = st
	t.index(st, compiled)
}
