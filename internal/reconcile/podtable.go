package reconcile

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/podif"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/translate"
)

// podTable is this node's view of the policy objects: the last valid version of each
// object key, which of them select each local pod, and which interface holds each
// pod's committed state. One mutex guards all of it and the dataplane calls: indexing
// a version, merging each affected pod's objects and committing them are one step, so
// the last commit of a pod always merges the newest versions, and an older version
// never overwrites a newer one.
//
// The controller splits a policy into several objects (chunks: some with rules and
// no pods). A pod any chunk selects is merged with every chunk of that policy, so a
// change to a rules-only chunk re-commits the pods its siblings select.
//
// Workers compile their object before they ask for the lock; the wait for it is
// measured (report.Attempt.Requested → Start) and so is the merge under it.
type podTable struct {
	dp       bpfmaps.Dataplane
	resolver podif.Resolver
	stats    *counters
	log      *slog.Logger

	mu         sync.Mutex
	objects    map[translate.Key]*objectState
	podIndex   map[netip.Addr]map[translate.Key]struct{}          // pod → the objects that list it
	chunks     map[translate.PolicyKey]map[translate.Key]struct{} // policy → its objects' keys
	programmed map[netip.Addr]int                                 // local pod → ifindex holding its committed state
	heldIndex  map[netip.Addr]map[translate.Key]struct{}          // pod → the objects holding it (see objectState.held)

	// strict is this node's pods in strict mode (nil: standard): one no object
	// selects is denied (denyStrict), not removed. strictDenied is the pods so
	// denied now; initialDone is set once the initial sync collected the leftovers.
	strict       *localPodSet
	strictDenied map[netip.Addr]struct{}
	initialDone  bool

	// uncommittable is the pods isolated because their policy could not be
	// committed (isolateUncommitted), until a commit or removal replaces it: for
	// the pod condition.
	uncommittable map[netip.Addr]struct{}
	// policySince is when a policy (not strict mode's denial) was first committed
	// to each pod since it had none: the end of a new pod's enforcement window.
	policySince map[netip.Addr]time.Time

	// versions mirrors objects[key].compiled, written under mu, read without (version).
	versions sync.Map

	// share bounds what one namespace's pods hold of each trie (see share.go).
	share namespaceShare
}

// objectState is what the table remembers of one object key.
type objectState struct {
	uid      types.UID
	compiled *translate.Compiled // last valid version, nil if none; its pods are in podIndex
	// dirty lists the pods a failed or incomplete commit still has to commit,
	// including pods the object no longer selects; the next sync of the key retries
	// them.
	dirty []netip.Addr
	// held lists the local pods that rejected versions name while no valid version of
	// the object is known to this process (after a restart: the valid one was seen by
	// the previous process). Their pinned enforcement is the last valid one: it is not
	// collected as a leftover, and a pod only held is never removed. A valid version
	// or the delete re-commits them.
	held []netip.Addr
	// isolation is, while the object has no valid version, what its rejected
	// version adds to the policy of the pods it names: the directions it isolates,
	// no allow rule (fail closed: an isolated direction allows only what a valid
	// object allows). Its pods are a subset of held. isolatedLogged are those
	// whose isolation was counted and logged.
	isolation      translate.Isolation
	isolatedLogged []netip.Addr
	// rejectedRV and waitingRV stop repeated logs for one resourceVersion.
	rejectedRV, waitingRV string
	// syncedRV is the resourceVersion the last sync of the key handled (committed,
	// rejected or waiting): a newer one in the informer's cache is pending (for the
	// pod condition).
	syncedRV string
}

func newPodTable(dp bpfmaps.Dataplane, resolver podif.Resolver, stats *counters, log *slog.Logger, strict *localPodSet, share float64) *podTable {
	return &podTable{
		dp: dp, resolver: resolver, stats: stats, log: log,
		objects:      map[translate.Key]*objectState{},
		podIndex:     map[netip.Addr]map[translate.Key]struct{}{},
		chunks:       map[translate.PolicyKey]map[translate.Key]struct{}{},
		programmed:   map[netip.Addr]int{},
		heldIndex:    map[netip.Addr]map[translate.Key]struct{}{},
		strict:       strict,
		strictDenied: map[netip.Addr]struct{}{},

		uncommittable: map[netip.Addr]struct{}{},
		policySince:   map[netip.Addr]time.Time{},
		share:         newNamespaceShare(dp, share),
	}
}

