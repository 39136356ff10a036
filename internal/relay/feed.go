package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/npagent/npagent/api/v1alpha1"
)

// object is one object version as the relay holds it: what the filter needs and its
// JSON, encoded once and written to every watcher that gets it.
type object struct {
	key   string // namespace/name
	uid   types.UID
	rv    uint64
	group string       // namespace/policyRef.name for a PolicyEndpoint; "" for a ClusterPolicyEndpoint
	hosts []netip.Addr // the hostIPs of its podSelectorEndpoints, sorted, no duplicates
	raw   []byte
}

// group is the PolicyEndpoints of one policy (namespace and spec.policyRef.name): a
// node sees all of them or none, as the agent needs a local object's siblings.
type group struct {
	members map[string]*object
	hosts   map[netip.Addr]int // hostIP → members naming it
}

func (g *group) hostSet() []netip.Addr {
	out := make([]netip.Addr, 0, len(g.hosts))
	for h := range g.hosts {
		out = append(out, h)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// groupChange is how one event changed a group: its hosts before and after, and its
// other members (unchanged by the event), which enter or leave a node's view with it.
type groupChange struct {
	was, is []netip.Addr
	others  []*object
}

// entry is one upstream event in the window, with what a watcher needs to turn it
// into its node's events without looking at the feed's state (which may be ahead).
type entry struct {
	rv       uint64
	old, new *object // the object before (nil: it did not exist) and after (nil: deleted)
	gone     *object // a delete's object as the apiserver sent it (its resourceVersion is the delete's)
	groups   []groupChange
	oldGroup int // index in groups of old's group; -1 when none
	newGroup int // index in groups of new's group; -1 when none
}

// feed is one resource (policyendpoints or clusterpolicyendpoints) as the relay
// holds it: the current objects, their groups, and a window of recent events with
// the apiserver's resourceVersions.
type feed struct {
	resource string
	gvk      schema.GroupVersionKind
	grouped  bool // PolicyEndpoints: filtered per node by group; ClusterPolicyEndpoints: every node sees all
	capacity int  // entries kept in the window

	mu     sync.RWMutex
	store  map[string]*object
	groups map[string]*group
	window []entry
	// start is the resourceVersion the window begins after: a watch from start or
	// later can be served, an older one is 410 Gone.
	start uint64
	// rv is the resourceVersion the store is exact at (the last event or bookmark).
	rv uint64
	// changed is the resourceVersion of the last entry: a list's continue token is
	// good while it stands.
	changed uint64
	// gen counts resets (upstream relists): a watcher of an older one is expired.
	gen uint64
	// synced is false until the first list and during a reset.
	synced bool
	wake   chan struct{} // closed and replaced when anything changes
}

func newFeed(resource string, gvk schema.GroupVersionKind, grouped bool, capacity int) *feed {
	return &feed{resource: resource, gvk: gvk, grouped: grouped, capacity: capacity,
		store: map[string]*object{}, groups: map[string]*group{}, wake: make(chan struct{})}
}

// notify wakes every waiter; f.mu held for writing.
func (f *feed) notify() {
	close(f.wake)
	f.wake = make(chan struct{})
}

// beginReset starts an upstream (re)list: watchers of the generation before are
// expired, and lists and watches wait until endReset. With clear the store is
// emptied (a list follows); without, the events of an in-place relist follow (the
// difference to what was delivered before).
func (f *feed) beginReset(clear bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if clear {
		f.store, f.groups = map[string]*object{}, map[string]*group{}
	}
	f.gen++
	f.synced = false
	f.window = nil
	f.notify()
}

// endReset ends a (re)list: the store is exact at rv, and the window starts there.
func (f *feed) endReset(rv uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rv, f.start, f.changed, f.synced = rv, rv, rv, true
	f.notify()
}

// waitSynced waits until the feed is synced (not resetting) or ctx ends.
func (f *feed) waitSynced(ctx context.Context) bool {
	for {
		f.mu.RLock()
		ok, wake := f.synced, f.wake
		f.mu.RUnlock()
		if ok {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-wake:
		}
	}
}

// ingest applies one upstream event. During a reset (a list's items, or a relist's
// difference) the store changes but no entry is kept: the watchers of the
// generation were expired, and the ones after start at the reset's resourceVersion.
func (f *feed) ingest(typ watch.EventType, obj runtime.Object) error {
	m, err := meta.Accessor(obj)
	if err != nil {
		return fmt.Errorf("relay: %s event: %w", f.resource, err)
	}
	rv, err := strconv.ParseUint(m.GetResourceVersion(), 10, 64)
	if err != nil {
		return fmt.Errorf("relay: %s event: resourceVersion %q: %w", f.resource, m.GetResourceVersion(), err)
	}
	if typ == watch.Bookmark {
		f.mu.Lock()
		if rv > f.rv || !f.synced {
			f.rv = rv
		}
		if !f.synced { // the bookmark that ends an in-place relist
			f.start, f.changed, f.synced = rv, rv, true
		}
		f.notify()
		f.mu.Unlock()
		return nil
	}
	key := m.GetNamespace() + "/" + m.GetName()
	o, err := f.newObject(key, m.GetUID(), rv, obj)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	old := f.store[key]
	var e entry
	switch typ {
	case watch.Added, watch.Modified:
		if old != nil && old.uid == o.uid && old.rv == o.rv {
			return nil // a relist's unchanged object
		}
		e = entry{rv: rv, old: old, new: o}
	case watch.Deleted:
		if old == nil {
			return nil
		}
		e = entry{rv: rv, old: old, gone: o}
	default:
		return nil
	}
	e.oldGroup, e.newGroup = -1, -1
	if f.grouped {
		f.applyGroups(&e, key)
	}
	if e.new != nil {
		f.store[key] = e.new
	} else {
		delete(f.store, key)
	}
	if !f.synced {
		return nil
	}
	if rv > f.rv {
		f.rv = rv
	}
	f.changed = rv
	f.window = append(f.window, e)
	if over := len(f.window) - f.capacity; over > 0 {
		f.start = f.window[over-1].rv
		// Copy when the dropped prefix is large, so the backing array does not grow
		// without bound.
		if cap(f.window) > 2*f.capacity {
			f.window = slices.Clone(f.window[over:])
		} else {
			f.window = f.window[over:]
		}
	}
	f.notify()
	return nil
}

// applyGroups moves the event's object between groups and records how each group it
// touched changed; f.mu held.
func (f *feed) applyGroups(e *entry, key string) {
	names := make([]string, 0, 2)
	if e.old != nil {
		names = append(names, e.old.group)
	}
	if e.new != nil && (e.old == nil || e.new.group != e.old.group) {
		names = append(names, e.new.group)
	}
	for i, name := range names {
		g := f.groups[name]
		if g == nil {
			g = &group{members: map[string]*object{}, hosts: map[netip.Addr]int{}}
			f.groups[name] = g
		}
		gc := groupChange{was: g.hostSet()}
		if e.old != nil && e.old.group == name {
			delete(g.members, key)
			for _, h := range e.old.hosts {
				if g.hosts[h]--; g.hosts[h] == 0 {
					delete(g.hosts, h)
				}
			}
			e.oldGroup = i
		}
		for k, o := range g.members {
			if k != key {
				gc.others = append(gc.others, o)
			}
		}
		if e.new != nil && e.new.group == name {
			g.members[key] = e.new
			for _, h := range e.new.hosts {
				g.hosts[h]++
			}
			e.newGroup = i
		}
		gc.is = g.hostSet()
		if len(g.members) == 0 {
			delete(f.groups, name)
		}
		e.groups = append(e.groups, gc)
	}
}

// newObject reads what the filter needs of obj and encodes it once.
func (f *feed) newObject(key string, uid types.UID, rv uint64, obj runtime.Object) (*object, error) {
	o := &object{key: key, uid: uid, rv: rv}
	var eps []v1alpha1.PodEndpoint
	switch t := obj.(type) {
	case *v1alpha1.PolicyEndpoint:
		o.group = t.Namespace + "/" + t.Spec.PolicyRef.Name
		eps = t.Spec.PodSelectorEndpoints
	case *v1alpha1.ClusterPolicyEndpoint:
	default:
		return nil, fmt.Errorf("relay: %s event: unexpected %T", f.resource, obj)
	}
	for i := range eps {
		if h, err := netip.ParseAddr(string(eps[i].HostIP)); err == nil {
			o.hosts = append(o.hosts, h.Unmap())
		}
	}
	slices.SortFunc(o.hosts, netip.Addr.Compare)
	o.hosts = slices.Compact(o.hosts)
	// The kind is set for the encoding: the decoder left it empty, and the relay is
	// the only holder of what it decoded.
	obj.GetObjectKind().SetGroupVersionKind(f.gvk)
	raw, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("relay: encode %s %s: %w", f.resource, key, err)
	}
	o.raw = raw
	return o, nil
}

// intersects reports whether the sorted hosts include one of addrs.
func intersects(hosts, addrs []netip.Addr) bool {
	for _, a := range addrs {
		if _, ok := slices.BinarySearchFunc(hosts, a, netip.Addr.Compare); ok {
			return true
		}
	}
	return false
}

// outEvent is one event for a watcher.
type outEvent struct {
	typ watch.EventType
	obj *object
}

// render appends to out the events e means for a node with addrs, as a field-selector
// watch delivers them: an object entering the view ADDED, leaving it DELETED. The
// event's own object comes last, so the last resourceVersion a client sees is the
// entry's (its siblings carry their own, older ones).
func (f *feed) render(out []outEvent, e *entry, addrs []netip.Addr) []outEvent {
	before, after := e.old != nil, e.new != nil
	if f.grouped {
		for i := range e.groups {
			gc := &e.groups[i]
			was, is := intersects(gc.was, addrs), intersects(gc.is, addrs)
			if i == e.oldGroup {
				before = before && was
			}
			if i == e.newGroup {
				after = after && is
			}
			if was == is {
				continue
			}
			typ := watch.Deleted
			if is {
				typ = watch.Added
			}
			for _, o := range gc.others {
				out = append(out, outEvent{typ, o})
			}
		}
	}
	switch {
	case before && after:
		out = append(out, outEvent{watch.Modified, e.new})
	case after:
		out = append(out, outEvent{watch.Added, e.new})
	case before && e.new != nil:
		out = append(out, outEvent{watch.Deleted, e.new})
	case before:
		out = append(out, outEvent{watch.Deleted, e.gone})
	}
	return out
}

// viewLocked returns the objects a node with addrs sees now, sorted by key; f.mu
// held for reading.
func (f *feed) viewLocked(addrs []netip.Addr) []*object {
	var out []*object
	if !f.grouped {
		out = make([]*object, 0, len(f.store))
		for _, o := range f.store {
			out = append(out, o)
		}
	} else {
		for _, g := range f.groups {
			if !groupHasAny(g, addrs) {
				continue
			}
			for _, o := range g.members {
				out = append(out, o)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].key < out[j].key })
	return out
}

func groupHasAny(g *group, addrs []netip.Addr) bool {
	for _, a := range addrs {
		if g.hosts[a] > 0 {
			return true
		}
	}
	return false
}

// viewChangedLocked reports whether a change after rv touched the view of a node with
// addrs (rendered an event for it), or cannot be told (rv older than the window);
// f.mu held for reading.
func (f *feed) viewChangedLocked(rv uint64, addrs []netip.Addr) bool {
	entries, ok := f.sinceLocked(rv)
	if !ok {
		return true
	}
	var out []outEvent
	for i := range entries {
		if out = f.render(out[:0], &entries[i], addrs); len(out) > 0 {
			return true
		}
	}
	return false
}

// sinceLocked returns the window's entries after rv. ok is false when rv is older than the
// window (410 Gone).
func (f *feed) sinceLocked(rv uint64) (entries []entry, ok bool) {
	if rv < f.start {
		return nil, false
	}
	i := sort.Search(len(f.window), func(i int) bool { return f.window[i].rv > rv })
	return f.window[i:], true
}
