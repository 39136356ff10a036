package kubewatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/npagent/npagent/internal/report"
)

// NewRESTClient returns a REST client for the group version gv of scheme
// (networking.k8s.aws/v1alpha1 for the agent). No generated clientset exists for
// those types; list and watch are all the agent needs, and client-go's ListWatch
// builds both on a plain REST client.
func NewRESTClient(restConfig *rest.Config, scheme *runtime.Scheme, gv schema.GroupVersion) (*rest.RESTClient, error) {
	cfg := rest.CopyConfig(restConfig)
	cfg.GroupVersion = &gv
	cfg.APIPath = "/apis"
	cfg.ContentType = runtime.ContentTypeJSON // custom resources are served as JSON only
	cfg.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	if cfg.UserAgent == "" {
		cfg.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	rc, err := rest.RESTClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("reconcile: rest client: %w", err)
	}
	return rc, nil
}

// NewLister returns a list request for resource, whose types scheme holds, that
// decodes the answer in one pass.
// client-go's ListWatch decodes a list with the REST client's JSON serializer, which
// parses the whole body twice: once (encoding/json) only to find its apiVersion and
// kind, then again into the type they name — a fifth of a relist's CPU for 10,000
// objects, by profile (BENCHMARKS.md). Here the body is unmarshalled straight into
// the list type newObject's kind implies, with the serializer's JSON settings
// (case-sensitive, integers kept), and kept if its apiVersion and kind are that
// list's; anything else (an error, another kind) is decoded by the REST client as
// before. No conversion or defaulting is lost: the REST client's codec does neither
// for these types.
func NewLister(rc rest.Interface, scheme *runtime.Scheme, resource string, newObject func() runtime.Object) (cache.ListWithContextFunc, error) {
	kinds, _, err := scheme.ObjectKinds(newObject())
	if err != nil {
		return nil, fmt.Errorf("reconcile: list of %s: %w", resource, err)
	}
	listKind := schema.GroupVersionKind{Group: kinds[0].Group, Version: kinds[0].Version, Kind: kinds[0].Kind + "List"}
	if _, err := scheme.New(listKind); err != nil {
		return nil, fmt.Errorf("reconcile: list of %s: %w", resource, err)
	}
	return func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		result := rc.Get().Resource(resource).VersionedParams(&opts, metav1.ParameterCodec).Do(ctx)
		if body, err := result.Raw(); err == nil {
			list, _ := scheme.New(listKind)
			if utiljson.Unmarshal(body, list) == nil && list.GetObjectKind().GroupVersionKind() == listKind {
				list.GetObjectKind().SetGroupVersionKind(schema.GroupVersionKind{}) // as the REST client's decoder leaves it
				return list, nil
			}
		}
		return result.Get() // an error, or not that list: the REST client's decoding
	}, nil
}

// ListObserver is told how the lists a ListWatch makes relate to what it delivered
// before. Its calls come one at a time, before the reflector (and so the informer's
// transform and handlers) gets what the list brought: from the reflector's goroutine
// for its lists, and from the goroutine that feeds the reflector's watch for a relist
// after a 410 (the reflector waits on that watch meanwhile).
type ListObserver interface {
	// BeginList is called before every request that (re)lists: a List (its first
	// page), a watch that streams the initial state (sendInitialEvents, client-go's WatchList mode), and
	// the ListWatch's own list after a 410.
	BeginList()
	// Unchanged is called for each object a relist brings that is the version this
	// ListWatch delivered before (same uid and resourceVersion), once per relist. A
	// shared informer passes such an object on to no handler unless its resync is
	// due, so this is the only place a relist of unchanged objects can be seen.
	Unchanged(obj runtime.Object)
}

// ListProgress is an optional extension of ListObserver: Listed is called with each
// object a list brings (a List's pages, a WatchList stream's initial events, the
// pages of a relist after a 410) in the order the apiserver sent them, as each page or event arrives — before the reflector
// has the whole list (it hands the informer nothing until then). obj belongs to the
// reflector afterwards (its transform may change it): Listed keeps a copy of what it
// needs, not obj. ListEnded follows the list's last object (its last page, or the
// stream's initial-events bookmark): the list is complete, though the informer has
// not had it yet — with many objects, seconds before its cache syncs.
type ListProgress interface {
	Listed(obj runtime.Object)
	ListEnded()
}