// commitResult is what one commit of an object's affected pods did.
type commitResult struct {
	attempt    report.Attempt // lock wait, then every merge and dataplane call; Err unset (see attemptWith)
	calls      int            // dataplane Commit/Remove calls made
	pods       int            // pods committed or removed
	entries    int            // map entries written
	notDone    []netip.Addr   // pods still to commit (interface missing, or failed)
	resolveErr error          // first resolver error
	err        error          // first dataplane error
	refused    bool           // some pod's policy is one the dataplane can never take (ErrInvalidPolicy)
	// affected are the pods this commit brought in line (for the pod condition).
	affected []netip.Addr
	// noLocalWork: nothing of the object is, or was, on this node; nothing was
	// committed (and the lock was not waited for in vain: see commitVersion).
	noLocalWork bool
	// replaced is the uid the key held before, when the object was deleted and
	// recreated under the same name; "" otherwise.
	replaced types.UID
	// rejected is set when the version, merged with the other objects of a pod it
	// reaches, is a policy the dataplane can never take: the version was dropped and
	// the object's previous version re-committed (see commitVersion).
	rejected *translate.FieldError
	// isolated are the pods this commit isolated, newly, because the object has no
	// valid version (objectState.isolation), with the directions; for the caller to
	// count and log. unisolable is the rejected version's endpoints that could not be
	// read, when the object has no valid version (nothing could be isolated for them).
	isolated     []netip.Addr
	isolatedDirs [2]bool
	unisolable   int
	// hostAddrs is the round's dump of the pods' host routes, per interface
	// (podAddrs); nil until a pod needs it.
	hostAddrs map[int][]netip.Addr
}

// attemptWith returns the attempt with err's message ("" for nil).
func (r *commitResult) attemptWith(err error) *report.Attempt {
	a := r.attempt
	if err != nil {
		a.Err = err.Error()
	}
	return &a
}

// lock takes the table's lock and opens an attempt that measures the wait for it.
func (t *podTable) lock() commitResult {
	var res commitResult
	res.attempt.Requested = time.Now()
	t.mu.Lock()
	res.attempt.Start = time.Now()
	return res
}

