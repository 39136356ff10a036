package reconcile

import (
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"

	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/translate"
)

// Every agent receives every write of the cluster, and on a large cluster almost all
// of them are for other nodes: in a first-in-first-out queue a burst of writes
// elsewhere (2,000 of them took 0.2-0.6 s) delays this node's own update behind them.
// So the workqueue serves the keys of objects with work on this node first: the
// handlers mark a key local when the version they recorded has local work
// (objectVersion.localWork: it selects a pod here, or its previous version did), and
// the queue underneath client-go's workqueue (its extension point,
// workqueue.TypedQueueConfig.Queue) keeps two first-in-first-out lines. The
// workqueue's own guarantees (a key queued once, never processed by two workers at
// once, rate-limited retries) are unchanged: only the order of Get changes.

// localKeys is the set of keys whose newest recorded version has work on this node:
// O(local objects).
type localKeys struct {
	mu   sync.Mutex
	keys map[translate.Key]struct{}
}

func (l *localKeys) set(key translate.Key, local bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case local && l.keys == nil:
		l.keys = map[translate.Key]struct{}{key: {}}
	case local:
		l.keys[key] = struct{}{}
	default:
		delete(l.keys, key)
	}
}

func (l *localKeys) has(key translate.Key) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.keys[key]
	return ok
}

// enqueue queues m's key, local (served first) when the version the handlers
// recorded for it has work on this node: it selects a pod here, or (once the
// caches synced) its previous version did. During the initial list every version
// counts as having work (the previous process may have programmed pods of it), so
// only the versions that select a pod here are served first then.
func (c *Controller) enqueue(kind report.Kind, m metav1.Object) {
	key := keyOf(kind, m)
	v, _ := c.versions.lookup(m)
	c.local.set(key, v.local || (v.localWork && c.versions.synced.Load()))
	c.queue.Add(key)
}

// newLocalFirstQueue is the loop's workqueue: client-go's rate-limiting workqueue
// over a localFirst queue.
func newLocalFirstQueue(local *localKeys, limiter workqueue.TypedRateLimiter[translate.Key]) workqueue.TypedRateLimitingInterface[translate.Key] {
	q := workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[translate.Key]{Queue: &localFirst{local: local.has}})
	return workqueue.NewTypedRateLimitingQueueWithConfig(limiter, workqueue.TypedRateLimitingQueueConfig[translate.Key]{
		DelayingQueue: workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[translate.Key]{Queue: q}),
	})
}

// localFirst is a workqueue.Queue of two first-in-first-out lines: keys local
// reports true for when they are pushed, served first, and the others. A key
// queued among the others that becomes local (Touch: added again before it was
// taken) moves to the local line; its place among the others is skipped. The
// workqueue calls it under its own lock.
type localFirst struct {
	local       func(translate.Key) bool
	first, rest []translate.Key
	// inRest: queued keys waiting in rest; moved: how many places in rest each key
	// left for the local line, to be skipped (they come before any place the key
	// took since: the lines are first-in-first-out); movedN: their sum.
	inRest map[translate.Key]struct{}
	moved  map[translate.Key]int
	movedN int
}

var _ workqueue.Queue[translate.Key] = (*localFirst)(nil)

func (q *localFirst) Push(key translate.Key) {
	if q.local(key) {
		q.first = append(q.first, key)
		return
	}
	if q.inRest == nil {
		q.inRest, q.moved = map[translate.Key]struct{}{}, map[translate.Key]int{}
	}
	q.rest = append(q.rest, key)
	q.inRest[key] = struct{}{}
}

// Touch moves key, queued again before it was taken, to the local line if it is
// local now.
func (q *localFirst) Touch(key translate.Key) {
	if _, ok := q.inRest[key]; !ok || !q.local(key) {
		return
	}
	delete(q.inRest, key)
	q.moved[key]++
	q.movedN++
	q.first = append(q.first, key)
}

func (q *localFirst) Len() int { return len(q.first) + len(q.rest) - q.movedN }

func (q *localFirst) Pop() translate.Key {
	if len(q.first) > 0 {
		return pop(&q.first)
	}
	for {
		key := pop(&q.rest)
		if n := q.moved[key]; n > 0 { // a place left for the local line
			if n == 1 {
				delete(q.moved, key)
			} else {
				q.moved[key] = n - 1
			}
			q.movedN--
			continue
		}
		delete(q.inRest, key)
		return key
	}
}

func pop(line *[]translate.Key) translate.Key {
	key := (*line)[0]
	(*line)[0] = translate.Key{} // the backing array keeps no key alive
	if *line = (*line)[1:]; len(*line) == 0 {
		*line = nil // nor does an emptied line keep its array (a list's worth of keys)
	}
	return key
}