// NewListWatch lists and watches one resource in all namespaces, telling observer of
// each list and of what a relist re-delivers unchanged (ListObserver). That is how the
// loop tells a relist's re-deliveries from new writes (internal/reconcile:
// relistObserver in events.go), without work in the informer's transform.
//
// It also keeps the informer delivering across apiserver restarts. client-go's
// reflector (v0.37) waits before each retry with one backoff per reflector: 0.8 s
// doubling to 30 s, jittered up to twice that, stepped on every failed watch request
// and every time its list-and-watch ends (a watch that ended with 410 Gone included),
// and reset only after two minutes. SharedIndexInformer does not expose the
// reflector's Backoff option, so after two or three restarts an informer waited
// 10-30 s after the apiserver was back. This ListWatch never hands the reflector an
// error the apiserver's return will cure:
//
//   - a list or watch request that fails while the apiserver is unreachable or not
//     ready (/readyz), or with a 5xx, is retried here, every 100 ms rising to 500 ms,
//     until it succeeds (errors are counted, not returned);
//   - a watch that ends (server timeout, apiserver shutdown) is reopened here from
//     the last resourceVersion it delivered, so the reflector's watch never ends
//     (after one that ended with an error or at once, 100 ms doubling to 500 ms
//     first: reopenDelay);
//   - a watch whose resourceVersion is gone (410) or not there yet is followed
//     here, after a random wait that grows with the objects delivered (relistJitter),
//     by a fresh list in pages of 500,
//     delivered page by page as events against what this ListWatch delivered
//     before (every listed object as added or modified, then the missing ones as
//     deleted: what the reflector's own relist delivers), then a bookmark at the
//     list's resourceVersion, and a watch from there.
//
// Errors the apiserver's readiness does not cure (403, 404, a bad request) go to the
// reflector as before, with its backoff. Everything it sees is recorded in health.
func NewListWatch(rc rest.Interface, scheme *runtime.Scheme, resource string, newObject func() runtime.Object, observer ListObserver, health *Health, log *slog.Logger) *cache.ListWatch {
	base := cache.NewListWatchFromClient(rc, resource, metav1.NamespaceAll, fields.Everything())
	if lister, err := NewLister(rc, scheme, resource, newObject); err == nil {
		base.ListWithContextFunc = lister
	} else { // a type missing from the scheme: client-go's list still works
		log.Error("lean list decoding unavailable", "err", err)
	}
	if watcher, err := NewWatcher(rc, scheme, resource, newObject); err == nil {
		base.WatchFuncWithContext = watcher
	} else { // the same: client-go's watch still works
		log.Error("lean watch decoding unavailable", "err", err)
	}
	l := &listWatch{
		base:      base,
		ready:     func(ctx context.Context) error { return rc.Get().AbsPath("/readyz").Do(ctx).Error() },
		newObject: newObject,
		observer:  observer,
		health:    health,
		log:       log,
	}
	return &cache.ListWatch{ListWithContextFunc: l.list, WatchFuncWithContext: l.watch}
}

// Retry delays of the requests this ListWatch retries itself: the recovery goal is
// an informer delivering again within 2 s of the apiserver being ready; 500 ms keeps
// the load of a node's two informers at four cheap requests a second while the
// apiserver is down.
const (
	retryInitial = 100 * time.Millisecond
	retryMax     = 500 * time.Millisecond
)

type listWatch struct {
	base      *cache.ListWatch
	ready     func(context.Context) error // nil when the apiserver's /readyz answers 200
	newObject func() runtime.Object
	observer  ListObserver
	health    *Health
	log       *slog.Logger

	mu        sync.Mutex
	lists     int                      // lists the reflector began (pages not counted)
	delivered map[string]deliveredItem // by namespace/name: what the reflector holds
	// listing collects what a list in progress (its pages, or a WatchList stream's
	// initial events) brings; it replaces delivered when the list is complete, as the
	// reflector replaces its store only then. nil when no list is in progress.
	listing map[string]deliveredItem
	passes  uint64 // passes over a relist's list so far (newPass)
}

