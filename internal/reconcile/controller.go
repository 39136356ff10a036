package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/podif"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/seen"
)

// Config configures New. Zero fields take the defaults stated.
type Config struct {
	// NodeName is this node's name, for logs.
	NodeName string
	// NodeIP selects the local pods: those whose hostIP equals it. Required.
	NodeIP netip.Addr
	// Dataplane receives the commits. Required.
	Dataplane bpfmaps.Dataplane
	// Seen is the consume-once seen-set. Required.
	Seen *seen.Set
	// Sink receives reports and commit attempts. Default: discarded.
	Sink report.Sink
	// Resolver maps pod IPs to interfaces. Default podif.NewRouteResolver().
	Resolver podif.Resolver
	// TriggerAnnotation is the trigger time annotation. Default
	// v1alpha1.AnnotationLastChangeTriggerTime.
	TriggerAnnotation string
	// TraceParentAnnotation is the W3C traceparent annotation. Default
	// v1alpha1.AnnotationTraceParent.
	TraceParentAnnotation string
	// ResyncPeriod is the informers' resync period. Default 0: no resync. A resync only
	// re-delivers cached objects (counted, dropped): nothing is re-committed.
	ResyncPeriod time.Duration
	// Workers is how many keys are synced concurrently. Default 2.
	Workers int
	// MaxRetryDelay caps the per-object exponential backoff of retries (failed commits,
	// interfaces not there yet). Default 30s.
	MaxRetryDelay time.Duration
	// Logger receives the loop's logs. Default slog.Default().
	Logger *slog.Logger
}

// Controller is the reconcile loop. Build it with New, start it with Run.
type Controller struct {
	cfg           Config
	log           *slog.Logger
	sink          report.Sink
	informers     [report.NumKinds]cache.SharedIndexInformer
	registrations [report.NumKinds]cache.ResourceEventHandlerRegistration
	queue         workqueue.TypedRateLimitingInterface[objectKey]
	started       atomic.Bool

	// relists tells a relist's re-deliveries apart (see transform).
	relists [report.NumKinds]relistTracker

	// mu guards objects and podIndex: the last valid version of every object this node
	// cares about, and which of them select each local pod.
	mu       sync.Mutex
	objects  map[objectKey]*objectState
	podIndex map[netip.Addr]map[objectKey]struct{}

	// commitMu serializes the merge-and-commit phase of every sync, so the last commit
	// of a pod always merges the newest compiled objects (each object's worker updates
	// its compiled version before it takes commitMu, so a pod is re-merged after every
	// change that affects it). It also guards programmed.
	commitMu   sync.Mutex
	programmed map[netip.Addr]int // local pod → ifindex holding its committed state

	// initialKeys are the keys of the initial list not synced yet; nil once all were.
	// Then the dataplane's leftovers are collected (see collectGarbage).
	initialMu   sync.Mutex
	initialKeys map[objectKey]struct{}

	stats counters
}

// objectState is what the loop remembers of one object key.
type objectState struct {
	uid      types.UID
	compiled *compiledObject // last valid version, nil if none; its pods are in podIndex
	// dirty lists the pods a failed or incomplete sync still has to commit, including
	// pods the object no longer selects; the next sync of the key retries them.
	dirty []netip.Addr
	// rejectedRV and waitingRV stop repeated logs for one resourceVersion.
	rejectedRV, waitingRV string
}

