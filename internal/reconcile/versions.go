package reconcile

import (
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/npagent/npagent/internal/seen"
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
}

// versionTable records each object version's parsed annotations the first time an
// event brings it (kube-proxy's habit: record at event time), so re-deliveries and the
// worker check it out instead of parsing the annotation again. It holds the newest
// version per uid: O(objects). The worker drops a uid when it forgets the object.
type versionTable struct {
	mu       sync.Mutex
	byUID    map[types.UID]objectVersion
	triggerK string      // the trigger annotation's key
	traceK   string      // the configured traceparent annotation's key, read after TracingTraceParentAnnotation
	history  *explainLog // each new version is added to it; forget drops the uid's
}

func (t *versionTable) init(triggerKey, traceParentKey string) {
	t.byUID = map[types.UID]objectVersion{}
	t.triggerK, t.traceK = triggerKey, traceParentKey
}

// record returns m's version for an event handler, parsing the annotations only if
// this version is new to the table (the first event that brings it: fresh) and
// recording it. Handlers of one informer run one at a time and in order, so the
// table holds each uid's newest version. A re-delivery allocates nothing.
func (t *versionTable) record(m metav1.Object) (v objectVersion, fresh bool) {
	if v, ok := t.lookup(m); ok {
		return v, false
	}
	v = t.parse(m)
	t.mu.Lock()
	t.byUID[v.uid] = v
	t.mu.Unlock()
	t.history.received(v, time.Now())
	return v, true
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
	uid := m.GetUID()
	t.mu.Lock()
	v, ok := t.byUID[uid]
	t.mu.Unlock()
	return v, ok && v.resourceVersion == m.GetResourceVersion()
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
	return v
}

// forget drops uid's entry.
func (t *versionTable) forget(uid types.UID) {
	t.mu.Lock()
	delete(t.byUID, uid)
	t.mu.Unlock()
	t.history.forget(uid)
}

// deletedUIDs holds, per key, the uids delete events removed until the worker
// syncs the key and forgets them in the seen-set. The delete handler only records
// (O(1)); forgetting is the worker's, which the workqueue serialises per key, so a
// commit of the object cannot race its Forget.
type deletedUIDs struct {
	mu    sync.Mutex
	byKey map[objectKey][]types.UID
}

func (d *deletedUIDs) add(key objectKey, uid types.UID) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.byKey == nil {
		d.byKey = map[objectKey][]types.UID{}
	}
	d.byKey[key] = append(d.byKey[key], uid)
}

// take removes and returns the key's deleted uids.
func (d *deletedUIDs) take(key objectKey) []types.UID {
	d.mu.Lock()
	defer d.mu.Unlock()
	uids := d.byKey[key]
	delete(d.byKey, key)
	return uids
}