// commitVersion makes compiled the key's version (nil: the version read is invalid,
// rej is what could be read of it, and the last valid one stays) and commits every
// pod that depends on the change: the pods it selects, those it selected before, and
// those an earlier commit left undone. A recreated object (new uid) starts over: its
// predecessor's pods are re-committed without it.
//
// An invalid version of an object with no valid version (never accepted, or its
// merge refused) fails closed: the pods of its own namespace it names are isolated in
// the directions it names, merged with their other objects (see objectState.isolation)
// — except a pod whose interface holds state a previous process pinned, which is
// that process's last valid enforcement and is kept (held).
//
// A PolicyEndpoint version that would take its namespace over its share of a trie
// (see share.go) is rejected before any commit, as a merge the dataplane refuses is.
//
// settled, if not nil, is given the result before the table's lock is released: what
// the worker records of the sync (the explain history) is then there for any reader
// that saw the table after this commit (ExplainObject reads the table, then the
// history).
func (t *podTable) commitVersion(key translate.Key, uid types.UID, compiled *translate.Compiled, rej *translate.Rejected, settled func(*commitResult)) commitResult {
	res := t.lock()
	defer t.mu.Unlock()
	if settled != nil {
		defer func() { settled(&res) }() // before the unlock: deferred calls run last first
	}
	st := t.objects[key]
	if st == nil || st.uid != uid {
		next := &objectState{uid: uid}
		if st != nil {
			next.dirty = union(st.dirty, t.reach(st.compiled), st.held)
			t.index(st, nil)
			t.hold(key, st, nil, translate.Isolation{})
			res.replaced = st.uid
		}
		st = next
		t.objects[key] = st
	}
	affected := st.dirty
	prev, prevHeld, prevIsolation := st.compiled, st.held, st.isolation
	switch {
	case compiled != nil:
		before := t.reach(st.compiled)
		affected = union(st.dirty, before, st.held)
		t.hold(key, st, nil, translate.Isolation{})
		t.index(st, compiled)
		affected = union(affected, t.reach(compiled))
	case st.compiled == nil:
		// No valid version known here: whatever the previous process pinned for the
		// pods this version names is the last valid enforcement; keep it. The others
		// it isolates (and those it isolated before and names no more) are committed.
		iso := rej.Isolation
		affected = union(st.dirty, t.notPinned(union(st.isolation.Pods, iso.Pods)))
		t.hold(key, st, union(st.held, rej.Named), iso)
		res.unisolable = rej.Unreadable
	}
	if len(affected) == 0 {
		res.noLocalWork = true
		return res
	}
	// The namespace's share of the tries is checked before anything is committed: a
	// version over it is dropped as below, before it can take entries from others.
	counts, over := t.measureShare(key, affected, compiled != nil)
	if over == nil {
		t.commitLocked(&res, affected)
	}
	if compiled != nil && (over != nil || res.refused) {
		// Every other object on these pods was committed with them before: this
		// version is what does not fit (the dataplane refused the merge, or it
		// takes its namespace over its share, committing nothing). Left indexed, it would fail every later
		// commit of these pods and be blamed on their objects; drop it instead, and
		// re-commit the previous version where this one was committed. Without a
		// previous version, this one's pods are isolated in its directions.
		res.rejected = over
		if over == nil {
			res.rejected = &translate.FieldError{Path: "spec", Field: "spec", Value: key.String(),
				Msg: fmt.Sprintf("merged with the other objects selecting its pods, not a policy the dataplane can take: %v", res.err)}
		}
		counts = nil
		t.index(st, prev)
		if prev == nil && compiled.Key.Kind == report.KindPolicyEndpoint {
			prevIsolation = translate.Isolation{Pods: compiled.Pods, Dirs: compiled.Isolated}
			prevHeld = union(prevHeld, compiled.Pods)
		}
		t.hold(key, st, prevHeld, prevIsolation)
		res.err, res.notDone, res.refused = nil, nil, false
		t.commitLocked(&res, affected)
	}
	t.recordShare(key.Namespace, counts)
	t.noteIsolated(&res, st)
	st.dirty = res.notDone
	if compiled != nil && res.rejected == nil && res.err == nil && len(res.notDone) == 0 {
		st.waitingRV, st.rejectedRV = "", "" // committed: a later wait or rejection logs again
	}
	return res
}

// version returns the key's last valid version if it has uid, else nil: what a new
// version's rule sets are built from (translate.Compiled.BuildSets). It does not wait
// for mu: a worker builds them before it asks for the lock.
func (t *podTable) version(key translate.Key, uid types.UID) *translate.Compiled {
	if v, ok := t.versions.Load(key); ok && v.(*translate.Compiled).UID == uid {
		return v.(*translate.Compiled)
	}
	return nil
}

// commitDeleted re-commits the pods the deleted object under key selected, without
// it, and drops the key once that is done. It returns the uid the key held, "" if
// none.
func (t *podTable) commitDeleted(key translate.Key) (commitResult, types.UID) {
	res := t.lock()
	defer t.mu.Unlock()
	st := t.objects[key]
	if st == nil {
		return res, ""
	}
	affected := union(st.dirty, t.reach(st.compiled), st.held)
	t.index(st, nil)
	t.hold(key, st, nil, translate.Isolation{})
	counts, _ := t.measureShare(key, affected, false)
	t.commitLocked(&res, affected)
	t.recordShare(key.Namespace, counts)
	st.dirty = res.notDone
	if res.err == nil && len(res.notDone) == 0 {
		delete(t.objects, key)
	}
	return res, st.uid
}