// deliveredItem is an object as last delivered to the reflector.
type deliveredItem struct {
	uid types.UID
	rv  string
	obj runtime.Object
	// pass is the last pass over an in-place relist's list that listed it (newPass);
	// 0 if none did.
	pass uint64
}

// list is the reflector's List: retried until the apiserver answers it.
func (l *listWatch) list(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	if opts.Continue == "" {
		l.beginList() // once per list: its pages are one list
	}
	delay := retryInitial
	for {
		obj, err := l.base.ListWithContextFunc(ctx, opts)
		if err == nil {
			l.recovered("list", delay)
			l.health.event(time.Now())
			l.health.answered()
			if items, err := meta.ExtractList(obj); err == nil {
				last := true
				if lm, err := meta.ListAccessor(obj); err == nil {
					last = lm.GetContinue() == ""
				}
				l.listed(items, last)
			}
			return obj, nil
		}
		l.health.listErrors.Add(1)
		if !l.retry(ctx, "list", err, &delay) {
			return nil, err
		}
	}
}

// beginList starts a list the reflector asked for (a List's first page, or a WatchList
// stream): counted (every one after the first is the reflector's relist), collected
// apart from what was delivered until it completes, and told to the observer.
func (l *listWatch) beginList() {
	l.mu.Lock()
	if l.lists++; l.lists > 1 {
		l.health.relists[report.RelistRestart].Add(1)
	}
	l.listing = map[string]deliveredItem{}
	l.mu.Unlock()
	l.observer.BeginList()
}

// listed records a page of the list in progress, tells the observer which of its
// items are unchanged from what was delivered, and, on the last page, makes the list
// what was delivered.
func (l *listWatch) listed(items []runtime.Object, last bool) {
	var unchanged []runtime.Object
	l.mu.Lock()
	for _, obj := range items {
		if l.track(watch.Added, obj) {
			unchanged = append(unchanged, obj)
		}
	}
	if last {
		l.endList()
	}
	l.mu.Unlock()
	for _, obj := range unchanged {
		l.observer.Unchanged(obj)
	}
	if p, ok := l.observer.(ListProgress); ok {
		for _, obj := range items {
			p.Listed(obj)
		}
		if last {
			p.ListEnded()
		}
	}
}

// endList makes the list in progress what was delivered; l.mu held.
func (l *listWatch) endList() {
	if l.listing != nil {
		l.delivered, l.listing = l.listing, nil
	}
}

// track records one delivered event, into the list in progress if there is one, and
// reports whether it brings an object unchanged from what was delivered before (the
// same uid and resourceVersion under its name); l.mu held.
func (l *listWatch) track(t watch.EventType, obj runtime.Object) (unchanged bool) {
	m, err := meta.Accessor(obj)
	if err != nil {
		return false
	}
	key := m.GetNamespace() + "/" + m.GetName()
	into := l.listing
	if into == nil {
		if l.delivered == nil {
			l.delivered = map[string]deliveredItem{}
		}
		into = l.delivered
	}
	switch t {
	case watch.Added, watch.Modified:
		prev, ok := l.delivered[key]
		into[key] = deliveredItem{uid: m.GetUID(), rv: m.GetResourceVersion(), obj: obj}
		return ok && prev.uid == m.GetUID() && prev.rv == m.GetResourceVersion()
	case watch.Deleted:
		delete(into, key)
	}
	return false
}

// retry reports whether a failed request should be sent again, after waiting. It
// waits while the apiserver is unreachable or not ready; once it is ready, only
// network errors and 5xx answers are retried (a 429 goes to the reflector, whose
// backoff suits throttling). It returns false when ctx ends.
//
// The first failure of a sequence is logged only once the apiserver's readiness is
// known: a ready apiserver that refuses (RBAC withdrawn, say) is named as such and
// recorded in health (report.WatchHealth.Refused, /readyz), never announced as an
// outage to wait out.
func (l *listWatch) retry(ctx context.Context, request string, err error, delay *time.Duration) bool {
	first := *delay == retryInitial
	for {
		if !sleepCtx(ctx, *delay) {
			return false
		}
		*delay = min(2**delay, retryMax)
		if l.ready(ctx) == nil {
			if transient(err) {
				return true
			}
			l.health.refuse(err)
			l.log.Warn("apiserver is ready and refuses the request: client-go's reflector retries it with its backoff",
				"request", request, "err", err)
			return false
		}
		if first {
			l.log.Warn("apiserver request failed: retrying until the apiserver is back", "request", request, "err", err)
			first = false
		}
	}
}