// New builds the loop: a REST client for networking.k8s.aws/v1alpha1, one shared
// informer per kind, and the workqueue. Nothing runs until Run.
func New(restConfig *rest.Config, cfg Config) (*Controller, error) {
	if !cfg.NodeIP.IsValid() {
		return nil, errors.New("reconcile: config: NodeIP is not set")
	}
	if cfg.Dataplane == nil {
		return nil, errors.New("reconcile: config: Dataplane is not set")
	}
	if cfg.Seen == nil {
		return nil, errors.New("reconcile: config: Seen is not set")
	}
	cfg.NodeIP = cfg.NodeIP.Unmap()
	if cfg.Sink == nil {
		cfg.Sink = report.Discard{}
	}
	if cfg.Resolver == nil {
		cfg.Resolver = podif.NewRouteResolver()
	}
	if cfg.TriggerAnnotation == "" {
		cfg.TriggerAnnotation = v1alpha1.AnnotationLastChangeTriggerTime
	}
	if cfg.TraceParentAnnotation == "" {
		cfg.TraceParentAnnotation = v1alpha1.AnnotationTraceParent
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 2
	}
	if cfg.MaxRetryDelay <= 0 {
		cfg.MaxRetryDelay = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c := &Controller{
		cfg:  cfg,
		log:  cfg.Logger.With("node", cfg.NodeName),
		sink: cfg.Sink,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[objectKey](5*time.Millisecond, cfg.MaxRetryDelay),
			workqueue.TypedRateLimitingQueueConfig[objectKey]{}),
		objects:    map[objectKey]*objectState{},
		podIndex:   map[netip.Addr]map[objectKey]struct{}{},
		programmed: map[netip.Addr]int{},
	}

	rc, err := newRESTClient(restConfig)
	if err != nil {
		return nil, err
	}
	kinds := [report.NumKinds]struct {
		resource string
		example  runtime.Object
	}{
		report.KindPolicyEndpoint:        {v1alpha1.ResourcePolicyEndpoints, &v1alpha1.PolicyEndpoint{}},
		report.KindClusterPolicyEndpoint: {v1alpha1.ResourceClusterPolicyEndpoints, &v1alpha1.ClusterPolicyEndpoint{}},
	}
	for kind := range report.Kind(report.NumKinds) {
		lw := newListWatch(rc, kinds[kind].resource, func() { c.relists[kind].begin() })
		inf := cache.NewSharedIndexInformerWithOptions(lw, kinds[kind].example,
			cache.SharedIndexInformerOptions{ResyncPeriod: cfg.ResyncPeriod, ObjectDescription: kind.String()})
		c.informers[kind] = inf
		if err := inf.SetTransform(c.transform(kind)); err != nil {
			return nil, fmt.Errorf("reconcile: %s informer: %w", kind, err)
		}
		reg, err := inf.AddEventHandler(c.handler(kind))
		if err != nil {
			return nil, fmt.Errorf("reconcile: %s informer: %w", kind, err)
		}
		c.registrations[kind] = reg
	}
	return c, nil
}