// reach returns the local pods a version's rules apply to: its own, and those of
// every other chunk of its policy. Called with mu held.
func (t *podTable) reach(c *translate.Compiled) []netip.Addr {
	if c == nil {
		return nil
	}
	if c.Policy == (translate.PolicyKey{}) {
		return c.Pods
	}
	var lists [][]netip.Addr
	for k := range t.chunks[c.Policy] {
		if st := t.objects[k]; st != nil && st.compiled != nil {
			lists = append(lists, st.compiled.Pods)
		}
	}
	return union(append(lists, c.Pods)...)
}

// objectsFor returns the valid versions a pod's policy merges: every object that
// lists the pod, and every other chunk of their policies. Called with mu held.
func (t *podTable) objectsFor(pod netip.Addr, objs []*translate.Compiled) []*translate.Compiled {
	for k := range t.podIndex[pod] {
		st := t.objects[k]
		if st == nil || st.compiled == nil {
			continue
		}
		if st.compiled.Policy == (translate.PolicyKey{}) {
			objs = appendOnce(objs, st.compiled)
			continue
		}
		for sibling := range t.chunks[st.compiled.Policy] {
			if sst := t.objects[sibling]; sst != nil && sst.compiled != nil {
				objs = appendOnce(objs, sst.compiled)
			}
		}
	}
	return objs
}

// appendOnce appends c unless objs holds it already (a pod is listed by several
// chunks of one policy).
func appendOnce(objs []*translate.Compiled, c *translate.Compiled) []*translate.Compiled {
	for _, o := range objs {
		if o == c {
			return objs
		}
	}
	return append(objs, c)
}

// index makes compiled the state's version and updates podIndex. Called with mu held.
func (t *podTable) index(st *objectState, compiled *translate.Compiled) {
	if old := st.compiled; old != nil {
		for _, pod := range old.Pods {
			keys := t.podIndex[pod]
			delete(keys, old.Key)
			if len(keys) == 0 {
				delete(t.podIndex, pod)
			}
		}
		if old.Policy != (translate.PolicyKey{}) {
			delete(t.chunks[old.Policy], old.Key)
			if len(t.chunks[old.Policy]) == 0 {
				delete(t.chunks, old.Policy)
			}
		}
	}
	if old := st.compiled; old != nil && compiled == nil {
		t.versions.CompareAndDelete(old.Key, old)
	}
	st.compiled = compiled
	if compiled == nil {
		return
	}
	t.versions.Store(compiled.Key, compiled)
	if compiled.Policy != (translate.PolicyKey{}) {
		if t.chunks[compiled.Policy] == nil {
			t.chunks[compiled.Policy] = map[translate.Key]struct{}{}
		}
		t.chunks[compiled.Policy][compiled.Key] = struct{}{}
	}
	for _, pod := range compiled.Pods {
		keys := t.podIndex[pod]
		if keys == nil {
			keys = map[translate.Key]struct{}{}
			t.podIndex[pod] = keys
		}
		keys[compiled.Key] = struct{}{}
	}
}

// hold makes pods the held pods of key's state st, and iso (its pods among them) its
// isolation, and updates heldIndex. Called with mu held.
func (t *podTable) hold(key translate.Key, st *objectState, pods []netip.Addr, iso translate.Isolation) {
	if len(iso.Pods) == 0 {
		st.isolatedLogged = nil
	} else {
		st.isolatedLogged = slices.DeleteFunc(st.isolatedLogged, func(p netip.Addr) bool { return !slices.Contains(iso.Pods, p) })
	}
	st.isolation = iso
	for _, pod := range st.held {
		keys := t.heldIndex[pod]
		delete(keys, key)
		if len(keys) == 0 {
			delete(t.heldIndex, pod)
		}
	}
	st.held = pods
	for _, pod := range pods {
		keys := t.heldIndex[pod]
		if keys == nil {
			keys = map[translate.Key]struct{}{}
			t.heldIndex[pod] = keys
		}
		keys[key] = struct{}{}
	}
}

