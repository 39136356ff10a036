package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/kubewatch"
)

// Config is how a Relay reads the apiserver and serves its agents.
type Config struct {
	// WindowEvents is how many recent events of each resource are kept, so a watch
	// from a recent resourceVersion resumes; one from before them is 410 Gone (the
	// client lists again). Default 10000.
	WindowEvents int
	// BookmarkInterval is how often an idle watch that asked for bookmarks gets one.
	// Default 15s.
	BookmarkInterval time.Duration
	// ReviewTTL is how long a TokenReview (and the access reviews of its user) is
	// cached. Default 1m.
	ReviewTTL time.Duration
	// SyncWait is how long a list or watch waits for the relay to be synced (at start,
	// or relisting after the apiserver's 410) before it is answered 503. Default 30s.
	SyncWait time.Duration
	// Logger; default slog.Default().
	Logger *slog.Logger
}

// Relay watches PolicyEndpoints, ClusterPolicyEndpoints and Nodes once and serves
// each agent its node's view (see doc.go). Build it with New, run it with Run, serve
// Handler.
type Relay struct {
	cfg    Config
	log    *slog.Logger
	feeds  map[string]*feed // by resource
	pe     *feed
	nodes  *nodeAddrs
	auth   *reviewer
	lws    map[string]*cache.ListWatch
	nodeCS kubernetes.Interface
	health [2]kubewatch.Health

	nodesSynced atomic.Bool
	started     atomic.Bool
	stats       stats
}