// recovered logs a request that succeeded after retries (delay grew).
func (l *listWatch) recovered(request string, delay time.Duration) {
	if delay != retryInitial {
		l.log.Info("apiserver answered again", "request", request)
	}
}

// transient reports whether err is a network error or a 5xx answer.
func transient(err error) bool {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return status.Status().Code >= 500
	}
	return true
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// rvGone reports whether err says the resourceVersion asked for is not there: gone
// (410: compacted, or older than a restarted watch cache) or not yet there (the
// apiserver is behind it, e.g. etcd restored from a backup). Either way the cure is
// a fresh list, as the reflector does.
func rvGone(err error) bool {
	return apierrors.IsResourceExpired(err) || apierrors.IsGone(err) ||
		apierrors.HasStatusCause(err, metav1.CauseTypeResourceVersionTooLarge)
}

// watch is the reflector's Watch: the watch it returns is reopened here when it
// ends (see newListWatch); a stream of initial events (WatchList mode) is reopened
// only after its initial-events bookmark.
func (l *listWatch) watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	initial := opts.SendInitialEvents != nil && *opts.SendInitialEvents
	if initial {
		l.beginList()
	}
	ctx, cancel := context.WithCancel(ctx)
	w, err := l.open(ctx, opts)
	if err != nil && (initial || !rvGone(err)) {
		cancel()
		return nil, err // a WatchList stream at a gone resourceVersion: the reflector starts over at once
	}
	rw := &resilientWatch{l: l, ctx: ctx, cancel: cancel, out: make(chan watch.Event), opts: opts,
		pastInitial: !initial, rv: opts.ResourceVersion, done: make(chan struct{})}
	go rw.run(w)
	return rw, nil
}

// open sends a watch request, retried while the apiserver is not back (see retry).
func (l *listWatch) open(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	delay := retryInitial
	for {
		w, err := l.base.WatchFuncWithContext(ctx, opts)
		if err == nil {
			l.recovered("watch", delay)
			var timeout time.Duration
			if opts.TimeoutSeconds != nil {
				timeout = time.Duration(*opts.TimeoutSeconds) * time.Second
			}
			l.health.opened(time.Now(), timeout)
			return w, nil
		}
		if rvGone(err) {
			return nil, err
		}
		l.health.watchErrors.Add(1)
		if !l.retry(ctx, "watch", err, &delay) {
			return nil, err
		}
	}
}

// resilientWatch is the watch the reflector holds: it forwards events from a
// sequence of apiserver watches (see newListWatch) until Stop.
type resilientWatch struct {
	l           *listWatch
	ctx         context.Context
	cancel      context.CancelFunc
	out         chan watch.Event
	done        chan struct{}
	opts        metav1.ListOptions
	pastInitial bool   // past the initial events of a WatchList stream (or none asked)
	rv          string // resourceVersion to resume from
}

var _ watch.Interface = (*resilientWatch)(nil)

func (rw *resilientWatch) ResultChan() <-chan watch.Event { return rw.out }

// Stop ends the watch and waits for its goroutine.
func (rw *resilientWatch) Stop() {
	rw.cancel()
	<-rw.done
}

// run forwards the events of w and of the watches after it. w is nil when the
// resourceVersion asked for is gone already.
func (rw *resilientWatch) run(w watch.Interface) {
	defer close(rw.done)
	defer close(rw.out)
	gone := w == nil
	var delay time.Duration
	for {
		if w != nil {
			started := time.Now()
			var err error
			var events int
			gone, events, err = rw.pump(w)
			w.Stop()
			rw.l.health.ended(time.Now())
			if rw.ctx.Err() != nil {
				return
			}
			if !rw.pastInitial {
				// The initial state was not complete: hand the end to the reflector,
				// which streams it again (WatchList) or lists.
				if err != nil {
					rw.send(watch.Event{Type: watch.Error, Object: errStatusObject(err)})
				}
				return
			}
			if !gone {
				delay = reopenDelay(delay, err, events, time.Since(started))
				if delay > 0 && !sleepCtx(rw.ctx, delay) {
					return
				}
			}
		}
		if gone {
			if !rw.relist() {
				return
			}
		}
		opts := metav1.ListOptions{ResourceVersion: rw.rv, AllowWatchBookmarks: true, TimeoutSeconds: rw.opts.TimeoutSeconds}
		var err error
		w, err = rw.l.open(rw.ctx, opts)
		switch {
		case err == nil:
			gone = false
		case rvGone(err):
			gone, w = true, nil
		case rw.ctx.Err() != nil:
			return
		default: // the apiserver is ready and refuses: the reflector's business
			rw.send(watch.Event{Type: watch.Error, Object: errStatusObject(err)})
			return
		}
	}
}