// restore indexes compiled, a valid version a previous process committed, as the
// key's version without committing anything: the first sync of any object reaching
// its pods commits them, merged with it. Before the workers start only.
func (t *podTable) restore(key translate.Key, compiled *translate.Compiled) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.objects[key] != nil {
		return
	}
	st := &objectState{uid: compiled.UID}
	t.objects[key] = st
	t.index(st, compiled)
	st.dirty = t.reach(compiled)
}

// noteRejected records that the key's version rv was rejected; it reports whether
// this is the first time for rv (to log and count it once per written version).
func (t *podTable) noteRejected(key translate.Key, uid types.UID, rv string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.objects[key]
	if st == nil || st.uid != uid {
		return true // not reached through commitVersion (which creates the state)
	}
	first := st.rejectedRV != rv
	st.rejectedRV = rv
	return first
}

// noteWaiting records that the key's version rv waits for pod interfaces; it reports
// whether this is the first time for rv.
func (t *podTable) noteWaiting(key translate.Key, rv string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.objects[key]
	if st == nil {
		return false
	}
	first := st.waitingRV != rv
	st.waitingRV = rv
	return first
}

// commitLocked merges and commits the policy of each pod: every object that selects
// it now. A pod no object selects any more is removed from the dataplane, or in
// strict mode denied (denyStrict). Called with mu held, on a result opened by lock.
func (t *podTable) commitLocked(res *commitResult, pods []netip.Addr) {
	res.affected = append(res.affected, pods...)
	objs := make([]*translate.Compiled, 0, 4)
	for _, pod := range pods {
		objs = t.objectsFor(pod, objs[:0])
		iso := t.isolatedBy(pod)
		if len(objs) == 0 && (iso == [2]bool{} || t.strict != nil) {
			// Strict mode denies both ways a pod no valid object selects.
			t.unselected(res, pod)
			continue
		}
		mergeStart := time.Now()
		policy := translate.MergePodPolicy(objs)
		policy.Ingress.Isolated = policy.Ingress.Isolated || iso[bpfmaps.Ingress]
		policy.Egress.Isolated = policy.Egress.Isolated || iso[bpfmaps.Egress]
		res.attempt.Phases.Merge += time.Since(mergeStart)
		// A policy the dataplane can never take is not isolated: the caller drops
		// the version that made it so (see commitVersion).
		switch err := t.commitPod(res, pod, &policy); {
		case err == nil && (len(res.notDone) == 0 || res.notDone[len(res.notDone)-1] != pod):
			t.strictReleased(pod) // its policy replaced a strict denial
		case err == nil: // its interface is not there: nothing committed
		case !errors.Is(err, bpfmaps.ErrInvalidPolicy):
			t.isolateUncommitted(res, pod, &policy, objs)
		}
	}
	res.attempt.End = time.Now()
}

// isolatedBy returns the directions the objects with no valid version that name the
// pod isolate (objectState.isolation). Called with mu held.
func (t *podTable) isolatedBy(pod netip.Addr) (dirs [2]bool) {
	for key := range t.heldIndex[pod] {
		if st := t.objects[key]; st != nil {
			if _, ok := slices.BinarySearchFunc(st.isolation.Pods, pod, netip.Addr.Compare); ok {
				dirs[0] = dirs[0] || st.isolation.Dirs[0]
				dirs[1] = dirs[1] || st.isolation.Dirs[1]
			}
		}
	}
	return dirs
}

// notPinned returns the pods whose interface holds no state a previous process
// pinned and this one did not replace: those an isolation may be committed to. A pod
// whose interface cannot be resolved is kept (its commit waits for it). Called with
// mu held.
func (t *podTable) notPinned(pods []netip.Addr) []netip.Addr {
	var keep []netip.Addr
	for _, pod := range pods {
		if _, ok := t.programmed[pod]; !ok {
			if ifindex, err := t.resolver.Resolve(pod); err == nil && t.pinnedOnly(ifindex) {
				continue
			}
		}
		keep = append(keep, pod)
	}
	return keep
}

