package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/explain"
	"github.com/npagent/npagent/internal/kubewatch"
	"github.com/npagent/npagent/internal/podif"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/seen"
	"github.com/npagent/npagent/internal/translate"
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
	// Compile changes how objects compile (what to do with domainName rules). Default:
	// the zero translate.Options, strict.
	Compile translate.Options
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
	// WatchStallTimeout is how long an informer's watch may be down before it
	// counts as stalled (WatchProblem, Counts); an open watch counts as stalled
	// when silent (no event, no bookmark, not reopened) for its own timeout plus
	// this (see kubewatch.Health.Snapshot). Default 1m.
	WatchStallTimeout time.Duration
	// LastValidDir holds the last valid version of each object with work on this
	// node, so that after a restart an object whose current version is invalid keeps
	// its last valid version in force (see lastvalid.go). Default "": not kept.
	LastValidDir string
	// EnforcingMode is what a local pod gets before a policy selects it: standard
	// (open) or strict (denied, node traffic excepted; needs NodeName, and RBAC to
	// list and watch pods). Default EnforcingStandard.
	EnforcingMode EnforcingMode
	// NamespaceEntryShare is the fraction of each trie (direction and family) the
	// local pods of one namespace may hold with their namespaced rules: a
	// PolicyEndpoint version that would take its namespace over it is rejected as bad
	// input (see share.go). Default 0: not enforced, as is 1 or more (the agent's
	// --namespace-entry-share defaults to DefaultNamespaceEntryShare). Counted by the
	// Dataplane's Entries (bpfmaps.EntryCounter).
	NamespaceEntryShare float64
	// PodStatus writes the podcond.Type condition on this node's pods (see
	// podstatus.go; needs NodeName, and RBAC to list and watch pods and patch
	// pods/status). Default false: the loop reads and writes no pods (in standard
	// mode).
	PodStatus bool
	// PodStatusQPS bounds the pods/status patches per second (burst: twice it, at
	// least 1). Default 5.
	PodStatusQPS float64
	// PodSeen is the consume-once seen-set of new pods' enforcement windows, keyed
	// by pod uid (see podlatency.go); with PodStatus, each pod's window is handed
	// to the Sink once if it implements report.PodSink. Default nil: not measured.
	// Not Seen: that one's uids are the objects', pruned against their caches.
	PodSeen *seen.Set
	// EndpointsConfig, when set, is the rest.Config the PolicyEndpoint and
	// ClusterPolicyEndpoint informers use instead of New's (a relay tier:
	// internal/relay.ClientConfig); pods are still read through New's. Default nil.
	EndpointsConfig *rest.Config
}

