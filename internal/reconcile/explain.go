package reconcile

import (
	"net/netip"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/explain"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/translate"
)

// A read-only view of the loop for an operator ("is my policy applied here? why was
// it slow?"): ExplainObject and ExplainPod, in internal/explain's wire types. Most of
// it is read when asked (the informer caches, the pod table, the seen-set); what is
// gone by then is recorded as it happens in an explain.History (Controller.explain):
// versions at event time (versionTable), each sync's outcome (syncOutcome, by the
// worker), reports as they pass to the Sink.

// syncOutcome is how a worker's sync of a version ended, for the history: res is its
// commit, and invalid the reason the version was rejected (nil if valid).
func syncOutcome(res *commitResult, invalid error) explain.Sync {
	e := explain.Sync{Pods: res.pods, SyncedAt: res.attempt.End}
	if e.SyncedAt.IsZero() {
		e.SyncedAt = res.attempt.Start // nothing committed: the lock was taken and left
	}
	switch {
	case invalid != nil:
		e.Outcome, e.Detail = explain.StateRejected, invalid.Error()
	case res.err != nil:
		e.Outcome, e.Detail = explain.StateFailed, res.err.Error()
	case len(res.notDone) > 0:
		e.Outcome, e.Detail = explain.StateWaiting, podList(res.notDone)
		if res.resolveErr != nil {
			e.Detail += ": " + res.resolveErr.Error()
		}
	case res.noLocalWork || res.pods == 0:
		e.Outcome = explain.StateNoLocalWork
	default:
		e.Outcome = explain.StateProgrammed
	}
	return e
}

// synced records in the history how a worker's sync of version v ended (see
// syncOutcome).
func (c *Controller) synced(v objectVersion, res *commitResult, invalid error) {
	c.explain.Synced(string(v.uid), v.resourceVersion, v.trigger, syncOutcome(res, invalid))
}

