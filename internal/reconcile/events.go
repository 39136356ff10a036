package reconcile

import (
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/kubewatch"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/seen"
	"github.com/npagent/npagent/internal/translate"
)

// Event handlers do O(1) work, as kube-proxy's change trackers do: record the version
// (its trigger annotation parsed once per version, see versions.go), tell the
// seen-set, count the delivery, and enqueue the key when something may need
// programming. Everything else happens in the workers.
//
// How each delivery is classified:
//
//   - add: OnAdd — the initial list (agent start) or a new object.
//   - update: OnUpdate with a new resourceVersion — a write. Enqueued.
//   - delete: OnDelete (tombstones included). The uid is recorded as deleted and the
//     key enqueued; the worker re-commits its pods without it and forgets the uid.
//   - relist: a list after a watch failure (410 Gone, apiserver restart) delivers
//     every object again. A shared informer passes a same-resourceVersion update on only
//     to handlers whose resync is due, so with resync off a relist of unchanged objects
//     never reaches a handler at all, and with resync on it looks like a resync. So the
//     relist is caught one step earlier, where the list arrives: kubewatch's ListWatch
//     knows what it delivered before and tells relistObserver of every object a relist
//     brings with the uid and resourceVersion delivered before, once per relist (a
//     list's pages and a WatchList stream's initial events alike), before the reflector
//     gets it. It is counted and observed there, and marked in the version table
//     (versionEntry.relist); the same-resourceVersion update that may follow is
//     recognised by its mark and dropped.
//   - resync: OnUpdate with the same resourceVersion and no relist mark. Dropped
//     without enqueueing unless the seen-set accepts its trigger (it never should).
//
// A relist that finds an object changed delivers it as update; one that misses a
// deleted object delivers a delete (tombstone). Known imprecision: if a relist's
// same-resourceVersion update is not passed on (resync was not due at that moment),
// its mark stays until the next relist, and a resync of that object meanwhile is taken
// for the relist's and not counted.

func (c *Controller) handler(kind report.Kind) cache.ResourceEventHandler {
	return cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj any, _ bool) {
			m, err := meta.Accessor(obj)
			if err != nil {
				return
			}
			c.observe(kind, m, report.CauseAdd)
			// Always synced: at agent start the dataplane may hold an older version
			// (pinned state from the previous process) or pods may have changed.
			c.enqueue(kind, m)
		},
		UpdateFunc: func(oldObj, newObj any) {
			m, err := meta.Accessor(newObj)
			if err != nil {
				return
			}
			old, err := meta.Accessor(oldObj)
			if err != nil {
				return
			}
			if old.GetResourceVersion() != m.GetResourceVersion() {
				c.observe(kind, m, report.CauseUpdate)
				c.enqueue(kind, m)
				return
			}
			if c.versions.consumeRelist(m.GetUID(), m.GetResourceVersion(), c.relists[kind].current()) {
				return // a relist re-delivery, counted by relistObserver
			}
			if c.observe(kind, m, report.CauseResync) {
				c.enqueue(kind, m)
			}
		},
		DeleteFunc: func(obj any) {
			var key translate.Key
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				ns, name, err := cache.SplitMetaNamespaceKey(tomb.Key)
				if err != nil {
					return
				}
				key = translate.Key{Kind: kind, Namespace: ns, Name: name}
				obj = tomb.Obj
			}
			c.stats.deliveries[kind][report.CauseDelete].Add(1)
			if m, err := meta.Accessor(obj); err == nil && obj != nil {
				key = keyOf(kind, m)
				c.deleted.add(key, m.GetUID())
				if pe, ok := obj.(*v1alpha1.PolicyEndpoint); ok {
					c.stubs.forget(key, pe.Spec.PolicyRef.Name)
				}
			}
			if key.Name != "" {
				c.queue.Add(key)
			}
		},
	}
}

// triggerMissingHint says why an object lacks the trigger annotation and what to do.
const triggerMissingHint = "the controller that wrote it does not stamp the change's trigger time; the AWS Network Policy Controller stamps it in v1.1.10 (upgrade it, or --trigger-annotation names another annotation)"

// observe counts a delivery and tells the seen-set about its trigger. It reports
// whether the seen-set accepted a new trigger (false without annotation).
func (c *Controller) observe(kind report.Kind, m metav1.Object, cause report.Cause) bool {
	v, fresh, redelivers := c.versions.recordKnown(m)
	return c.observeVersion(kind, m, cause, v, fresh, redelivers)
}