// reopenDelay is how long to wait before reopening a watch that ended, after prev:
// nothing after a watch that delivered or lasted (its timeout, an apiserver shutting
// down: the request that follows waits for the apiserver itself); after one that
// ended with an error or at once, 100 ms doubling to 500 ms, so an apiserver that
// keeps ending watches is not asked again in a tight loop.
func reopenDelay(prev time.Duration, err error, events int, lasted time.Duration) time.Duration {
	if err == nil && (events > 0 || lasted >= time.Second) {
		return 0
	}
	if prev == 0 {
		return retryInitial
	}
	return min(2*prev, retryMax)
}

// pump forwards w's events until it ends. It returns gone when it ended with 410 (or
// a resourceVersion the apiserver does not have yet), how many events it forwarded,
// and the error it ended with (nil: closed).
func (rw *resilientWatch) pump(w watch.Interface) (gone bool, events int, err error) {
	for {
		var ev watch.Event
		var ok bool
		select {
		case <-rw.ctx.Done():
			return false, events, nil
		case ev, ok = <-w.ResultChan():
		}
		if !ok {
			return false, events, nil
		}
		if ev.Type == watch.Error {
			err := apierrors.FromObject(ev.Object)
			if rvGone(err) {
				return true, events, err
			}
			rw.l.health.watchErrors.Add(1)
			return false, events, err
		}
		rw.l.health.event(time.Now())
		initialEnd := false
		if m, err := meta.Accessor(ev.Object); err == nil {
			switch {
			case ev.Type == watch.Bookmark && m.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true":
				rw.pastInitial, initialEnd = true, true
				rw.rv = m.GetResourceVersion()
			case rw.pastInitial:
				rw.rv = m.GetResourceVersion()
			}
		}
		rw.l.mu.Lock()
		unchanged := ev.Type != watch.Bookmark && rw.l.track(ev.Type, ev.Object) && !rw.pastInitial
		if initialEnd {
			rw.l.endList() // the initial state is complete: it is what the reflector holds
		}
		rw.l.mu.Unlock()
		if unchanged {
			rw.l.observer.Unchanged(ev.Object) // a WatchList relist's initial event
		}
		if p, ok := rw.l.observer.(ListProgress); ok {
			switch {
			case initialEnd:
				p.ListEnded() // a WatchList stream's initial state is complete
			case !rw.pastInitial && ev.Type != watch.Bookmark:
				p.Listed(ev.Object) // a WatchList stream's initial event
			}
		}
		if !rw.send(ev) {
			return false, events, nil
		}
		events++
	}
}

