package reconcile

import (
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/translate"
)

// A read-only view of the loop for an operator ("is my policy applied here? why was
// it slow?"): ExplainObject and ExplainPod. Most of it is read when asked (the
// informer caches, the pod table, the seen-set); what is gone by then is recorded
// as it happens, per object uid, in a small bounded history (explainLog): each
// version the events brought, with its trigger and receipt, and the outcome of its
// last sync (recorded by the worker); and the last reports with their phases
// (recorded as they pass to the Sink). The history is dropped with the uid, so it
// stays O(live objects).

// History bounds per object uid.
const (
	explainVersions = 8 // versions kept, newest last
	explainReports  = 4 // reports kept, newest last
	explainAttempts = 8 // attempts kept per report: the newest, the successful one last
)

// Object states, ObjectExplain.State.
const (
	// StateProgrammed: this node's dataplane holds the object's current version
	// for every local pod it applies to.
	StateProgrammed = "programmed"
	// StateNoLocalWork: the current version was synced and has nothing on this
	// node (no local pod, none removed).
	StateNoLocalWork = "no-local-work"
	// StateNotSynced: no worker has synced the current version yet.
	StateNotSynced = "not-synced"
	// StateWaiting: some local pods' interfaces are not there yet; retried.
	StateWaiting = "waiting-for-interfaces"
	// StateFailed: a commit failed; retried with backoff.
	StateFailed = "failed"
	// StateRejected: the current version is invalid and not programmed; the last
	// valid version stays in force for its pods.
	StateRejected = "rejected"
	// StateNotFound: no such object in the informer cache.
	StateNotFound = "not-found"
)

// Outcomes of a version's sync, VersionInfo.Outcome: StateProgrammed,
// StateNoLocalWork, StateWaiting, StateFailed or StateRejected; "" until a worker
// synced it.

// VersionInfo is one version of an object that reached this node.
type VersionInfo struct {
	ResourceVersion string    `json:"resourceVersion"`
	Trigger         time.Time `json:"trigger,omitzero"`  // the trigger annotation; zero if absent or invalid
	Received        time.Time `json:"received,omitzero"` // first event bringing it; zero if a worker read it first
	// Outcome is how its last sync ended; "" if not synced yet.
	Outcome  string    `json:"outcome,omitempty"`
	SyncedAt time.Time `json:"syncedAt,omitzero"`
	// Pods is how many local pods the last sync committed or removed.
	Pods int `json:"pods,omitempty"`
	// Detail is the error, or the pods waiting for an interface.
	Detail string `json:"detail,omitempty"`
	// LocalWork is what the loop recorded when the version's event arrived, and
	// decides whether its trigger is reported here: it selects a pod on this node,
	// or the object's previous version did. Absent if a worker read it first.
	LocalWork *bool `json:"localWork,omitempty"`
}

// HasLocalWork reports whether the version had work on this node: as recorded at
// event time (LocalWork) — a version coalesced into a later sync has it too — or,
// for a version no event brought, as far as its sync found out.
func (v *VersionInfo) HasLocalWork() bool {
	if v.LocalWork != nil {
		return *v.LocalWork
	}
	return v.Outcome != "" && v.Outcome != StateNoLocalWork && v.Outcome != StateRejected
}

// AttemptInfo is one commit attempt. Durations are time.Duration (nanoseconds in
// JSON).
type AttemptInfo struct {
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	// Programmed is when the attempt's last switch made its policy the one packets
	// see (End when none was recorded): a successful attempt's latency ends here.
	Programmed time.Time     `json:"programmed"`
	LockWait   time.Duration `json:"lockWait"`
	Duration   time.Duration `json:"duration"` // under the lock: merge and dataplane calls
	Phases     report.Phases `json:"phases"`
	Err        string        `json:"error,omitempty"`
}

func attemptInfo(a *report.Attempt) AttemptInfo {
	return AttemptInfo{Start: a.Start, End: a.End, Programmed: a.ProgrammedAt(), LockWait: a.LockWait(), Duration: a.Duration(), Phases: a.Phases, Err: a.Err}
}

