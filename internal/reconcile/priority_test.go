package reconcile

import (
	"strconv"
	"testing"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/translate"
)

// elsewherePE is benchPE(i) with no pod on this node.
func elsewherePE(i int) *v1alpha1.PolicyEndpoint {
	pe := benchPE(i, 100)
	pe.Spec.PodSelectorEndpoints[0].HostIP = "192.0.2.99"
	return pe
}

// TestLocalKeysServedFirst: after a burst of 2,000 writes of objects with no pod on
// this node, a write of an object with one is the first key a worker takes, and an
// object of the burst that gains a pod here before it was taken comes next; the
// burst follows in its order. Asserted on the order of the queue, not on time.
func TestLocalKeysServedFirst(t *testing.T) {
	c := offlineController(t, bpfmaps.NewMemory(), newLookupTableResolver(), nil)
	store := c.informers[report.KindPolicyEndpoint].GetIndexer()
	h := c.handler(report.KindPolicyEndpoint)
	const burst = 2000
	for i := range burst {
		pe := elsewherePE(i)
		if err := store.Add(pe); err != nil {
			t.Fatal(err)
		}
		h.OnAdd(pe, false)
	}
	local := benchPE(burst, 100)
	if err := store.Add(local); err != nil {
		t.Fatal(err)
	}
	h.OnAdd(local, false)
	// One of the burst, still queued, gains a pod here.
	moved, gained := elsewherePE(1000), benchPE(1000, 100)
	gained.ResourceVersion = strconv.Itoa(100000)
	if err := store.Update(gained); err != nil {
		t.Fatal(err)
	}
	h.OnUpdate(moved, gained)

	if n := c.queue.Len(); n != burst+1 {
		t.Fatalf("queue holds %d keys, want %d", n, burst+1)
	}
	want := []translate.Key{keyOf(report.KindPolicyEndpoint, local), keyOf(report.KindPolicyEndpoint, gained)}
	for i := range burst {
		if i != 1000 {
			want = append(want, keyOf(report.KindPolicyEndpoint, elsewherePE(i)))
		}
	}
	for i, w := range want {
		key, shutdown := c.queue.Get()
		if shutdown {
			t.Fatal("queue shut down")
		}
		c.queue.Done(key)
		if key != w {
			t.Fatalf("key %d served: %s, want %s (the local ones first, then the burst in order)", i, key, w)
		}
	}
	if n := c.queue.Len(); n != 0 {
		t.Fatalf("%d keys left after every key was served once", n)
	}
}

// TestLocalFirstQueue: the queue under the workqueue keeps its count right when a
// key moves to the local line, is served, queued again among the others and moves
// again before its first place was skipped.
func TestLocalFirstQueue(t *testing.T) {
	isLocal := map[translate.Key]bool{}
	q := &localFirst{local: func(k translate.Key) bool { return isLocal[k] }}
	a, b, x := translate.Key{Name: "a"}, translate.Key{Name: "b"}, translate.Key{Name: "x"}
	q.Push(a)
	q.Push(x)
	isLocal[x] = true
	q.Touch(x) // moves: its place in rest is skipped
	if got := q.Pop(); got != x || q.Len() != 1 {
		t.Fatalf("Pop = %v, Len %d; want x, 1", got, q.Len())
	}
	isLocal[x] = false
	q.Push(x) // queued again among the others, behind its old place
	isLocal[x] = true
	q.Touch(x)
	q.Push(b)
	if q.Len() != 3 {
		t.Fatalf("Len %d, want 3 (x, a, b)", q.Len())
	}
	for _, want := range []translate.Key{x, a, b} {
		if got := q.Pop(); got != want {
			t.Fatalf("Pop = %v, want %v", got, want)
		}
	}
	if q.Len() != 0 {
		t.Fatalf("Len %d after every key, want 0", q.Len())
	}
}
