package reconcile

import (
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/explain"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/seen"
	"github.com/npagent/npagent/internal/translate"
)

// TracingTraceParentAnnotation is the annotation KEP-5915 standardises for a
// writer's W3C traceparent. It is read on every object, before the configured
// key (Config.TraceParentAnnotation): see versionTable.parse.
const TracingTraceParentAnnotation = "tracing.k8s.io/traceparent"

// objectVersion is what the loop needs of one object version's metadata: its
// identity and its parsed annotations.
type objectVersion struct {
	uid             types.UID
	resourceVersion string
	hasTrigger      bool      // the trigger annotation is present
	trigger         time.Time // zero when the annotation is missing or invalid
	triggerErr      error     // why the annotation did not parse
	traceParent     string
	// local: this version selects a pod on this node (hostIP is the node IP).
	local bool
	// localWork: this version changes this node's dataplane — it selects a pod here,
	// or the uid's previous version did (this one removes pods from the policy here).
	// A trigger is reported on a node only if its own version had local work there.
	localWork bool
}

// versionEntry is the table's record of a uid: its newest version, and what the
// event path learnt about that version since.
type versionEntry struct {
	v objectVersion
	// redelivers: the seen-set answered this version's trigger accepted, redelivered
	// or before_start, and no earlier version of the uid recorded here carried a newer
	// trigger. The trigger is then pending or consumed, and stays so while this is the
	// uid's newest version (the worker consumes only triggers of versions it read from
	// the informer's store, and every one of those is recorded here, in order, before
	// a later one): every re-delivery of the version answers redelivered, and is
	// counted so without asking (seen.Set.CountRedelivered).
	redelivers bool
	// olderMax is the newest trigger of the uid's earlier versions recorded here.
	olderMax time.Time
	// relist is the relist (relistTracker.lists) that last re-delivered this
	// version, 0 for none; relistConsumed: its same-resourceVersion update reached
	// the handler.
	relist         int64
	relistConsumed bool
	// missingLogged: a version of the uid without the trigger annotation was
	// logged; later ones are only counted (one line per object, not per write).
	missingLogged bool
}

// removedOnly reports whether the version's only change on this node is removing
// pods an earlier version of the object selected.
func (v objectVersion) removedOnly() bool { return v.localWork && !v.local }

// versionTable records each object version's parsed annotations the first time an
// event brings it (kube-proxy's habit: record at event time), so re-deliveries and the
// worker check it out instead of parsing the annotation again. It holds the newest
// version per uid: O(objects). The worker drops a uid when it forgets the object.
type versionTable struct {
	mu       sync.Mutex
	byUID    map[types.UID]*versionEntry
	triggerK string           // the trigger annotation's key
	traceK   string           // the configured traceparent annotation's key, read after TracingTraceParentAnnotation
	history  *explain.History // each new version is added to it; forget drops the uid's
	nodeIP   netip.Addr
	// synced is set once the informers' initial lists are in: a uid first recorded
	// after it is a new object (no earlier version ever had pods here); one first
	// recorded before it may have had pods here under the previous process, whose
	// pinned state this one adopted.
	synced atomic.Bool
}

func (t *versionTable) init(triggerKey, traceParentKey string, nodeIP netip.Addr) {
	t.byUID = map[types.UID]*versionEntry{}
	t.triggerK, t.traceK = triggerKey, traceParentKey
	t.nodeIP = nodeIP
}

// record returns m's version for an event handler, parsing the annotations only if
// this version is new to the table (the first event that brings it: fresh) and
// recording it. Handlers of one informer run one at a time and in order, so the
// table holds each uid's newest version. A re-delivery allocates nothing.
func (t *versionTable) record(m metav1.Object) (v objectVersion, fresh bool) {
	v, fresh, _ = t.recordKnown(m)
	return v, fresh
}

// recordKnown is record, also reporting for a re-delivery whether its trigger is
// known to answer redelivered (versionEntry.redelivers).
func (t *versionTable) recordKnown(m metav1.Object) (v objectVersion, fresh, redelivers bool) {
	if v, redelivers, ok := t.lookupEntry(m); ok {
		return v, false, redelivers
	}
	v = t.parse(m)
	t.mu.Lock()
	prev, known := t.byUID[v.uid]
	// An earlier version's pods, if any, are still in the dataplane until this one is
	// committed: removing them is this version's work. Unknown (first seen in the
	// initial list): the previous process may have programmed pods of it here.
	v.localWork = v.local || (known && prev.v.local) || (!known && !t.synced.Load())
	e := &versionEntry{v: v}
	if known {
		e.olderMax = prev.olderMax
		e.missingLogged = prev.missingLogged
		if prev.v.trigger.After(e.olderMax) {
			e.olderMax = prev.v.trigger
		}
	}
	t.byUID[v.uid] = e
	t.mu.Unlock()
	t.history.Received(string(v.uid), v.resourceVersion, v.trigger, v.localWork, time.Now())
	return v, true, false
}

// checkout returns m's version for a worker: recorded by its event, or parsed here
// when the worker read the lister before the event reached a handler (client-go
// updates the store first). A worker never records: the event that follows does.
func (t *versionTable) checkout(m metav1.Object) objectVersion {
	if v, ok := t.lookup(m); ok {
		return v
	}
	return t.parse(m)
}

func (t *versionTable) lookup(m metav1.Object) (objectVersion, bool) {
	v, _, ok := t.lookupEntry(m)
	return v, ok
}