// ReportInfo is one reported trigger, as it was handed to the Sink.
type ReportInfo struct {
	UID             string        `json:"uid"`
	ResourceVersion string        `json:"resourceVersion"`
	Trigger         time.Time     `json:"trigger"`
	Committed       time.Time     `json:"committed"`
	Latency         time.Duration `json:"latency"`
	// Delivery (trigger → event received), Queue (received → worker start) and
	// Compute (the object's own compile): zero when not measured (the commit
	// that programmed it ran ahead of its event).
	Delivery time.Duration `json:"delivery"`
	Queue    time.Duration `json:"queue"`
	Compute  time.Duration `json:"compute"`
	// Attempts are the newest attempts, oldest first, the successful one last;
	// AttemptCount counts them all.
	Attempts     []AttemptInfo `json:"attempts"`
	AttemptCount int           `json:"attemptCount"`
	Pods         int           `json:"pods"`
	Entries      int           `json:"entries"`
	// WriterTraceID: see ObjectExplain.WriterTraceID.
	WriterTraceID string `json:"writerTraceID,omitempty"`
}

func reportInfo(r *report.Record) ReportInfo {
	ri := ReportInfo{
		UID: r.UID, ResourceVersion: r.ResourceVersion, Trigger: r.Trigger,
		Committed: r.Committed(), Latency: r.Latency(),
		Delivery:     span(r.Trigger, r.Received),
		Queue:        span(r.Received, r.WorkerStart),
		Compute:      span(r.ComputeStart, r.ComputeEnd),
		AttemptCount: len(r.Attempts),
		Pods:         r.Pods, Entries: r.Entries,
		WriterTraceID: traceID(r.TraceParent),
	}
	kept := r.Attempts[max(len(r.Attempts)-explainAttempts, 0):]
	ri.Attempts = make([]AttemptInfo, len(kept))
	for i := range kept {
		ri.Attempts[i] = attemptInfo(&kept[i])
	}
	return ri
}

// span is end − start, 0 when either is unknown.
func span(start, end time.Time) time.Duration {
	if start.IsZero() || end.IsZero() {
		return 0
	}
	return end.Sub(start)
}

// traceID returns the trace id of a W3C traceparent ("00-<trace id>-<span id>-<flags>"),
// "" when it is not one.
func traceID(traceparent string) string {
	parts := strings.Split(traceparent, "-")
	if len(parts) < 4 || len(parts[1]) != 32 || strings.Trim(parts[1], "0123456789abcdef") != "" || strings.Trim(parts[1], "0") == "" {
		return ""
	}
	return parts[1]
}

// explainLog is the per-uid history. Its methods are safe on a nil log (they do
// nothing), for tests that build parts of the loop alone.
type explainLog struct {
	mu    sync.Mutex
	byUID map[types.UID]*objectHistory
}

type objectHistory struct {
	versions []VersionInfo
	reports  []ReportInfo
}

func (l *explainLog) get(uid types.UID) *objectHistory {
	if l.byUID == nil {
		l.byUID = map[types.UID]*objectHistory{}
	}
	h := l.byUID[uid]
	if h == nil {
		h = &objectHistory{}
		l.byUID[uid] = h
	}
	return h
}

// version returns the entry of rv, adding it (the oldest dropped beyond the bound).
func (h *objectHistory) version(rv string) *VersionInfo {
	for i := range h.versions {
		if h.versions[i].ResourceVersion == rv {
			return &h.versions[i]
		}
	}
	if len(h.versions) == explainVersions {
		h.versions = slices.Delete(h.versions, 0, 1)
	}
	h.versions = append(h.versions, VersionInfo{ResourceVersion: rv})
	return &h.versions[len(h.versions)-1]
}

// received records a version the first time an event brings it, at event time.
func (l *explainLog) received(v objectVersion, at time.Time) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.get(v.uid).version(v.resourceVersion)
	e.Trigger, e.Received = v.trigger, at
	localWork := v.localWork
	e.LocalWork = &localWork
}