// Run starts the informers and the workers and blocks until ctx is done; then it stops
// taking work, lets in-flight syncs finish, and returns nil. It returns an error if ctx
// ends before the caches sync, or if called twice.
func (c *Controller) Run(ctx context.Context) error {
	if !c.started.CompareAndSwap(false, true) {
		return errors.New("reconcile: Run called twice")
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer c.queue.ShutDown() // runs before wg.Wait: wakes workers blocked in Get
	for _, inf := range c.informers {
		wg.Go(func() { inf.RunWithContext(ctx) })
	}
	c.log.Info("waiting for informer caches", "nodeIP", c.cfg.NodeIP)
	if !cache.WaitForCacheSync(ctx.Done(), c.HasSynced) {
		return fmt.Errorf("reconcile: informer caches did not sync: %w", context.Cause(ctx))
	}
	pruned := c.pruneSeen()
	c.log.Info("informer caches synced", "objects", len(c.informers[report.KindPolicyEndpoint].GetStore().ListKeys())+len(c.informers[report.KindClusterPolicyEndpoint].GetStore().ListKeys()),
		"seenPruned", pruned, "workers", c.cfg.Workers)
	c.initialMu.Lock()
	c.initialKeys = map[objectKey]struct{}{}
	for kind, inf := range c.informers {
		for _, k := range inf.GetStore().ListKeys() {
			ns, name, _ := cache.SplitMetaNamespaceKey(k)
			c.initialKeys[objectKey{kind: report.Kind(kind), namespace: ns, name: name}] = struct{}{}
		}
	}
	c.initialMu.Unlock()
	c.initialSynced(objectKey{})
	for range c.cfg.Workers {
		wg.Go(func() {
			for c.processNext(ctx) {
			}
		})
	}
	<-ctx.Done()
	c.log.Info("stopping: finishing in-flight syncs")
	return nil
}

// HasSynced reports whether both informer caches have synced and their initial
// objects have reached the event handlers (for /readyz).
func (c *Controller) HasSynced() bool {
	for _, r := range c.registrations {
		if r == nil || !r.HasSynced() {
			return false
		}
	}
	return true
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

// processNext syncs one key. It returns false when the loop stops.
func (c *Controller) processNext(ctx context.Context) bool {
	key, shutdown := c.queue.Get()
	if shutdown {
		return false
	}
	defer c.queue.Done(key)
	if ctx.Err() != nil {
		return false // stop taking work; what is queued is re-listed at the next start
	}
	c.stats.syncs.Add(1)
	switch c.sync(key, time.Now()) {
	case outcomeDone, outcomeGiveUp:
		c.queue.Forget(key)
	case outcomeRetry:
		c.stats.deliveries[key.kind][report.CauseRequeue].Add(1)
		c.queue.AddRateLimited(key)
	}
	c.initialSynced(key)
	return true
}

// initialSynced notes that key was synced once; after the last key of the initial list,
// it collects the dataplane's leftovers.
func (c *Controller) initialSynced(key objectKey) {
	c.initialMu.Lock()
	if c.initialKeys == nil {
		c.initialMu.Unlock()
		return
	}
	delete(c.initialKeys, key)
	done := len(c.initialKeys) == 0
	if done {
		c.initialKeys = nil
	}
	c.initialMu.Unlock()
	if done {
		c.collectGarbage()
	}
}

// collectGarbage removes pod state the dataplane holds (pinned by a previous process)
// for interfaces no current object wants: pods whose every policy was deleted while
// the agent was down, or that are gone. It runs once, after every object of the initial
// list was synced. An interface is kept if a sync committed it, or if it is what a pod
// some object still selects resolves to (its commit may have failed and be retried:
// its old enforcement stays meanwhile).
func (c *Controller) collectGarbage() {
	c.mu.Lock()
	selected := make([]netip.Addr, 0, len(c.podIndex))
	for pod := range c.podIndex {
		selected = append(selected, pod)
	}
	c.mu.Unlock()

	c.commitMu.Lock()
	defer c.commitMu.Unlock()
	wanted := map[int]bool{}
	for _, ifindex := range c.programmed {
		wanted[ifindex] = true
	}
	for _, pod := range selected {
		if ifindex, err := c.cfg.Resolver.Resolve(pod); err == nil {
			wanted[ifindex] = true
		}
	}
	removed := 0
	for _, ifindex := range c.cfg.Dataplane.Pods() {
		if wanted[ifindex] {
			continue
		}
		if _, err := c.cfg.Dataplane.Remove(ifindex); err != nil {
			c.stats.commitFailures.Add(1)
			c.log.Warn("remove leftover pod state", "ifindex", ifindex, "err", err)
			continue
		}
		c.stats.removes.Add(1)
		removed++
	}
	c.log.Info("initial sync done", "leftoverPodsRemoved", removed)
}

type outcome uint8

const (
	outcomeDone   outcome = iota // synced (or nothing to do): forget the key's backoff
	outcomeRetry                 // retry with backoff: a commit failed, an interface is missing
	outcomeGiveUp                // cannot heal (invalid input): wait for the next write
)

// objectVersion is what a sync needs of the object version it read from the lister.
type objectVersion struct {
	uid             types.UID
	resourceVersion string
	trigger         time.Time // zero when the annotation is missing or invalid
	traceParent     string
	policyRef       string
}

// sync brings the dataplane in line with the lister's version of one object.
func (c *Controller) sync(key objectKey, workerStart time.Time) outcome {
	obj, exists, err := c.informers[key.kind].GetIndexer().GetByKey(key.storeKey())
	if err != nil {
		c.log.Error("read informer cache", "object", key.String(), "err", err)
		return outcomeRetry
	}
	if !exists {
		return c.syncDeleted(key)
	}
	computeStart := time.Now()
	var compiled *compiledObject
	var v objectVersion
	switch o := obj.(type) {
	case *v1alpha1.PolicyEndpoint:
		v = c.versionOf(o, o.Spec.PolicyRef.Name)
		compiled, err = compilePolicyEndpoint(o, c.cfg.NodeIP)
	case *v1alpha1.ClusterPolicyEndpoint:
		v = c.versionOf(o, o.Spec.PolicyRef.Name)
		compiled, err = compileClusterPolicyEndpoint(o, c.cfg.NodeIP)
	default:
		c.log.Error("unexpected object in informer cache", "object", key.String(), "type", fmt.Sprintf("%T", obj))
		return outcomeGiveUp
	}
	log := c.log.With("kind", key.kind.String(), "namespace", key.namespace, "name", key.name, "uid", v.uid, "resourceVersion", v.resourceVersion)

	c.mu.Lock()
	st := c.stateFor(key, v.uid)
	if err != nil {
		// Not programmed: the last valid version (if any) stays in force for its pods,
		// and the triggers stay pending until a later version is committed. A retry
		// cannot heal bad input; the next write of the object brings a new sync.
		first := st.rejectedRV != v.resourceVersion
		st.rejectedRV = v.resourceVersion
		c.mu.Unlock()
		if first {
			var fe *FieldError
			field := "spec"
			if errors.As(err, &fe) {
				field = fe.Field
			}
			c.stats.invalid(key.kind, field)
			log.Error("policy object rejected, not programmed", "err", err)
		}
		return c.commitDirty(key, st)
	}
	st.rejectedRV = ""
	var oldPods []netip.Addr
	if st.compiled != nil {
		oldPods = st.compiled.pods
	}
	c.index(st, compiled)
	affected := union(st.dirty, oldPods, compiled.pods)
	if len(affected) == 0 {
		c.mu.Unlock()
		// Nothing of this object is (or was) on this node: nothing to commit, and no
		// latency to report — a near-zero one would drag the percentiles down.
		c.cfg.Seen.NoLocalWork(string(v.uid), v.trigger)
		c.stats.noLocalWork.Add(1)
		return outcomeDone
	}
	st.dirty = affected
	c.mu.Unlock()

	res := c.commitPods(affected)
	return c.finish(key, st, v, log, res, workerStart, computeStart)
}

// commitDirty re-commits the pods a previous object under the key left behind (it was
// deleted and recreated, and the new version is invalid), without reporting anything.
func (c *Controller) commitDirty(key objectKey, st *objectState) outcome {
	c.mu.Lock()
	dirty := st.dirty
	c.mu.Unlock()
	if len(dirty) == 0 {
		return outcomeGiveUp
	}
	res := c.commitPods(dirty)
	c.mu.Lock()
	st.dirty = res.notDone
	c.mu.Unlock()
	if res.calls > 0 {
		c.sink.Committed(key.kind, res.attemptWith(res.err))
	}
	if len(res.notDone) > 0 && !errors.Is(res.err, bpfmaps.ErrInvalidPolicy) {
		return outcomeRetry
	}
	return outcomeGiveUp
}

// syncDeleted re-commits the pods a deleted object selected, without it.
func (c *Controller) syncDeleted(key objectKey) outcome {
	c.mu.Lock()
	st := c.objects[key]
	if st == nil {
		c.mu.Unlock()
		return outcomeDone
	}
	var pods []netip.Addr
	if st.compiled != nil {
		pods = st.compiled.pods
	}
	c.index(st, nil)
	st.dirty = union(st.dirty, pods)
	affected := st.dirty
	c.mu.Unlock()

	res := c.commitPods(affected)
	if res.err != nil || len(res.notDone) > 0 {
		c.mu.Lock()
		st.dirty = res.notDone
		c.mu.Unlock()
		if res.err != nil {
			c.sink.Committed(key.kind, res.attemptWith(res.err))
			c.log.Error("commit after delete failed", "kind", key.kind.String(), "namespace", key.namespace, "name", key.name, "uid", st.uid, "err", res.err)
			if errors.Is(res.err, bpfmaps.ErrInvalidPolicy) {
				return outcomeGiveUp
			}
		}
		return outcomeRetry
	}
	if res.calls > 0 {
		c.sink.Committed(key.kind, res.attemptWith(nil))
	}
	c.mu.Lock()
	if c.objects[key] == st {
		delete(c.objects, key)
	}
	c.mu.Unlock()
	// The delete handler forgot the uid already; again here in case a commit raced it.
	c.cfg.Seen.Forget(string(st.uid))
	return outcomeDone
}

// finish turns a commit's outcome into seen-set calls, telemetry and a queue outcome.
func (c *Controller) finish(key objectKey, st *objectState, v objectVersion, log *slog.Logger, res commitResult, workerStart, computeStart time.Time) outcome {
	kind := key.kind
	uid := string(v.uid)
	if res.err != nil {
		c.mu.Lock()
		st.dirty = res.notDone
		c.mu.Unlock()
		failed := res.attemptWith(res.err)
		c.cfg.Seen.Failed(uid, *failed)
		c.sink.Committed(kind, failed)
		log.Error("commit failed", "pods", len(res.notDone), "err", res.err)
		if errors.Is(res.err, bpfmaps.ErrInvalidPolicy) {
			// The merged policy is one the dataplane can never take (too many port
			// rules for a prefix, say); retrying the same input cannot help.
			c.stats.invalid(kind, "spec")
			return outcomeGiveUp
		}
		return outcomeRetry
	}
	if res.calls > 0 {
		c.sink.Committed(kind, res.attemptWith(nil))
	}
	if len(res.notDone) > 0 {
		// A local pod's interface is not there yet (or could not be resolved). That is
		// not a failed commit — nothing was written for the pod — so seen.Failed is not
		// called and no attempt is recorded; the trigger stays pending and the key is
		// retried with backoff. When the pod appears and is committed, the trigger is
		// reported with a latency that includes the wait: the policy was not in force
		// on this node before.
		c.mu.Lock()
		st.dirty = res.notDone
		first := st.waitingRV != v.resourceVersion
		st.waitingRV = v.resourceVersion
		c.mu.Unlock()
		c.stats.interfaceWaits.Add(1)
		if first {
			log.Info("waiting for pod interfaces", "pods", fmt.Sprint(res.notDone), "err", res.resolveErr)
		}
		return outcomeRetry
	}

	if res.pods == 0 {
		// Every affected pod had neither a policy nor committed state (pods the
		// object left before their interface ever appeared): nothing of this node's
		// dataplane was touched, so there is no latency to report.
		c.mu.Lock()
		st.dirty, st.waitingRV = nil, ""
		c.mu.Unlock()
		c.cfg.Seen.NoLocalWork(uid, v.trigger)
		c.stats.noLocalWork.Add(1)
		return outcomeDone
	}
	c.mu.Lock()
	st.dirty = nil
	st.waitingRV = ""
	c.mu.Unlock()

	reports, err := c.cfg.Seen.Committed(uid, v.trigger, res.attempt)
	if err != nil {
		log.Warn("seen-set state not persisted: these reports may repeat after a restart", "err", err)
	}
	for _, r := range reports {
		rec := &report.Record{
			Kind:            kind,
			Namespace:       key.namespace,
			Name:            key.name,
			UID:             uid,
			PolicyRef:       v.policyRef,
			ResourceVersion: v.resourceVersion,
			Trigger:         r.Trigger,
			Received:        r.ReceivedAt,
			WorkerStart:     workerStart,
			ComputeStart:    computeStart,
			ComputeEnd:      res.computeEnd,
			Attempts:        r.Attempts,
			Pods:            res.pods,
			Entries:         res.entries,
			TraceParent:     v.traceParent,
		}
		if r.Ahead {
			// An earlier commit already held this version (the lister ran ahead of the
			// event): that commit ends the latency, and this sync's timings are not it.
			rec.WorkerStart, rec.ComputeStart, rec.ComputeEnd = time.Time{}, time.Time{}, time.Time{}
		}
		c.sink.Report(rec)
	}
	c.stats.reports.Add(uint64(len(reports)))
	// A delete handler that ran between our lister read and Committed forgot the uid
	// before Committed recreated an entry for it; forget it again.
	if _, exists, _ := c.informers[key.kind].GetIndexer().GetByKey(key.storeKey()); !exists {
		c.cfg.Seen.Forget(uid)
	}
	return outcomeDone
}

func (c *Controller) versionOf(m metav1.Object, policyRef string) objectVersion {
	v := objectVersion{uid: m.GetUID(), resourceVersion: m.GetResourceVersion(), policyRef: policyRef}
	ann := m.GetAnnotations()
	if t, err := seen.ParseTrigger(ann[c.cfg.TriggerAnnotation]); err == nil {
		v.trigger = t
	}
	v.traceParent = ann[c.cfg.TraceParentAnnotation]
	return v
}

// stateFor returns the key's state, starting over when the uid changed (the object was
// deleted and recreated under the same name: the old object's pods must be
// re-committed without it, and its seen-set entry dropped). Called with mu held.
func (c *Controller) stateFor(key objectKey, uid types.UID) *objectState {
	st := c.objects[key]
	if st != nil && st.uid == uid {
		return st
	}
	next := &objectState{uid: uid}
	if st != nil {
		if st.compiled != nil {
			next.dirty = union(st.dirty, st.compiled.pods)
		} else {
			next.dirty = st.dirty
		}
		c.index(st, nil)
		c.cfg.Seen.Forget(string(st.uid))
	}
	c.objects[key] = next
	return next
}

// index makes compiled the state's version and updates podIndex. Called with mu held.
func (c *Controller) index(st *objectState, compiled *compiledObject) {
	if st.compiled != nil {
		for _, pod := range st.compiled.pods {
			keys := c.podIndex[pod]
			delete(keys, st.compiled.key)
			if len(keys) == 0 {
				delete(c.podIndex, pod)
			}
		}
	}
	st.compiled = compiled
	if compiled == nil {
		return
	}
	for _, pod := range compiled.pods {
		keys := c.podIndex[pod]
		if keys == nil {
			keys = map[objectKey]struct{}{}
			c.podIndex[pod] = keys
		}
		keys[compiled.key] = struct{}{}
	}
}

// commitResult is what one commit phase did.
type commitResult struct {
	computeEnd time.Time
	attempt    report.Attempt // spans every dataplane call; Err unset (see attemptWith)
	calls      int            // dataplane Commit/Remove calls made
	pods       int            // pods committed or removed
	entries    int            // map entries written
	notDone    []netip.Addr   // pods still to commit (interface missing, or failed)
	resolveErr error          // first resolver error
	err        error          // first dataplane error
}

// attemptWith returns the attempt with err's message, "" for nil.
func (r *commitResult) attemptWith(err error) *report.Attempt {
	a := r.attempt
	if err != nil {
		a.Err = err.Error()
	}
	return &a
}

// commitPods merges and commits the policy of each pod: every object that selects it
// now. A pod no object selects any more is removed from the dataplane.
func (c *Controller) commitPods(pods []netip.Addr) commitResult {
	c.commitMu.Lock()
	defer c.commitMu.Unlock()

	policies := make([]*bpfmaps.PodPolicy, len(pods))
	c.mu.Lock()
	objs := make([]*compiledObject, 0, 4)
	for i, pod := range pods {
		objs = objs[:0]
		for k := range c.podIndex[pod] {
			if st := c.objects[k]; st != nil && st.compiled != nil {
				objs = append(objs, st.compiled)
			}
		}
		if len(objs) > 0 {
			p := mergePodPolicy(objs)
			policies[i] = &p
		}
	}
	c.mu.Unlock()

	var res commitResult
	res.computeEnd = time.Now()
	res.attempt.Start = res.computeEnd
	dp := c.cfg.Dataplane
	for i, pod := range pods {
		if policies[i] == nil {
			ifindex, ok := c.programmed[pod]
			if !ok {
				continue // never committed here: nothing to remove
			}
			res.calls++
			if _, err := dp.Remove(ifindex); err != nil {
				c.stats.commitFailures.Add(1)
				res.err = cmpErr(res.err, fmt.Errorf("remove pod %s (ifindex %d): %w", pod, ifindex, err))
				res.notDone = append(res.notDone, pod)
				continue
			}
			delete(c.programmed, pod)
			c.stats.removes.Add(1)
			res.pods++
			continue
		}
		ifindex, err := c.cfg.Resolver.Resolve(pod)
		if err != nil {
			if res.resolveErr == nil {
				res.resolveErr = err
			}
			res.notDone = append(res.notDone, pod)
			continue
		}
		if old, ok := c.programmed[pod]; ok && old != ifindex {
			// The pod's interface changed (pod recreated with the same IP): the old
			// interface's state is stale.
			res.calls++
			if _, err := dp.Remove(old); err != nil {
				c.log.Warn("remove stale pod state", "pod", pod, "ifindex", old, "err", err)
			}
			delete(c.programmed, pod)
		}
		res.calls++
		cr, err := dp.Commit(ifindex, *policies[i])
		if err != nil {
			c.stats.commitFailures.Add(1)
			res.err = cmpErr(res.err, fmt.Errorf("commit pod %s (ifindex %d): %w", pod, ifindex, err))
			res.notDone = append(res.notDone, pod)
			continue
		}
		c.programmed[pod] = ifindex
		c.stats.commits.Add(1)
		if cr.Skipped {
			c.stats.commitsSkipped.Add(1)
		}
		c.stats.entriesWritten.Add(uint64(cr.EntriesWritten))
		res.entries += cr.EntriesWritten
		res.pods++
	}
	res.attempt.End = time.Now()
	return res
}

// cmpErr keeps the first error.
func cmpErr(first, next error) error {
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