// lookupEntry returns m's version if it is the uid's recorded one, and its
// versionEntry.redelivers.
func (t *versionTable) lookupEntry(m metav1.Object) (v objectVersion, redelivers, ok bool) {
	uid := m.GetUID()
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.byUID[uid]
	if !ok || e.v.resourceVersion != m.GetResourceVersion() {
		return objectVersion{}, false, false
	}
	return e.v, e.redelivers, true
}

func (t *versionTable) parse(m metav1.Object) objectVersion {
	v := objectVersion{uid: m.GetUID(), resourceVersion: m.GetResourceVersion()}
	ann := m.GetAnnotations()
	var value string
	if value, v.hasTrigger = ann[t.triggerK]; v.hasTrigger {
		v.trigger, v.triggerErr = seen.ParseTrigger(value)
	}
	// Precedence: the KEP-5915 key, when present and non-empty, names the
	// writer's context; else the configured key. A writer that sets both writes
	// one context; one that follows KEP-5915 is the newer convention. The value
	// is not parsed here: an invalid one is counted by telemetry, once per
	// reported trigger of this version, never masked by the other key.
	if v.traceParent = ann[TracingTraceParentAnnotation]; v.traceParent == "" {
		v.traceParent = ann[t.traceK]
	}
	v.local = selectsPodOn(m, t.nodeIP)
	v.localWork = v.local
	return v
}

// selectsPodOn reports whether the object selects a pod whose hostIP is nodeIP, or
// may: a chunk of a policy with rules and no pods (the controller splits large
// policies) applies to the pods its sibling chunks select, which the handler does not
// see; whether it changed anything here is left to the commit, as before. Endpoints
// that do not parse are not this node's (the worker rejects the object).
func selectsPodOn(m metav1.Object, nodeIP netip.Addr) bool {
	var eps []v1alpha1.PodEndpoint
	var policyRef string
	switch o := m.(type) {
	case *v1alpha1.PolicyEndpoint:
		eps, policyRef = o.Spec.PodSelectorEndpoints, o.Spec.PolicyRef.Name
	case *v1alpha1.ClusterPolicyEndpoint:
		eps, policyRef = o.Spec.PodSelectorEndpoints, o.Spec.PolicyRef.Name
	}
	if len(eps) == 0 && policyRef != "" {
		return true
	}
	return slices.ContainsFunc(eps, func(ep v1alpha1.PodEndpoint) bool {
		host, err := netip.ParseAddr(string(ep.HostIP))
		return err == nil && host.Unmap() == nodeIP
	})
}

// forget drops uid's entry.
func (t *versionTable) forget(uid types.UID) {
	t.mu.Lock()
	delete(t.byUID, uid)
	t.mu.Unlock()
	t.history.Forget(string(uid))
}

// firstMissing reports whether no version of uid without the trigger annotation
// was logged yet, and marks it logged.
func (t *versionTable) firstMissing(uid types.UID) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.byUID[uid]
	if !ok || e.missingLogged {
		return false
	}
	e.missingLogged = true
	return true
}

// observed records the seen-set's answer to the first observation of version v's
// trigger in this process (see versionEntry.redelivers).
func (t *versionTable) observed(v objectVersion, answer report.Reason) {
	if answer != report.Accepted && answer != report.Redelivered && answer != report.BeforeStart {
		return
	}
	t.mu.Lock()
	if e, ok := t.byUID[v.uid]; ok && e.v.resourceVersion == v.resourceVersion && !e.olderMax.After(v.trigger) {
		e.redelivers = true
	}
	t.mu.Unlock()
}

// relistAnswer is markRelist's answer.
type relistAnswer uint8

const (
	relistUnknown relistAnswer = iota // not the uid's recorded version: ask the store
	relistFirst                       // the recorded version, first re-delivered in this relist: marked
	relistAgain                       // this relist marked it already (a list retried)
)

// markRelist marks m, if it is the uid's recorded version, as re-delivered by relist
// list, and returns the version and whether the seen-set's answer to its trigger is
// known to be redelivered. One lookup: the relist path's only one when it hits.
func (t *versionTable) markRelist(m metav1.Object, list int64) (v objectVersion, redelivers bool, mark relistAnswer) {
	uid := m.GetUID()
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.byUID[uid]
	if !ok || e.v.resourceVersion != m.GetResourceVersion() {
		return objectVersion{}, false, relistUnknown
	}
	if e.relist == list {
		return e.v, e.redelivers, relistAgain
	}
	e.relist, e.relistConsumed = list, false
	return e.v, e.redelivers, relistFirst
}

// consumeRelist reports whether a same-resourceVersion update is a re-delivery relist
// list marked and the handler has not seen yet.
func (t *versionTable) consumeRelist(uid types.UID, rv string, list int64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.byUID[uid]
	if !ok || e.v.resourceVersion != rv || e.relist != list || list == 0 || e.relistConsumed {
		return false
	}
	e.relistConsumed = true
	return true
}

// deletedUIDs holds, per key, the uids delete events removed until the worker
// syncs the key and forgets them in the seen-set. The delete handler only records
// (O(1)); forgetting is the worker's, which the workqueue serialises per key, so a
// commit of the object cannot race its Forget.
type deletedUIDs struct {
	mu    sync.Mutex
	byKey map[translate.Key][]types.UID
}

func (d *deletedUIDs) add(key translate.Key, uid types.UID) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.byKey == nil {
		d.byKey = map[translate.Key][]types.UID{}
	}
	d.byKey[key] = append(d.byKey[key], uid)
}

// take removes and returns the key's deleted uids.
func (d *deletedUIDs) take(key translate.Key) []types.UID {
	d.mu.Lock()
	defer d.mu.Unlock()
	uids := d.byKey[key]
	delete(d.byKey, key)
	return uids
}