// observeVersion is observe of m's version v, recorded already (fresh: by this
// delivery; redelivers: see versionEntry.redelivers).
func (c *Controller) observeVersion(kind report.Kind, m metav1.Object, cause report.Cause, v objectVersion, fresh, redelivers bool) bool {
	c.stats.deliveries[kind][cause].Add(1)
	if !v.hasTrigger {
		// Nothing to measure. Counted once per written version and logged once per
		// object: a controller that does not stamp the annotation leaves the
		// latency dashboard empty, and this says why.
		if fresh {
			c.stats.triggerMissing[kind].Add(1)
			if c.versions.firstMissing(v.uid) {
				c.log.Warn("policy object has no trigger annotation: its programming latency is not measured (enforced as usual)",
					"kind", kind.String(), "namespace", m.GetNamespace(), "name", m.GetName(), "uid", v.uid,
					"annotation", c.cfg.TriggerAnnotation, "hint", triggerMissingHint)
			}
		}
		return false
	}
	if v.triggerErr != nil {
		if fresh {
			// Suppressed, logged and counted once per written version, not per
			// re-delivery (a resync or relist of it brings nothing new). The
			// object is still programmed: a bad timestamp must not cost
			// enforcement.
			c.cfg.Seen.ObserveInvalid(string(v.uid))
			field := "metadata.annotations[" + c.cfg.TriggerAnnotation + "]"
			c.stats.invalid(kind, field)
			c.log.Warn("invalid trigger annotation: latency not measured", "kind", kind.String(),
				"namespace", m.GetNamespace(), "name", m.GetName(), "uid", v.uid, "field", field, "err", v.triggerErr)
		}
		return false
	}
	if redelivers {
		// The seen-set would answer redelivered and change nothing: count it so
		// without the lookup.
		c.cfg.Seen.CountRedelivered()
		return false
	}
	// The seen-set keeps an accepted trigger's version with it until it is reported:
	// a commit may serve several triggers, each reported with its own version.
	answer := c.cfg.Seen.ObserveVersion(string(v.uid), v.trigger, time.Now(), seen.Version{
		ResourceVersion: v.resourceVersion,
		TraceParent:     v.traceParent,
		LocalWork:       v.localWork,
		RemovedOnly:     v.removedOnly(),
	})
	c.versions.observed(v, answer)
	return answer == report.Accepted
}

// transform runs on every object a list, WatchList stream or watch event brings, before
// the informer caches it (never on resync). It only drops managedFields, which the
// agent never reads; relists are observed by relistObserver.
func transform(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil && m.GetManagedFields() != nil {
		m.SetManagedFields(nil) // not on an object already cached (a relist re-delivers it)
	}
	return obj, nil
}

// relistObserver is kind's kubewatch.ListObserver: it numbers the lists and observes a
// relist's re-deliveries (see the comment at the top), once per relist each. It is
// called one call at a time, before the informer's transform and handlers (see
// kubewatch.ListObserver for the goroutines).
type relistObserver struct {
	c    *Controller
	kind report.Kind
}

var _ kubewatch.ListObserver = relistObserver{}

func (o relistObserver) BeginList() { o.c.relists[o.kind].begin() }

// Unchanged observes obj, re-delivered by a relist as the version delivered before.
// The version table holds it (the handlers reached it: one lookup, which also marks
// it) or, if the handlers have not reached it yet, it is recorded here first.
func (o relistObserver) Unchanged(obj runtime.Object) {
	c, kind := o.c, o.kind
	m, err := meta.Accessor(obj)
	if err != nil {
		return
	}
	list := c.relists[kind].current()
	if list <= 1 {
		return // the initial list: nothing was delivered before it
	}
	v, redelivers, mark := c.versions.markRelist(m, list)
	fresh := false
	if mark == relistUnknown {
		v, fresh, redelivers = c.versions.recordKnown(m)
		_, _, mark = c.versions.markRelist(m, list)
	}
	if mark != relistFirst {
		return // observed in this relist already (a list retried)
	}
	if c.observeVersion(kind, m, report.CauseRelist, v, fresh, redelivers) {
		c.enqueue(kind, m)
	}
}

// relistTracker counts the lists of one kind; the marks of the current one are kept
// in the version table (versionEntry.relist).
type relistTracker struct {
	lists atomic.Int64 // lists begun; the first is the initial list (read per object: no lock)
}

// begin is called at the start of every list: earlier relists' marks lapse.
func (t *relistTracker) begin() { t.lists.Add(1) }

// current is the number of the list in progress: 1 for the initial list, more for a
// relist, 0 before any.
func (t *relistTracker) current() int64 { return t.lists.Load() }

// listing reports whether a relist (not the initial list) has begun.
func (t *relistTracker) listing() bool { return t.current() > 1 }

func keyOf(kind report.Kind, m metav1.Object) translate.Key {
	return translate.Key{Kind: kind, Namespace: m.GetNamespace(), Name: m.GetName()}
}