// synced records how a worker's sync of version v ended: res is its commit, and
// invalid the reason the version was rejected (nil if valid).
func (l *explainLog) synced(v objectVersion, res *commitResult, invalid error) {
	if l == nil {
		return
	}
	e := VersionInfo{Pods: res.pods, SyncedAt: res.attempt.End}
	if e.SyncedAt.IsZero() {
		e.SyncedAt = res.attempt.Start // nothing committed: the lock was taken and left
	}
	switch {
	case invalid != nil:
		e.Outcome, e.Detail = StateRejected, invalid.Error()
	case res.err != nil:
		e.Outcome, e.Detail = StateFailed, res.err.Error()
	case len(res.notDone) > 0:
		e.Outcome, e.Detail = StateWaiting, podList(res.notDone)
		if res.resolveErr != nil {
			e.Detail += ": " + res.resolveErr.Error()
		}
	case res.noLocalWork || res.pods == 0:
		e.Outcome = StateNoLocalWork
	default:
		e.Outcome = StateProgrammed
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	ve := l.get(v.uid).version(v.resourceVersion)
	if ve.Trigger.IsZero() {
		ve.Trigger = v.trigger
	}
	ve.Outcome, ve.Detail, ve.Pods, ve.SyncedAt = e.Outcome, e.Detail, e.Pods, e.SyncedAt
}

func podList(pods []netip.Addr) string {
	s := make([]string, len(pods))
	for i, p := range pods {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

// reported records a report as it goes to the Sink.
func (l *explainLog) reported(r *report.Record) {
	if l == nil || len(r.Attempts) == 0 {
		return
	}
	ri := reportInfo(r)
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.get(types.UID(r.UID))
	if len(h.reports) == explainReports {
		h.reports = slices.Delete(h.reports, 0, 1)
	}
	h.reports = append(h.reports, ri)
}

// forget drops uid's history.
func (l *explainLog) forget(uid types.UID) {
	if l == nil {
		return
	}
	l.mu.Lock()
	delete(l.byUID, uid)
	l.mu.Unlock()
}

// snapshot copies uid's history.
func (l *explainLog) snapshot(uid types.UID) (versions []VersionInfo, reports []ReportInfo) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.byUID[uid]
	if h == nil {
		return nil, nil
	}
	return slices.Clone(h.versions), slices.Clone(h.reports)
}

// refine adds what the last sync of version rv found to state, which the pod
// table gave: programmed may be no-local-work, failed may be waiting for
// interfaces; failed and rejected get their detail.
func (l *explainLog) refine(uid types.UID, rv, state string) (string, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.byUID[uid]
	if h == nil {
		return state, ""
	}
	for _, ve := range h.versions {
		if ve.ResourceVersion != rv || ve.Outcome == "" {
			continue
		}
		switch {
		case state == StateProgrammed && ve.Outcome == StateNoLocalWork:
			return StateNoLocalWork, ""
		case state == StateFailed && ve.Outcome == StateWaiting:
			return StateWaiting, ve.Detail
		case state == StateFailed || state == StateRejected:
			return state, ve.Detail
		}
	}
	return state, ""
}

// explainSink records each report in the history, then passes everything on.
type explainSink struct {
	next report.Sink
	log  *explainLog
}

func (s explainSink) Report(r *report.Record) {
	s.log.reported(r) // before: the Sink owns r once it has it
	s.next.Report(r)
}

func (s explainSink) Committed(k report.Kind, a *report.Attempt) { s.next.Committed(k, a) }

var _ report.Sink = explainSink{}

// PendingInfo is one trigger pending a commit on this node.
type PendingInfo struct {
	Trigger  time.Time `json:"trigger"`
	Received time.Time `json:"received"`
	// Age is how long ago it was stamped (its latency so far); Waiting how long
	// ago this node received it.
	Age     time.Duration `json:"age"`
	Waiting time.Duration `json:"waiting"`
	// Failures counts the failed commits since it was accepted.
	Failures int `json:"failures"`
	// ProgrammedAt: an earlier commit already held it (the lister ran ahead of
	// its event); it is reported at the next commit.
	ProgrammedAt time.Time `json:"programmedAt,omitzero"`
}

// ObjectExplain is what this node knows of one PolicyEndpoint or
// ClusterPolicyEndpoint.
type ObjectExplain struct {
	Node      string    `json:"node"`
	At        time.Time `json:"at"` // when the snapshot was taken; ages are relative to it
	Kind      string    `json:"kind"`
	Namespace string    `json:"namespace,omitempty"`
	Name      string    `json:"name"`
	// The current version in the informer cache.
	UID             string    `json:"uid,omitempty"`
	ResourceVersion string    `json:"resourceVersion,omitempty"`
	PolicyRef       string    `json:"policyRef,omitempty"`
	Trigger         time.Time `json:"trigger,omitzero"`
	// WriterTraceID is the trace id of the version's traceparent annotation (the
	// writer's trace): the trace npagent's root span links to (or, parented,
	// joins). "" when the version carries none. npagent's own trace id is drawn
	// by telemetry after the report and is not known here; in a tracing backend,
	// its root policy.program carries npagent.policy.uid and
	// npagent.policy.resource_version.
	WriterTraceID string `json:"writerTraceID,omitempty"`
	// State is one of the State constants; Programmed is true for
	// StateProgrammed and StateNoLocalWork (nothing left to do on this node).
	State      string `json:"state"`
	Programmed bool   `json:"programmed"`
	Detail     string `json:"detail,omitempty"`
	// LocalPods are the pods on this node the current version lists.
	LocalPods []string `json:"localPods,omitempty"`
	// Versions seen on this node, oldest first (the newest few).
	Versions []VersionInfo `json:"versions,omitempty"`
	// Consumed is the newest trigger reported or deliberately suppressed.
	Consumed time.Time     `json:"consumed,omitzero"`
	Pending  []PendingInfo `json:"pending,omitempty"`
	// FailedAttempts are the failed commits since the last success (with the
	// pending triggers they delay).
	FailedAttempts []AttemptInfo `json:"failedAttempts,omitempty"`
	// Reports are the last reported triggers, oldest first.
	Reports []ReportInfo `json:"reports,omitempty"`
}

// ExplainObject returns what this node knows of the object kind namespace/name
// (namespace "" for a ClusterPolicyEndpoint).
func (c *Controller) ExplainObject(kind report.Kind, namespace, name string) ObjectExplain {
	key := translate.Key{Kind: kind, Namespace: namespace, Name: name}
	out := ObjectExplain{Node: c.cfg.NodeName, At: time.Now(), Kind: kind.String(), Namespace: namespace, Name: name}
	cur, ok := c.current(key)
	if !ok {
		out.State = StateNotFound
		return out
	}
	out.UID, out.ResourceVersion, out.PolicyRef = string(cur.uid), cur.rv, cur.policyRef
	v := c.versions.checkout(cur.meta)
	out.Trigger, out.WriterTraceID = v.trigger, traceID(v.traceParent)
	for _, p := range cur.endpoints {
		if ip, ok := c.localPod(p); ok {
			out.LocalPods = append(out.LocalPods, ip.String())
		}
	}
	out.Versions, out.Reports = c.explain.snapshot(cur.uid)
	out.State = c.pods.stateOf(key, cur.uid, cur.rv, netip.Addr{})
	out.State, out.Detail = c.explain.refine(cur.uid, cur.rv, out.State)
	out.Programmed = out.State == StateProgrammed || out.State == StateNoLocalWork
	if e, ok := c.cfg.Seen.Inspect(string(cur.uid)); ok {
		out.Consumed = e.Consumed
		for _, p := range e.Pending {
			out.Pending = append(out.Pending, PendingInfo{
				Trigger: p.Trigger, Received: p.ReceivedAt, Age: out.At.Sub(p.Trigger), Waiting: out.At.Sub(p.ReceivedAt),
				Failures: p.Failures, ProgrammedAt: p.ProgrammedAt,
			})
		}
		for i := range e.Failed {
			out.FailedAttempts = append(out.FailedAttempts, attemptInfo(&e.Failed[i]))
		}
	}
	return out
}

// currentObject is what the informer cache holds for a key, read-only.
type currentObject struct {
	key       translate.Key
	meta      metav1.Object
	uid       types.UID
	rv        string
	policyRef string
	endpoints []v1alpha1.PodEndpoint
}

func currentOf(kind report.Kind, obj any) (currentObject, bool) {
	switch o := obj.(type) {
	case *v1alpha1.PolicyEndpoint:
		return currentObject{key: translate.Key{Kind: kind, Namespace: o.Namespace, Name: o.Name}, meta: o, uid: o.UID, rv: o.ResourceVersion,
			policyRef: o.Spec.PolicyRef.Name, endpoints: o.Spec.PodSelectorEndpoints}, true
	case *v1alpha1.ClusterPolicyEndpoint:
		return currentObject{key: translate.Key{Kind: kind, Name: o.Name}, meta: o, uid: o.UID, rv: o.ResourceVersion,
			policyRef: o.Spec.PolicyRef.Name, endpoints: o.Spec.PodSelectorEndpoints}, true
	}
	return currentObject{}, false
}

// current reads key's object from the informer cache.
func (c *Controller) current(key translate.Key) (currentObject, bool) {
	obj, exists, err := c.informers[key.Kind].GetIndexer().GetByKey(key.StoreKey())
	if err != nil || !exists {
		return currentObject{}, false
	}
	return currentOf(key.Kind, obj)
}

// localPod returns the endpoint's pod IP when the pod is on this node.
func (c *Controller) localPod(p v1alpha1.PodEndpoint) (netip.Addr, bool) {
	host, err := netip.ParseAddr(string(p.HostIP))
	if err != nil || host.Unmap() != c.cfg.NodeIP {
		return netip.Addr{}, false
	}
	ip, err := netip.ParseAddr(string(p.PodIP))
	return ip.Unmap(), err == nil
}

// stateOf tells, from the table alone, whether the key's version rv (of uid) is
// in force: StateProgrammed, StateNotSynced, StateRejected, or StateFailed when a
// commit is incomplete (failed, or waiting for interfaces: the caller tells them
// apart). With pod valid, only that pod's part counts: an object whose other pods
// still wait is programmed for this one.
func (t *podTable) stateOf(key translate.Key, uid types.UID, rv string, pod netip.Addr) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.objects[key]
	switch {
	case st == nil || st.uid != uid:
		return StateNotSynced
	case st.compiled == nil || st.compiled.ResourceVersion != rv:
		if st.rejectedRV == rv {
			return StateRejected
		}
		return StateNotSynced
	case pod.IsValid() && slices.Contains(st.dirty, pod), !pod.IsValid() && len(st.dirty) > 0:
		return StateFailed
	}
	return StateProgrammed
}

// PodQuery names a pod by namespace and name, or by IP (IP wins when set).
type PodQuery struct {
	Namespace, Name string
	IP              netip.Addr
}

// PodObject is one object whose rules apply to a pod.
type PodObject struct {
	Kind            string `json:"kind"`
	Namespace       string `json:"namespace,omitempty"`
	Name            string `json:"name"`
	UID             string `json:"uid,omitempty"`
	ResourceVersion string `json:"resourceVersion,omitempty"`
	PolicyRef       string `json:"policyRef,omitempty"`
	// Lists: its current version lists the pod. False for another chunk of the
	// same policy (its rules apply to the pod too), or for an object whose
	// programmed version listed the pod and whose current one does not (or
	// that was deleted): the pod's state changes when that is committed.
	Lists bool `json:"lists"`
	// State is the object's state for this pod (see ObjectExplain.State);
	// Programmed: this node's dataplane holds its current version for the pod
	// (for a deleted object: its removal).
	State      string `json:"state"`
	Programmed bool   `json:"programmed"`
}

// PodExplain is what this node knows of one pod's policy.
type PodExplain struct {
	Node      string    `json:"node"`
	At        time.Time `json:"at"`
	Namespace string    `json:"namespace,omitempty"`
	Name      string    `json:"name,omitempty"`
	IP        string    `json:"ip,omitempty"`
	// HostIP is the node the objects place the pod on; OnNode is true when that
	// is this node (or when no object lists the pod).
	HostIP string `json:"hostIP,omitempty"`
	OnNode bool   `json:"onNode"`
	// Synced: the informer caches hold every object (until then a pod no object
	// lists yet may be one whose objects have not been listed).
	Synced bool `json:"synced"`
	// Ifindex is the interface holding the pod's committed state; 0 if none.
	Ifindex int         `json:"ifindex,omitempty"`
	Objects []PodObject `json:"objects"`
	// Programmed: Synced, OnNode, and every object Programmed (true when no
	// object applies to the pod: nothing to enforce).
	Programmed bool `json:"programmed"`
	// StrictDenied: strict mode denies the pod (node traffic excepted) until a
	// policy selecting it is committed.
	StrictDenied bool `json:"strictDenied,omitempty"`
}

// ExplainPod returns the objects whose rules apply to a pod on this node, and
// whether each one's current version is programmed for it. It reads the informer
// caches (a scan of every object: O(objects × pods), for an operator or a wait
// polling a few times a second, not for a hot path) and holds the pod table's
// lock only to copy a few fields per object.
func (c *Controller) ExplainPod(q PodQuery) PodExplain {
	out := PodExplain{Node: c.cfg.NodeName, At: time.Now(), Namespace: q.Namespace, Name: q.Name, Synced: c.HasSynced(), Objects: []PodObject{}}
	var all []currentObject
	for kind, inf := range c.informers {
		for _, obj := range inf.GetStore().List() {
			if cur, ok := currentOf(report.Kind(kind), obj); ok {
				all = append(all, cur)
			}
		}
	}
	ip := q.IP.Unmap()
	var hosts []string
	match := func(p v1alpha1.PodEndpoint) bool {
		if q.IP.IsValid() {
			pip, err := netip.ParseAddr(string(p.PodIP))
			return err == nil && pip.Unmap() == ip
		}
		return p.Name == q.Name && p.Namespace == q.Namespace
	}
	// Pass 1: the objects listing the pod, and the pod's IP when named.
	lists := map[translate.Key]bool{}
	for _, cur := range all {
		for _, p := range cur.endpoints {
			if !match(p) {
				continue
			}
			lists[cur.key] = true
			if !ip.IsValid() {
				if pip, err := netip.ParseAddr(string(p.PodIP)); err == nil {
					ip = pip.Unmap()
				}
			}
			if out.Namespace == "" {
				out.Namespace, out.Name = p.Namespace, p.Name
			}
			if !slices.Contains(hosts, string(p.HostIP)) {
				hosts = append(hosts, string(p.HostIP))
			}
		}
	}
	if !ip.IsValid() && c.podWatch != nil && q.Name != "" {
		// Strict mode: a pod no object lists yet is known from the pod watch.
		if obj, ok, _ := c.podWatch.informer.GetStore().GetByKey(q.Namespace + "/" + q.Name); ok {
			if _, addrs, ok := podAddrs(obj); ok && len(addrs) > 0 {
				ip = addrs[0]
			}
		}
	}
	if ip.IsValid() {
		out.IP = ip.String()
		out.StrictDenied = c.pods.strictlyDenied(ip)
	}
	out.OnNode = len(hosts) == 0
	for _, h := range hosts {
		if hip, err := netip.ParseAddr(h); err == nil && hip.Unmap() == c.cfg.NodeIP {
			out.OnNode, out.HostIP = true, h
		}
	}
	if !out.OnNode {
		out.HostIP = strings.Join(hosts, ",")
	}
	// Pass 2: every chunk of the policies of those objects applies too.
	policies := map[translate.PolicyKey]bool{}
	for _, cur := range all {
		if lists[cur.key] {
			if pk := translate.PolicyOf(cur.key.Kind, cur.key.Namespace, cur.policyRef); pk != (translate.PolicyKey{}) {
				policies[pk] = true
			}
		}
	}
	byKey := map[translate.Key]currentObject{}
	for _, cur := range all {
		if lists[cur.key] || policies[translate.PolicyOf(cur.key.Kind, cur.key.Namespace, cur.policyRef)] {
			byKey[cur.key] = cur
		}
	}
	// And what the table merged for the pod last: an object that listed it then
	// must commit its change (or its deletion) before the pod is current.
	var merged []translate.Key
	if ip.IsValid() {
		merged, out.Ifindex = c.pods.mergedFor(ip)
	}
	for _, k := range merged {
		if _, ok := byKey[k]; !ok {
			cur, ok := c.current(k)
			if !ok {
				cur = currentObject{key: k} // deleted: its removal is what is pending
			}
			byKey[k] = cur
		}
	}
	keys := make([]translate.Key, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, translate.Key.Compare)
	out.Programmed = out.Synced && out.OnNode
	for _, k := range keys {
		cur := byKey[k]
		po := PodObject{Kind: k.Kind.String(), Namespace: k.Namespace, Name: k.Name, UID: string(cur.uid),
			ResourceVersion: cur.rv, PolicyRef: cur.policyRef, Lists: lists[k]}
		if cur.uid == "" {
			po.State = StateNotFound
			po.Programmed = !c.pods.holds(k)
		} else {
			po.State, _ = c.explain.refine(cur.uid, cur.rv, c.pods.stateOf(k, cur.uid, cur.rv, ip))
			po.Programmed = po.State == StateProgrammed || po.State == StateNoLocalWork
		}
		out.Programmed = out.Programmed && po.Programmed
		out.Objects = append(out.Objects, po)
	}
	return out
}

// mergedFor returns the keys whose versions the pod's last merge would read (the
// objects indexed as listing it, and their chunks), and the ifindex holding its
// committed state (0 if none).
func (t *podTable) mergedFor(pod netip.Addr) ([]translate.Key, int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var keys []translate.Key
	for _, c := range t.objectsFor(pod, nil) {
		keys = append(keys, c.Key)
	}
	return keys, t.programmed[pod]
}

// holds reports whether the table still tracks key (a deletion not yet committed).
func (t *podTable) holds(key translate.Key) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.objects[key] != nil
}