// noteIsolated lists in res the pods of st's isolation this commit reached that were
// not counted and logged yet (see objectState.isolation). Called with mu held.
func (t *podTable) noteIsolated(res *commitResult, st *objectState) {
	for _, pod := range st.isolation.Pods {
		if slices.Contains(st.isolatedLogged, pod) || slices.Contains(res.notDone, pod) {
			continue
		}
		if _, ok := t.programmed[pod]; !ok {
			continue // not committed here: its pinned state is kept
		}
		if _, ok := t.strictDenied[pod]; ok {
			continue // strict mode denies it, and counts that
		}
		st.isolatedLogged = append(st.isolatedLogged, pod)
		res.isolated = append(res.isolated, pod)
	}
	res.isolatedDirs = st.isolation.Dirs
}

// removePod removes the state of a pod no object selects any more: what this process
// committed, or else what a previous one pinned on the pod's interface (a pod held
// after a restart, whose object was then fixed or deleted).
func (t *podTable) removePod(res *commitResult, pod netip.Addr) {
	ifindex, ok := t.programmed[pod]
	if !ok {
		var err error
		if ifindex, err = t.resolver.Resolve(pod); err != nil || !t.pinnedOnly(ifindex) {
			return // no state on its interface, or another pod's: nothing to remove
		}
	}
	res.calls++
	cr, err := t.dp.Remove(ifindex)
	if err != nil {
		t.stats.commitFailures.Add(1)
		res.err = firstErr(res.err, fmt.Errorf("remove pod %s (ifindex %d): %w", pod, ifindex, err))
		res.notDone = append(res.notDone, pod)
		return
	}
	addPhases(&res.attempt, cr)
	delete(t.programmed, pod)
	delete(t.strictDenied, pod)
	delete(t.uncommittable, pod)
	delete(t.policySince, pod)
	t.stats.removes.Add(1)
	res.pods++
}

// commitPod commits one pod's merged policy to its interface. It returns the
// dataplane's error when the interface is there and the commit failed.
func (t *podTable) commitPod(res *commitResult, pod netip.Addr, policy *bpfmaps.PodPolicy) error {
	ifindex, err := t.resolver.Resolve(pod)
	if err != nil {
		if res.resolveErr == nil {
			res.resolveErr = err
		}
		res.notDone = append(res.notDone, pod)
		return nil
	}
	if old, ok := t.programmed[pod]; ok && old != ifindex {
		// The pod's interface changed (pod recreated with the same IP): the old
		// interface's state is stale.
		res.calls++
		if _, err := t.dp.Remove(old); err != nil {
			t.log.Warn("remove stale pod state", "pod", pod, "ifindex", old, "err", err)
		}
		delete(t.programmed, pod)
	}
	res.calls++
	p := *policy
	p.Addrs = t.podAddrs(res, pod, ifindex)
	cr, err := t.dp.Commit(ifindex, p)
	if err != nil {
		t.stats.commitFailures.Add(1)
		res.err = firstErr(res.err, fmt.Errorf("commit pod %s (ifindex %d): %w", pod, ifindex, err))
		res.notDone = append(res.notDone, pod)
		res.refused = res.refused || errors.Is(err, bpfmaps.ErrInvalidPolicy)
		return err
	}
	addPhases(&res.attempt, cr)
	t.programmed[pod] = ifindex
	delete(t.uncommittable, pod)
	if _, ok := t.policySince[pod]; !ok {
		t.policySince[pod] = cr.Switched
		if cr.Switched.IsZero() {
			t.policySince[pod] = time.Now()
		}
	}
	t.stats.commits.Add(1)
	if cr.Skipped {
		t.stats.commitsSkipped.Add(1)
	}
	t.stats.entriesWritten.Add(uint64(cr.EntriesWritten))
	res.entries += cr.EntriesWritten
	res.pods++
	return nil
}