// Controller is the reconcile loop. Build it with New, start it with Run.
type Controller struct {
	cfg           Config
	log           *slog.Logger
	informers     [report.NumKinds]cache.SharedIndexInformer
	registrations [report.NumKinds]cache.ResourceEventHandlerRegistration
	queue         workqueue.TypedRateLimitingInterface[translate.Key] // local keys first (priority.go)
	local         *localKeys
	// ready holds the initial list's local objects until each was programmed, for
	// /readyz (see readiness.go).
	ready   localReady
	started atomic.Bool

	// relists tells a relist's re-deliveries apart (see relistObserver).
	relists [report.NumKinds]relistTracker
	// watch is each informer's list-and-watch health (see watchhealth.go).
	watch [report.NumKinds]kubewatch.Health

	// versions holds each object version's parsed annotations, recorded at event
	// time and checked out by the worker (see versions.go).
	versions versionTable
	// deleted holds the uids delete events removed, until the worker forgets them
	// in the seen-set (see sync.go).
	deleted deletedUIDs

	// podWatch is the watch of this node's pods, in strict mode or with PodStatus
	// (nil otherwise; see pods.go). One informer serves both.
	podWatch *podWatch
	// namespaces are the cluster's namespaces' labels, with the pod condition: a
	// ClusterPolicyEndpoint's subject selects pods by them (namespaces.go).
	namespaces *namespaceWatch
	// podStatus writes the pod condition (nil without PodStatus; see podstatus.go).
	podStatus *podStatus

	// pods is which objects select which local pods, and what the dataplane holds
	// for each: merge and commit happen behind its one lock (see podtable.go).
	pods *podTable

	// initial tracks the keys of the initial list until each was synced once; then
	// the dataplane's leftovers are collected (see gc.go).
	initial initialSync

	// lastValid keeps each object's last valid version across restarts.
	lastValid *lastValidStore

	// stubs decides which PolicyEndpoints the informer keeps in full, and fetches
	// those needed again (see stubs.go) through rc.
	stubs *stubIndex
	rc    rest.Interface
	// cold programs this node's pods from the initial list as it arrives, before the
	// caches sync (see coldstart.go).
	cold *coldStart

	stats counters
	// explain is each object's recent versions and reports, for ExplainObject
	// (see explain.go).
	explain explain.History
	// recentFlows is each pod's last denials, for ExplainPod (a sink of StartFlows).
	recentFlows explain.RecentFlows
	// progress is when keys were taken, syncs finished and events arrived, for a
	// liveness check (see progress.go).
	progress progress
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
	if cfg.WatchStallTimeout <= 0 {
		cfg.WatchStallTimeout = time.Minute
	}
	mode, err := ParseEnforcingMode(string(cfg.EnforcingMode))
	if err != nil {
		return nil, fmt.Errorf("reconcile: config: %w", err)
	}
	cfg.EnforcingMode = mode
	if mode == EnforcingStrict && cfg.NodeName == "" {
		return nil, errors.New("reconcile: config: strict enforcing mode needs NodeName (its pods are watched by spec.nodeName)")
	}
	if cfg.PodStatus && cfg.NodeName == "" {
		return nil, errors.New("reconcile: config: PodStatus needs NodeName (its pods are watched by spec.nodeName)")
	}
	if cfg.PodStatusQPS <= 0 {
		cfg.PodStatusQPS = 5
	}
	c := &Controller{
		cfg:   cfg,
		log:   cfg.Logger.With("node", cfg.NodeName),
		local: &localKeys{},
	}
	c.queue = newLocalFirstQueue(c.local,
		workqueue.NewTypedItemExponentialFailureRateLimiter[translate.Key](5*time.Millisecond, cfg.MaxRetryDelay))
	c.progress.init(cfg.Workers)
	if c.lastValid, err = newLastValidStore(cfg.LastValidDir); err != nil {
		return nil, fmt.Errorf("reconcile: %w", err)
	}
	var strict *localPodSet
	if mode == EnforcingStrict || cfg.PodStatus {
		set := newLocalPodSet()
		if mode == EnforcingStrict {
			strict = set
		}
		if c.podWatch, err = newPodWatch(restConfig, &c.cfg, set, mode == EnforcingStrict); err != nil {
			return nil, fmt.Errorf("reconcile: %w", err)
		}
	}
	c.pods = newPodTable(cfg.Dataplane, cfg.Resolver, &c.stats, c.log, strict, cfg.NamespaceEntryShare)
	c.versions.init(cfg.TriggerAnnotation, cfg.TraceParentAnnotation, cfg.NodeIP)
	c.versions.history, c.cfg.Sink = &c.explain, c.explain.Sink(cfg.Sink)

	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("reconcile: scheme: %w", err)
	}
	endpointsConfig := restConfig
	if cfg.EndpointsConfig != nil {
		endpointsConfig = cfg.EndpointsConfig
	}
	rc, err := kubewatch.NewRESTClient(endpointsConfig, scheme, v1alpha1.SchemeGroupVersion)
	if err != nil {
		return nil, err
	}
	c.rc = rc
	c.cold = newColdStart(cfg.NodeIP)
	c.stubs = newStubIndex(cfg.NodeIP, []string{cfg.TriggerAnnotation, TracingTraceParentAnnotation, cfg.TraceParentAnnotation}, cfg.PodStatus)
	kinds := [report.NumKinds]struct {
		resource string
		example  runtime.Object
	}{
		report.KindPolicyEndpoint:        {v1alpha1.ResourcePolicyEndpoints, &v1alpha1.PolicyEndpoint{}},
		report.KindClusterPolicyEndpoint: {v1alpha1.ResourceClusterPolicyEndpoints, &v1alpha1.ClusterPolicyEndpoint{}},
	}
	for kind := range report.Kind(report.NumKinds) {
		lw := kubewatch.NewListWatch(rc, scheme, kinds[kind].resource, kinds[kind].example.DeepCopyObject,
			relistObserver{c, kind}, &c.watch[kind], c.log.With("kind", kind.String()))
		opts := cache.SharedIndexInformerOptions{ResyncPeriod: cfg.ResyncPeriod, ObjectDescription: kind.String()}
		if cfg.PodStatus && kind == report.KindPolicyEndpoint {
			// The pod condition looks up a pod's PolicyEndpoints by namespace.
			opts.Indexers = cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}
		}
		inf := cache.NewSharedIndexInformerWithOptions(lw, kinds[kind].example, opts)
		if err := inf.SetWatchErrorHandlerWithContext(kubewatch.NewErrorHandler(c.log, kinds[kind].resource, nil).Handle); err != nil {
			return nil, fmt.Errorf("reconcile: %s informer: %w", kind, err)
		}
		c.informers[kind] = inf
		tf := transform
		if kind == report.KindPolicyEndpoint {
			tf = c.stubs.transform
		}
		if err := inf.SetTransform(tf); err != nil {
			return nil, fmt.Errorf("reconcile: %s informer: %w", kind, err)
		}
		reg, err := inf.AddEventHandler(c.handler(kind))
		if err != nil {
			return nil, fmt.Errorf("reconcile: %s informer: %w", kind, err)
		}
		c.registrations[kind] = reg
	}
	if cfg.PodStatus {
		if c.podStatus, err = c.newPodStatus(restConfig, cfg.Sink); err != nil {
			return nil, fmt.Errorf("reconcile: %w", err)
		}
		if c.namespaces, err = newNamespaceWatch(restConfig, c.namespaceRelabeled, c.log); err != nil {
			return nil, fmt.Errorf("reconcile: %w", err)
		}
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
	if c.cfg.PodSeen != nil {
		defer c.persistPodSeen() // after every worker stopped (wg.Wait runs first)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer c.queue.ShutDown() // runs before wg.Wait: wakes workers blocked in Get
	for _, inf := range c.informers {
		wg.Go(func() { inf.RunWithContext(ctx) })
	}
	if c.podWatch != nil {
		defer c.podWatch.queue.ShutDown()
		wg.Go(func() { c.podWatch.informer.RunWithContext(ctx) })
	}
	if c.namespaces != nil {
		wg.Go(func() { c.namespaces.informer.RunWithContext(ctx) })
	}
	if c.podStatus != nil {
		defer c.podStatus.queue.ShutDown()
		c.startStatusWorker(ctx, &wg)
	}
	c.log.Info("waiting for informer caches", "nodeIP", c.cfg.NodeIP, "enforcingMode", c.cfg.EnforcingMode)
	// Until they sync, the cold start programs this node's pods from the initial list
	// as it arrives, once the ClusterPolicyEndpoints (and this node's pods, when
	// watched) are in.
	cacheSynced, coldDone := make(chan struct{}), make(chan struct{})
	gate := []cache.InformerSynced{c.registrations[report.KindClusterPolicyEndpoint].HasSynced}
	if c.podWatch != nil {
		gate = append(gate, c.podWatch.reg.HasSynced)
	}
	if c.podStatus != nil {
		gate = append(gate, c.podStatus.reg.HasSynced)
	}
	go func() { c.runColdStart(cacheSynced, gate...); close(coldDone) }()
	synced := cache.WaitForCacheSync(ctx.Done(), c.HasSynced)
	close(cacheSynced)
	<-coldDone // no early commit runs beside the workers
	if !synced {
		return fmt.Errorf("reconcile: informer caches did not sync: %w", context.Cause(ctx))
	}
	c.log.Info("cold start done", "batches", c.cold.batches.Load(), "podsCommitted", c.cold.commits.Load())
	// The caches hold every object as of now: from here the seen-set's persisted
	// watermark may follow the events observed (never before: a restart would
	// take objects not yet listed as resolved).
	c.cfg.Seen.MarkSynced(time.Now())
	if c.cfg.PodSeen != nil {
		c.cfg.PodSeen.MarkSynced(time.Now())
	}
	c.versions.synced.Store(true)
	pruned := c.pruneSeen()
	if n := c.restoreLastValid(); n > 0 {
		c.log.Info("last valid versions restored", "objects", n)
	}
	c.log.Info("informer caches synced", "objects", len(c.informers[report.KindPolicyEndpoint].GetStore().ListKeys())+len(c.informers[report.KindClusterPolicyEndpoint].GetStore().ListKeys()),
		"seenPruned", pruned, "workers", c.cfg.Workers)
	var keys []translate.Key
	for kind, inf := range c.informers {
		for _, k := range inf.GetStore().ListKeys() {
			ns, name, _ := cache.SplitMetaNamespaceKey(k)
			keys = append(keys, translate.Key{Kind: report.Kind(kind), Namespace: ns, Name: name})
		}
	}
	c.initial.begin(keys)
	c.ready.begin(keys, c.local.has)
	c.initialSynced(translate.Key{})
	c.progress.started(time.Now())
	if c.podWatch != nil && c.podWatch.strict {
		c.startPodWorker(ctx, &wg)
	}
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

// HasSynced reports whether the informer caches (both kinds, and this node's pods in
// strict mode) have synced and their initial objects have reached the event handlers
// (for /readyz).
func (c *Controller) HasSynced() bool {
	for _, r := range c.registrations {
		if r == nil || !r.HasSynced() {
			return false
		}
	}
	if c.podStatus != nil && !c.podStatus.reg.HasSynced() {
		return false
	}
	if c.namespaces != nil && !c.namespaces.reg.HasSynced() {
		return false
	}
	return c.podWatch == nil || c.podWatch.reg.HasSynced()
}

// processNext syncs one key. It returns false when the loop stops.
func (c *Controller) processNext(ctx context.Context) bool {
	key, shutdown := c.queue.Get()
	if shutdown {
		return false
	}
	defer c.progress.done(c.progress.take(time.Now())) // a slot held until the key is done
	defer c.queue.Done(key)
	if ctx.Err() != nil {
		return false // stop taking work; what is queued is re-listed at the next start
	}
	c.stats.syncs.Add(1)
	switch c.sync(key, time.Now()) {
	case outcomeDone, outcomeGiveUp:
		c.queue.Forget(key)
		c.ready.programmed(key)
	case outcomeRetry:
		c.stats.deliveries[key.Kind][report.CauseRequeue].Add(1)
		c.queue.AddRateLimited(key)
	}
	c.initialSynced(key)
	return true
}