// relist lists afresh and delivers the difference to what was delivered, as events,
// page by page: each page's objects as soon as the page arrives, before the next is
// asked for, then, after the last page, every delivered object the list did not bring
// as deleted, and a bookmark at the list's resourceVersion. It returns false when
// stopped.
//
// Page by page, the agent holds one decoded page at a time beside what it delivered,
// not the whole list: a page's events carry the objects delivered before (unchanged)
// or copies (changed), which the informer's transform turns into what it keeps (stubs
// for objects with no work here) as the reflector receives them, so the page is
// garbage once its events are sent. Each page's events are true states of their
// objects (a list's pages are one snapshot), so they are delivered even if the list
// cannot be completed; only the deletions need the whole list.
func (rw *resilientWatch) relist() bool {
	l := rw.l
	l.health.relists[report.RelistExpired].Add(1)
	l.mu.Lock()
	objects := len(l.delivered)
	l.mu.Unlock()
	jitter := relistJitter(objects)
	l.log.Info("watch resourceVersion gone (410): listing again in place", "resourceVersion", rw.rv, "after", jitter)
	if !sleepCtx(rw.ctx, jitter) {
		return false
	}
	// A consistent list (resourceVersion ""), in pages: the apiserver serves it from its
	// watch cache (consistent reads from cache, GA in 1.34) a page at a time, every page
	// from the first page's snapshot, at its resourceVersion.
	opts := metav1.ListOptions{ResourceVersion: "", Limit: relistPageSize}
	first := l.newPass() // this relist's first pass over the list
	pass, begun, listed, expired := first, false, 0, 0
	for {
		obj, err := rw.listPage(opts)
		if err != nil && opts.Continue != "" && apierrors.IsResourceExpired(err) {
			// The continue token expired before the last page: the apiserver restarted
			// (its watch cache no longer holds the snapshot), the snapshot was
			// compacted, or, through the relay, the node's view changed. List
			// again from the first page, as a pass of its own, after another jittered
			// wait (a restart during a relist storm ends every agent's walk at once):
			// everything at once would decode the whole list beside the cache, the peak
			// paging avoids. After relistPagedRetries such passes expired too, list
			// everything at once, as client-go's pager does (FullListIfExpired): a
			// list that keeps changing faster than its pages are walked still ends.
			// What the earlier pages delivered stays delivered (it was true); the
			// deletions come from the last pass alone.
			expired++
			opts = metav1.ListOptions{ResourceVersion: "", Limit: relistPageSize}
			if expired > relistPagedRetries {
				opts.Limit = 0
			}
			jitter := relistJitter(objects)
			l.log.Info("relist's continue token expired: listing again", "err", err, "pageSize", opts.Limit, "after", jitter)
			if !sleepCtx(rw.ctx, jitter) {
				return false
			}
			pass, listed = l.newPass(), 0
			continue
		}
		if err != nil {
			if rw.ctx.Err() == nil {
				rw.send(watch.Event{Type: watch.Error, Object: errStatusObject(err)})
			}
			return false
		}
		listMeta, err := meta.ListAccessor(obj)
		if err != nil {
			return false
		}
		items, err := meta.ExtractList(obj)
		if err != nil {
			return false
		}
		if !begun {
			l.observer.BeginList()
			begun = true
		}
		if opts.Continue == "" {
			rw.rv = listMeta.GetResourceVersion() // the snapshot's: every page is of it
		}
		events, unchanged := l.diffPage(items, first, pass)
		for _, obj := range unchanged {
			l.observer.Unchanged(obj)
		}
		if p, ok := l.observer.(ListProgress); ok {
			for _, obj := range items {
				p.Listed(obj)
			}
		}
		listed += len(items)
		for _, ev := range events {
			if !rw.send(ev) {
				return false
			}
		}
		if opts.Continue = listMeta.GetContinue(); opts.Continue == "" {
			break
		}
	}
	if p, ok := l.observer.(ListProgress); ok {
		p.ListEnded()
	}
	for _, ev := range l.deleteUnlisted(pass) {
		if !rw.send(ev) {
			return false
		}
	}
	l.log.Info("listed again after 410", "objects", listed, "resourceVersion", rw.rv)
	bookmark := l.newObject()
	if m, err := meta.Accessor(bookmark); err == nil {
		m.SetResourceVersion(rw.rv)
	}
	return rw.send(watch.Event{Type: watch.Bookmark, Object: bookmark})
}

// listPage asks for one page of a relist, retried while the apiserver is not back
// (see retry). An expired continue token is returned at once: the cure is a list
// from the start, not the same request again.
func (rw *resilientWatch) listPage(opts metav1.ListOptions) (runtime.Object, error) {
	l := rw.l
	delay := retryInitial
	for {
		obj, err := l.base.ListWithContextFunc(rw.ctx, opts)
		if err == nil {
			l.recovered("list", delay)
			l.health.event(time.Now())
			l.health.answered()
			return obj, nil
		}
		if opts.Continue != "" && apierrors.IsResourceExpired(err) {
			return nil, err
		}
		l.health.listErrors.Add(1)
		if !l.retry(rw.ctx, "list", err, &delay) {
			return nil, err
		}
	}
}