// isolateUncommitted denies the pod every direction its policy would constrain (in
// strict mode both), when that policy could not be committed and the pod's interface
// holds no state at all: it would otherwise stay open while the commit is retried
// (capacity, a kernel error).
// The node exemption still applies (the datapath checks it first). A pod with state
// keeps it: that is its last committed policy. The key is retried as for any failed
// commit; the next successful commit replaces the isolation.
func (t *podTable) isolateUncommitted(res *commitResult, pod netip.Addr, policy *bpfmaps.PodPolicy, objs []*translate.Compiled) {
	if _, ok := t.programmed[pod]; ok {
		return
	}
	ifindex, err := t.resolver.Resolve(pod)
	if err != nil || slices.Contains(t.dp.Pods(), ifindex) {
		return // pinned by a previous process: its enforcement stays
	}
	ingress, egress := constrains(&policy.Ingress), constrains(&policy.Egress)
	if t.strict != nil {
		// Strict mode: a local pod is denied both ways until programmed, whether or
		// not the pod watch has reported it yet.
		ingress, egress = true, true
	}
	names := make([]string, len(objs))
	for i, o := range objs {
		names[i] = o.Key.String()
	}
	if _, err := t.commitDeny(res, pod, ifindex, ingress, egress); err != nil {
		t.log.Error("pod left open: neither its policy nor an isolation could be committed", "pod", pod, "ifindex", ifindex, "objects", names, "err", err)
		return
	}
	t.stats.podsIsolated.Add(1)
	t.uncommittable[pod] = struct{}{}
	t.log.Error("pod isolated: its policy could not be committed", "pod", pod, "ifindex", ifindex, "objects", names,
		"ingressDenied", ingress, "egressDenied", egress, "err", res.err)
}

// commitDeny commits to the pod's interface a policy that denies the directions
// given, and nothing else: the node exemption still applies (the datapath checks it
// first). The isolation of a pod whose policy could not be committed, and strict
// mode's default deny, are both this.
func (t *podTable) commitDeny(res *commitResult, pod netip.Addr, ifindex int, ingress, egress bool) (bpfmaps.CommitResult, error) {
	deny := bpfmaps.PodPolicy{
		Ingress: bpfmaps.DirectionPolicy{Isolated: ingress},
		Egress:  bpfmaps.DirectionPolicy{Isolated: egress},
		Addrs:   t.podAddrs(res, pod, ifindex),
	}
	res.calls++
	cr, err := t.dp.Commit(ifindex, deny)
	if err != nil {
		t.stats.commitFailures.Add(1)
		return cr, err
	}
	t.programmed[pod] = ifindex
	return cr, nil
}

// podAddrs returns the addresses the pod on ifindex may send from (anti-spoofing:
// bpfmaps.PodPolicy.Addrs): every address whose host route names the interface, when
// the resolver lists them (podif.AddrLister: both addresses of a dual-stack pod,
// whichever of them this commit is for), else the pod IPs this table committed to
// the interface. pod is always one of them; the list stops at bpfmaps.MaxPodAddrs.
// One route dump serves the round res (every pod it commits, both IPs of a
// dual-stack pod): a dump that lacks pod was made before its host route was there,
// and is made again. Called with mu held.
func (t *podTable) podAddrs(res *commitResult, pod netip.Addr, ifindex int) []netip.Addr {
	addrs := []netip.Addr{pod.Unmap()}
	var more []netip.Addr
	if l, ok := t.resolver.(podif.AddrLister); ok {
		if !slices.Contains(res.hostAddrs[ifindex], pod.Unmap()) {
			all, err := l.HostAddrsByInterface()
			if err != nil {
				t.log.Warn("list pod addresses: only the committed pod IPs are its own", "pod", pod, "ifindex", ifindex, "err", err)
			}
			res.hostAddrs = all
		}
		more = res.hostAddrs[ifindex]
	}
	if more == nil {
		for other, i := range t.programmed {
			if i == ifindex {
				more = append(more, other.Unmap())
			}
		}
		slices.SortFunc(more, netip.Addr.Compare)
	}
	for _, a := range more {
		if len(addrs) < bpfmaps.MaxPodAddrs && !slices.Contains(addrs, a) {
			addrs = append(addrs, a)
		}
	}
	return addrs
}

