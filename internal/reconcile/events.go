package reconcile

import (
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

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
//     relist is caught one step earlier, in the informer's transform function, which
//     client-go calls on every object a list (or WatchList stream) brings and never on
//     resync: an incoming object whose uid and resourceVersion equal the version the
//     version table recorded for the uid (or else the cached one) is a relist
//     re-delivery. It is counted and observed there, once per relist (the
//     ListWatch marks the start of each list, and WatchList mode transforms each object
//     twice, so a per-relist mark dedupes), and the same-resourceVersion update that
//     may follow is recognised by its mark and dropped.
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
				return // a relist re-delivery, counted by transform
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
			}
			if key.Name != "" {
				c.queue.Add(key)
			}
		},
	}
}

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
		return false // nothing to measure
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
// the informer caches it (never on resync). It drops managedFields, which the agent
// never reads, and detects relist re-deliveries (see the comment at the top).
//
// A re-delivery of the version the version table holds for its uid (the newest one
// events recorded) is decided there, in one lookup that also marks it: the cached
// object is that version, or one the handlers have not reached yet. Anything else
// (a version the handlers have not recorded) asks the informer's store, as before.
func (c *Controller) transform(kind report.Kind) cache.TransformFunc {
	return func(obj any) (any, error) {
		m, err := meta.Accessor(obj)
		if err != nil {
			return obj, nil
		}
		if m.GetManagedFields() != nil {
			m.SetManagedFields(nil) // not on an object already cached (a relist re-delivers it)
		}
		list := c.relists[kind].current()
		if list <= 1 {
			return obj, nil // the initial list, or none yet
		}
		v, redelivers, mark := c.versions.markRelist(m, list)
		switch mark {
		case relistAgain:
			return obj, nil // second transform of the same relist (WatchList mode)
		case relistFirst:
			if c.observeVersion(kind, m, report.CauseRelist, v, false, redelivers) {
				c.enqueue(kind, m)
			}
			return obj, nil
		}
		cached, exists, err := c.informers[kind].GetStore().Get(obj)
		if err != nil || !exists {
			return obj, nil
		}
		cm, err := meta.Accessor(cached)
		if err != nil || cm.GetUID() != m.GetUID() || cm.GetResourceVersion() != m.GetResourceVersion() {
			return obj, nil
		}
		// The cached version, not recorded yet: record it, then mark it.
		v, fresh, redelivers := c.versions.recordKnown(m)
		if _, _, mark := c.versions.markRelist(m, list); mark != relistFirst {
			return obj, nil
		}
		if c.observeVersion(kind, m, report.CauseRelist, v, fresh, redelivers) {
			c.enqueue(kind, m)
		}
		return obj, nil
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