// relistPageSize is the page size of a relist: client-go's pager's and the
// reflector's default.
const relistPageSize = 500

// relistPagedRetries is how many times a relist whose continue token expired lists
// again page by page before it lists everything at once.
const relistPagedRetries = 2

// A relist after a 410 waits first for a random delay, up to relistJitterPerObject
// per object delivered and at most relistJitterMax: an apiserver restart (or a CRD
// update) ends every agent's watch at once, and each lists every object again; the
// wait spreads those lists over time in proportion to their size (~97 µs of apiserver
// CPU per object served, BENCHMARKS.md), while a small cluster relists at once (2
// objects: at most 40 µs).
const (
	relistJitterPerObject = 20 * time.Microsecond
	relistJitterMax       = 5 * time.Second
)

// relistJitter is the random wait before relisting objects objects.
func relistJitter(objects int) time.Duration {
	bound := min(time.Duration(objects)*relistJitterPerObject, relistJitterMax)
	if bound <= 0 {
		return 0
	}
	return rand.N(bound)
}

// newPass numbers a pass over a relist's list: its pages, or the whole list again
// after its continue token expired.
func (l *listWatch) newPass() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.passes++
	return l.passes
}

// diffPage returns the events that bring one page of a relist's list to the
// reflector, and records its items as delivered and listed in pass: each item added,
// or modified (unchanged ones too, as the reflector's relist re-delivers them, as the
// object delivered before; a new uid under the same name is a delete and an add). An
// item at the version this relist delivered already in an earlier pass (one from
// first on) is not delivered again. It also returns the unchanged objects, for the
// observer.
func (l *listWatch) diffPage(items []runtime.Object, first, pass uint64) (events []watch.Event, unchanged []runtime.Object) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.delivered == nil {
		l.delivered = map[string]deliveredItem{}
	}
	events = make([]watch.Event, 0, len(items))
	for _, obj := range items {
		m, err := meta.Accessor(obj)
		if err != nil {
			continue
		}
		key := m.GetNamespace() + "/" + m.GetName()
		prev, ok := l.delivered[key]
		if ok && prev.uid == m.GetUID() && prev.rv == m.GetResourceVersion() {
			again := prev.pass >= first
			prev.pass = pass
			l.delivered[key] = prev
			if again {
				continue // delivered by this relist already, before its continue token expired
			}
			// Unchanged: re-deliver the object the reflector holds, not the new
			// decode. The informer's cache then keeps its object (node-local
			// versions in the pod table refer to it, see translate.Options.NodeLocal), and the new
			// page, which every listed item points into, is not kept alive by it.
			events = append(events, watch.Event{Type: watch.Modified, Object: prev.obj})
			unchanged = append(unchanged, prev.obj)
			continue
		}
		// New or changed: a copy of its own, so the new page is not kept.
		obj = obj.DeepCopyObject()
		switch {
		case !ok:
			events = append(events, watch.Event{Type: watch.Added, Object: obj})
		case prev.uid != m.GetUID():
			events = append(events, watch.Event{Type: watch.Deleted, Object: prev.obj}, watch.Event{Type: watch.Added, Object: obj})
		default:
			events = append(events, watch.Event{Type: watch.Modified, Object: obj})
		}
		l.delivered[key] = deliveredItem{uid: m.GetUID(), rv: m.GetResourceVersion(), obj: obj, pass: pass}
	}
	return events, unchanged
}

// deleteUnlisted ends a relist whose complete pass over the list was pass: every
// delivered object that pass did not list is forgotten, and returned as deleted.
func (l *listWatch) deleteUnlisted(pass uint64) (events []watch.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for key, prev := range l.delivered {
		if prev.pass != pass {
			events = append(events, watch.Event{Type: watch.Deleted, Object: prev.obj})
			delete(l.delivered, key)
		}
	}
	return events
}

// send forwards ev to the reflector; false when stopped.
func (rw *resilientWatch) send(ev watch.Event) bool {
	select {
	case rw.out <- ev:
		return true
	case <-rw.ctx.Done():
		return false
	}
}

func errStatus(err error) metav1.Status {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return status.Status()
	}
	return apierrors.NewInternalError(err).Status()
}

func errStatusObject(err error) *metav1.Status {
	s := errStatus(err)
	return &s
}