// constrains reports whether a direction's policy restricts anything: without it
// (no policy isolates it, no tier rule) the direction is open by design.
func constrains(d *bpfmaps.DirectionPolicy) bool {
	return d.Isolated || len(d.Admin) > 0 || len(d.Baseline) > 0
}

// pinnedOnly reports whether the dataplane holds state for ifindex that no commit of
// this process made. Called with mu held.
func (t *podTable) pinnedOnly(ifindex int) bool {
	for _, i := range t.programmed {
		if i == ifindex {
			return false
		}
	}
	return slices.Contains(t.dp.Pods(), ifindex)
}

// addPhases adds what the dataplane measured of one call to an attempt: its phases,
// and its switch time to when the attempt took effect.
func addPhases(a *report.Attempt, cr bpfmaps.CommitResult) {
	if cr.Switched.After(a.Programmed) {
		a.Programmed = cr.Switched // the attempt takes effect with its last switch
	}
	p := &a.Phases
	p.Compile += cr.Compile
	p.Attach += cr.Attach
	p.Write += cr.Write
	p.Switch += cr.Switch
	p.Cleanup += cr.Cleanup
}

// removeLeftovers removes pod state the dataplane holds (pinned by a previous
// process) for interfaces no current object wants. An interface is kept if a commit
// made it, or if it is what a pod some object still selects resolves to (its commit
// may have failed and be retried: its old enforcement stays meanwhile), or a pod an
// object whose current version is invalid names (its pinned state is the last valid
// enforcement, which no version known to this process can rebuild), or in strict
// mode any pod of this node.
func (t *podTable) removeLeftovers() (removed int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	wanted := map[int]bool{}
	for _, ifindex := range t.programmed {
		wanted[ifindex] = true
	}
	for _, index := range []map[netip.Addr]map[translate.Key]struct{}{t.podIndex, t.heldIndex} {
		for pod := range index {
			if ifindex, err := t.resolver.Resolve(pod); err == nil {
				wanted[ifindex] = true
			}
		}
	}
	if t.strict != nil {
		// Strict mode: a pod of this node is never opened; what a previous process
		// left on it (its strict denial, or a policy since deleted) stays until
		// denyStrict replaces it.
		for _, pod := range t.strict.all() {
			if ifindex, err := t.resolver.Resolve(pod); err == nil {
				wanted[ifindex] = true
			}
		}
	}
	t.initialDone = true
	for _, ifindex := range t.dp.Pods() {
		if wanted[ifindex] {
			continue
		}
		if _, err := t.dp.Remove(ifindex); err != nil {
			t.stats.commitFailures.Add(1)
			t.log.Warn("remove leftover pod state", "ifindex", ifindex, "err", err)
			continue
		}
		t.stats.removes.Add(1)
		removed++
	}
	return removed
}

// size returns how many object keys the table tracks, how many local pods hold
// committed state, and how many of those strict mode denies.
func (t *podTable) size() (objects, pods, strictDenied int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.objects), len(t.programmed), len(t.strictDenied)
}

// invalidPolicy reports whether a commit failed on input the dataplane can never take
// (retrying the same input cannot help).
func (r *commitResult) invalidPolicy() bool { return errors.Is(r.err, bpfmaps.ErrInvalidPolicy) }

// firstErr keeps the first error.
func firstErr(first, next error) error {
	if first != nil {
		return first
	}
	return next
}

// union returns the sorted union of the pod lists, without duplicates.
func union(lists ...[]netip.Addr) []netip.Addr {
	set := map[netip.Addr]struct{}{}
	for _, l := range lists {
		for _, p := range l {
			set[p] = struct{}{}
		}
	}
	out := make([]netip.Addr, 0, len(set))
	for p := range set {
		out = append(out, p)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}