// New builds a relay reading the apiserver rc reaches (it needs list and watch on
// policyendpoints, clusterpolicyendpoints and nodes, and create on tokenreviews and
// subjectaccessreviews). Nothing runs until Run.
func New(rc *rest.Config, cfg Config) (*Relay, error) {
	if cfg.WindowEvents <= 0 {
		cfg.WindowEvents = 10000
	}
	if cfg.BookmarkInterval <= 0 {
		cfg.BookmarkInterval = 15 * time.Second
	}
	if cfg.ReviewTTL <= 0 {
		cfg.ReviewTTL = time.Minute
	}
	if cfg.SyncWait <= 0 {
		cfg.SyncWait = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("relay: scheme: %w", err)
	}
	client, err := kubewatch.NewRESTClient(rc, scheme, v1alpha1.SchemeGroupVersion)
	if err != nil {
		return nil, fmt.Errorf("relay: %w", err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("relay: client: %w", err)
	}
	r := &Relay{cfg: cfg, log: cfg.Logger, feeds: map[string]*feed{}, lws: map[string]*cache.ListWatch{},
		nodes: newNodeAddrs(), nodeCS: cs, auth: newReviewer(cs, cfg.ReviewTTL)}
	gv := v1alpha1.SchemeGroupVersion
	for i, k := range []struct {
		resource string
		example  runtime.Object
		kind     string
		grouped  bool
	}{
		{v1alpha1.ResourcePolicyEndpoints, &v1alpha1.PolicyEndpoint{}, "PolicyEndpoint", true},
		{v1alpha1.ResourceClusterPolicyEndpoints, &v1alpha1.ClusterPolicyEndpoint{}, "ClusterPolicyEndpoint", false},
	} {
		f := newFeed(k.resource, gv.WithKind(k.kind), k.grouped, cfg.WindowEvents)
		r.feeds[k.resource] = f
		r.lws[k.resource] = kubewatch.NewListWatch(client, scheme, k.resource, k.example.DeepCopyObject,
			resetObserver{f}, &r.health[i], r.log.With("resource", k.resource))
	}
	r.pe = r.feeds[v1alpha1.ResourcePolicyEndpoints]
	return r, nil
}

// resetObserver starts a feed's reset when its ListWatch lists (first, or again after
// a 410): what the list brings replaces what the window held.
type resetObserver struct{ f *feed }

func (o resetObserver) BeginList()               { o.f.beginReset(false) }
func (o resetObserver) Unchanged(runtime.Object) {}

// Ready reports whether the relay serves: both resources listed and the Nodes synced.
func (r *Relay) Ready() bool {
	if !r.nodesSynced.Load() {
		return false
	}
	for _, f := range r.feeds {
		f.mu.RLock()
		ok := f.synced
		f.mu.RUnlock()
		if !ok {
			return false
		}
	}
	return true
}

// Run reads the apiserver until ctx ends.
func (r *Relay) Run(ctx context.Context) error {
	if !r.started.CompareAndSwap(false, true) {
		return errors.New("relay: Run called twice")
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	for res, f := range r.feeds {
		lw := r.lws[res]
		wg.Go(func() { r.runFeed(ctx, f, lw) })
	}
	fac := informers.NewSharedInformerFactory(r.nodeCS, 0)
	inf := fac.Core().V1().Nodes().Informer()
	if err := inf.SetWatchErrorHandlerWithContext(kubewatch.NewErrorHandler(r.log, "nodes", nil).Handle); err != nil {
		return fmt.Errorf("relay: node informer: %w", err)
	}
	set := func(obj any) {
		if n, ok := obj.(*corev1.Node); ok {
			r.pe.mu.RLock()
			at := r.pe.rv
			r.pe.mu.RUnlock()
			r.nodes.set(n, at)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    set,
		UpdateFunc: func(_, obj any) { set(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if n, ok := obj.(*corev1.Node); ok {
				r.nodes.remove(n.Name)
			}
		},
	}); err != nil {
		return fmt.Errorf("relay: node informer: %w", err)
	}
	wg.Go(func() { inf.RunWithContext(ctx) })
	if cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		r.nodesSynced.Store(true)
	}
	<-ctx.Done()
	return nil
}

// runFeed lists and watches one resource into f until ctx ends. The ListWatch
// retries while the apiserver is away and relists in place after a 410 (each a
// reset of f); a watch it ends (the apiserver refusing) is started again with a
// list.
func (r *Relay) runFeed(ctx context.Context, f *feed, lw *cache.ListWatch) {
	log := r.log.With("resource", f.resource)
	for ctx.Err() == nil {
		rv, err := r.list(ctx, f, lw)
		if err != nil {
			if ctx.Err() == nil {
				log.Error("list failed: trying again", "err", err)
				sleep(ctx, time.Second)
			}
			continue
		}
		log.Info("listed", "resourceVersion", rv)
		w, err := lw.WatchWithContext(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
		if err != nil {
			if ctx.Err() == nil {
				log.Error("watch failed: listing again", "err", err)
				sleep(ctx, time.Second)
			}
			continue
		}
		for ev := range w.ResultChan() {
			if ev.Type == watch.Error {
				log.Error("watch ended: listing again", "status", ev.Object)
				break
			}
			if err := f.ingest(ev.Type, ev.Object); err != nil {
				log.Error("event dropped", "err", err)
			}
		}
		w.Stop()
	}
}

// list lists resource into f (a reset) and returns the list's resourceVersion.
func (r *Relay) list(ctx context.Context, f *feed, lw *cache.ListWatch) (string, error) {
	obj, err := lw.ListWithContext(ctx, metav1.ListOptions{ResourceVersion: ""})
	if err != nil {
		return "", err
	}
	items, err := meta.ExtractList(obj)
	if err != nil {
		return "", err
	}
	lm, err := meta.ListAccessor(obj)
	if err != nil {
		return "", err
	}
	f.beginReset(true) // the ListWatch began one; the store is replaced by the list
	for _, it := range items {
		if err := f.ingest(watch.Added, it); err != nil {
			r.log.Error("object dropped", "resource", f.resource, "err", err)
		}
	}
	rv, err := parseRV(lm.GetResourceVersion())
	if err != nil {
		return "", err
	}
	f.endReset(rv)
	return lm.GetResourceVersion(), nil
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