func podList(pods []netip.Addr) string {
	s := make([]string, len(pods))
	for i, p := range pods {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

// ExplainObject returns what this node knows of the object kind namespace/name
// (namespace "" for a ClusterPolicyEndpoint).
func (c *Controller) ExplainObject(kind report.Kind, namespace, name string) explain.ObjectExplain {
	key := translate.Key{Kind: kind, Namespace: namespace, Name: name}
	out := explain.ObjectExplain{Node: c.cfg.NodeName, At: time.Now(), Kind: kind.String(), Namespace: namespace, Name: name}
	cur, ok := c.current(key)
	if !ok {
		out.State = explain.StateNotFound
		return out
	}
	out.UID, out.ResourceVersion, out.PolicyRef = string(cur.uid), cur.rv, cur.policyRef
	v := c.versions.checkout(cur.meta)
	out.Trigger, out.WriterTraceID = v.trigger, explain.TraceID(v.traceParent)
	if !v.hasTrigger {
		out.Notes = append(out.Notes, "no "+c.cfg.TriggerAnnotation+" annotation: this version's programming latency is not measured; "+triggerMissingHint)
	}
	for _, p := range cur.endpoints {
		if ip, ok := c.localPod(p); ok {
			out.LocalPods = append(out.LocalPods, ip.String())
		}
	}
	out.State = c.pods.stateOf(key, cur.uid, cur.rv, netip.Addr{})
	out.State, out.Detail = c.explain.Refine(string(cur.uid), cur.rv, out.State)
	// The table, then the history: a worker records a sync's outcome in the history
	// before it releases the table (commitVersion's settled), so both reads see at
	// least that sync; a snapshot taken first could lack the outcome the state was
	// refined from (waiting, say, beside a version with none).
	out.Versions, out.Reports = c.explain.Snapshot(string(cur.uid))
	out.Programmed = out.State == explain.StateProgrammed || out.State == explain.StateNoLocalWork
	if e, ok := c.cfg.Seen.Inspect(string(cur.uid)); ok {
		out.Consumed = e.Consumed
		for _, p := range e.Pending {
			out.Pending = append(out.Pending, explain.PendingInfo{
				Trigger: p.Trigger, Received: p.ReceivedAt, Age: out.At.Sub(p.Trigger), Waiting: out.At.Sub(p.ReceivedAt),
				Failures: p.Failures, ProgrammedAt: p.ProgrammedAt,
			})
		}
		for i := range e.Failed {
			out.FailedAttempts = append(out.FailedAttempts, explain.AttemptOf(&e.Failed[i]))
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
// in force: explain.StateProgrammed, explain.StateNotSynced, explain.StateRejected, or explain.StateFailed when a
// commit is incomplete (failed, or waiting for interfaces: the caller tells them
// apart). With pod valid, only that pod's part counts: an object whose other pods
// still wait is programmed for this one.
func (t *podTable) stateOf(key translate.Key, uid types.UID, rv string, pod netip.Addr) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.objects[key]
	switch {
	case st == nil || st.uid != uid:
		return explain.StateNotSynced
	case st.compiled == nil || st.compiled.ResourceVersion != rv:
		if st.rejectedRV == rv {
			return explain.StateRejected
		}
		return explain.StateNotSynced
	case pod.IsValid() && slices.Contains(st.dirty, pod), !pod.IsValid() && len(st.dirty) > 0:
		return explain.StateFailed
	}
	return explain.StateProgrammed
}

// ExplainPod returns the objects whose rules apply to a pod on this node, and
// whether each one's current version is programmed for it. It reads the informer
// caches (a scan of every object: O(objects × pods), for an operator or a wait
// polling a few times a second, not for a hot path) and holds the pod table's
// lock only to copy a few fields per object. Its phases: find the objects listing
// the pod (and its IP), place the pod (this node or another), add the other chunks
// of their policies and what the table merged for the pod last, then each object's
// state for it.
func (c *Controller) ExplainPod(q explain.PodQuery) explain.PodExplain {
	out := explain.PodExplain{Node: c.cfg.NodeName, At: time.Now(), Namespace: q.Namespace, Name: q.Name, Synced: c.HasSynced(), Objects: []explain.PodObject{}}
	all := c.currentObjects()
	lists, ip, hosts := findListing(all, q, &out)
	if !ip.IsValid() {
		ip = c.strictPodIP(q)
	}
	c.placePod(&out, ip, hosts)
	byKey := withChunks(all, lists)
	if ip.IsValid() {
		c.addMerged(byKey, ip, &out)
	}
	c.podObjects(&out, byKey, lists, ip)
	out.Window = c.podWindowOf(out.Namespace, out.Name)
	out.RecentDenials = c.recentFlows.Pod(out.Namespace, out.Name, ip)
	return out
}

// currentObjects is every object in the informer caches.
func (c *Controller) currentObjects() []currentObject {
	var all []currentObject
	for kind, inf := range c.informers {
		for _, obj := range inf.GetStore().List() {
			if cur, ok := currentOf(report.Kind(kind), obj); ok {
				all = append(all, cur)
			}
		}
	}
	return all
}

// findListing returns the objects listing the pod q names, its IP (q's, or the
// first the objects list for it) and the hosts they place it on; out gets its
// namespace and name when q named it by IP.
func findListing(all []currentObject, q explain.PodQuery, out *explain.PodExplain) (lists map[translate.Key]bool, ip netip.Addr, hosts []string) {
	ip = q.IP.Unmap()
	match := func(p v1alpha1.PodEndpoint) bool {
		if q.IP.IsValid() {
			pip, err := netip.ParseAddr(string(p.PodIP))
			return err == nil && pip.Unmap() == ip
		}
		return p.Name == q.Name && p.Namespace == q.Namespace
	}
	lists = map[translate.Key]bool{}
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
	return lists, ip, hosts
}

// strictPodIP is, in strict mode, the IP of a pod no object lists yet, known from
// the pod watch; invalid otherwise.
func (c *Controller) strictPodIP(q explain.PodQuery) netip.Addr {
	if c.podWatch == nil || q.Name == "" {
		return netip.Addr{}
	}
	if obj, ok, _ := c.podWatch.informer.GetStore().GetByKey(q.Namespace + "/" + q.Name); ok {
		if _, addrs, ok := podAddrs(obj); ok && len(addrs) > 0 {
			return addrs[0]
		}
	}
	return netip.Addr{}
}

// placePod sets the pod's IP, whether strict mode denies it, and whether the
// objects place it on this node (true when none lists it).
func (c *Controller) placePod(out *explain.PodExplain, ip netip.Addr, hosts []string) {
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
}

// withChunks returns the objects listing the pod and every chunk of their
// policies: the pod merges those too.
func withChunks(all []currentObject, lists map[translate.Key]bool) map[translate.Key]currentObject {
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
	return byKey
}

// addMerged adds to byKey what the table merged for the pod last: an object that
// listed it then must commit its change (or its deletion) before the pod is
// current. out gets the interface holding the pod's state.
func (c *Controller) addMerged(byKey map[translate.Key]currentObject, ip netip.Addr, out *explain.PodExplain) {
	var merged []translate.Key
	merged, out.Ifindex = c.pods.mergedFor(ip)
	for _, k := range merged {
		if _, ok := byKey[k]; !ok {
			cur, ok := c.current(k)
			if !ok {
				cur = currentObject{key: k} // deleted: its removal is what is pending
			}
			byKey[k] = cur
		}
	}
}

// podObjects appends each object's state for the pod, in key order, and sets
// out.Programmed: synced, on this node, and every object programmed for it.
func (c *Controller) podObjects(out *explain.PodExplain, byKey map[translate.Key]currentObject, lists map[translate.Key]bool, ip netip.Addr) {
	keys := make([]translate.Key, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, translate.Key.Compare)
	out.Programmed = out.Synced && out.OnNode
	for _, k := range keys {
		cur := byKey[k]
		po := explain.PodObject{Kind: k.Kind.String(), Namespace: k.Namespace, Name: k.Name, UID: string(cur.uid),
			ResourceVersion: cur.rv, PolicyRef: cur.policyRef, Lists: lists[k]}
		if cur.uid == "" {
			po.State = explain.StateNotFound
			po.Programmed = !c.pods.holds(k)
		} else {
			po.State, _ = c.explain.Refine(string(cur.uid), cur.rv, c.pods.stateOf(k, cur.uid, cur.rv, ip))
			po.Programmed = po.State == explain.StateProgrammed || po.State == explain.StateNoLocalWork
		}
		out.Programmed = out.Programmed && po.Programmed
		out.Objects = append(out.Objects, po)
	}
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
