package reconcile

import (
	"net/netip"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/npagent/npagent/internal/explain"
	"github.com/npagent/npagent/internal/podcond"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/translate"
)

// The new-pod enforcement window (Config.PodSeen): from when the pod's network
// became usable (its PodReadyToStartContainers condition's lastTransitionTime, else
// when this process first saw its IP) to the commit that first programmed its policy
// here. It goes through a seen-set of its own, keyed by pod uid, exactly as a
// trigger does: Observe at event time (a re-delivery, relist or restart answers
// redelivered, stale or before_start), Committed when the pod's condition is first
// computed Programmed (the window ends at the policy's switch, podTable.policySince,
// not when the condition is computed), NoLocalWork when it is first computed
// NoPolicy (counted, not observed), Forget on delete. The state file, when the set
// has one, carries what was consumed across restarts.

// podWindow is where a pod's window starts, as this process first saw it.
type podWindow struct {
	start  time.Time
	source string
	// programmed is the switch that closed the window as reported; zero until then.
	programmed time.Time
	unselected bool // closed counted: no policy selected the pod
}

// observePod tells the pod seen-set about a pod with addresses, at event time.
func (c *Controller) observePod(obj any, addrs []netip.Addr) {
	ps, s := c.cfg.PodSeen, c.podStatus
	pod, ok := obj.(*corev1.Pod)
	if ps == nil || !ok || len(addrs) == 0 || pod.UID == "" {
		return
	}
	now := time.Now()
	w := podWindow{start: now, source: report.SourceFirstSeenIP}
	for _, cond := range pod.Status.Conditions {
		if cond.Type == corev1.PodReadyToStartContainers && cond.Status == corev1.ConditionTrue && !cond.LastTransitionTime.IsZero() {
			w = podWindow{start: cond.LastTransitionTime.Time, source: report.SourceReadyToStartContainers}
		}
	}
	s.mu.Lock()
	prev, seen := s.windows[pod.UID]
	if !seen || (prev.source == report.SourceFirstSeenIP && w.source == report.SourceReadyToStartContainers) {
		s.windows[pod.UID] = w
	}
	s.mu.Unlock()
	if w.source == report.SourceFirstSeenIP {
		if seen {
			return // this process's first sight is the start; a later one is not
		}
		if _, known := ps.Inspect(string(pod.UID)); known {
			return // a previous process saw it: its first sight was the start
		}
	}
	ps.Observe(string(pod.UID), w.start, now)
}

// podWindowOf is the window of the pod namespace/name, for explain; nil when the
// agent does not measure windows or has not seen the pod with an address.
func (c *Controller) podWindowOf(namespace, name string) *explain.PodWindow {
	if c.cfg.PodSeen == nil || c.podStatus == nil || c.podWatch == nil || name == "" {
		return nil
	}
	obj, exists, err := c.podWatch.informer.GetStore().GetByKey(namespace + "/" + name)
	pod, ok := obj.(*corev1.Pod)
	if err != nil || !exists || !ok {
		return nil
	}
	c.podStatus.mu.Lock()
	w, seen := c.podStatus.windows[pod.UID]
	c.podStatus.mu.Unlock()
	if !seen {
		return nil
	}
	return &explain.PodWindow{NetworkReady: w.start, Source: w.source, Programmed: w.programmed, Unselected: w.unselected}
}

// forgetPod drops a deleted pod's window.
func (c *Controller) forgetPod(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if c.cfg.PodSeen == nil || !ok {
		return
	}
	c.podStatus.mu.Lock()
	delete(c.podStatus.windows, pod.UID)
	c.podStatus.mu.Unlock()
	c.cfg.PodSeen.Forget(string(pod.UID))
}

// podWindowEnd ends a pod's window when its condition is computed: reported when
// Programmed, counted when NoPolicy, left pending otherwise.
func (c *Controller) podWindowEnd(pod *corev1.Pod, addrs []netip.Addr, cond podcond.Condition, facts podcond.Facts) {
	ps, s := c.cfg.PodSeen, c.podStatus
	if ps == nil {
		return
	}
	uid := string(pod.UID)
	trigger, pending := ps.Pending(uid)
	if !pending {
		return
	}
	switch cond.Reason {
	case podcond.ReasonNoPolicy:
		ps.NoLocalWork(uid, trigger)
		s.mu.Lock()
		if w, ok := s.windows[pod.UID]; ok {
			w.unselected = true
			s.windows[pod.UID] = w
		}
		s.mu.Unlock()
		if s.sink != nil {
			s.sink.PodUnselected()
		}
		return
	case podcond.ReasonProgrammed:
	default:
		return
	}
	at := c.pods.policySinceOf(addrs)
	if at.IsZero() {
		at = time.Now()
	}
	if at.Before(trigger) {
		// In force before the window started (the commit came before this process
		// first saw the pod's IP, or the address kept a predecessor's policy): the
		// pod was never unprotected, a window of zero, not a clock skew.
		at = trigger
	}
	reports, err := ps.Committed(uid, trigger, report.Attempt{Start: at, End: at, Programmed: at})
	if err != nil {
		c.log.Warn("pod seen-set state not persisted: this pod's window may be reported again after a restart", "pod", pod.Namespace+"/"+pod.Name, "err", err)
	}
	if s.sink == nil || len(reports) == 0 {
		return
	}
	s.mu.Lock()
	w := s.windows[pod.UID]
	w.programmed = reports[len(reports)-1].ProgrammedAt()
	s.windows[pod.UID] = w
	source := w.source
	s.mu.Unlock()
	objects, parents := c.selectingObjects(facts)
	for _, r := range reports {
		s.sink.PodProgrammed(&report.PodRecord{
			Namespace: pod.Namespace, Name: pod.Name, UID: uid, Node: c.cfg.NodeName,
			NetworkReady: r.Trigger, Source: source, Programmed: r.ProgrammedAt(),
			Strict:  c.cfg.EnforcingMode == EnforcingStrict,
			Objects: objects, TraceParents: parents,
		})
	}
}

// selectingObjects names the objects selecting a pod and their current versions'
// traceparents.
func (c *Controller) selectingObjects(facts podcond.Facts) (names, parents []string) {
	for _, o := range facts.Objects {
		names = append(names, o.String())
		kind := report.KindPolicyEndpoint
		if o.Kind == report.KindClusterPolicyEndpoint.String() {
			kind = report.KindClusterPolicyEndpoint
		}
		obj, exists, err := c.informers[kind].GetIndexer().GetByKey(translate.Key{Kind: kind, Namespace: o.Namespace, Name: o.Name}.StoreKey())
		if err != nil || !exists {
			continue
		}
		m, err := meta.Accessor(obj)
		if err != nil {
			continue
		}
		ann := m.GetAnnotations()
		tp := ann[TracingTraceParentAnnotation]
		if strings.TrimSpace(tp) == "" {
			tp = ann[c.cfg.TraceParentAnnotation]
		}
		if tp != "" {
			parents = append(parents, tp)
		}
	}
	return names, parents
}

// policySinceOf is when a policy was first committed to any of the pod's addresses
// (zero: none is).
func (t *podTable) policySinceOf(addrs []netip.Addr) time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	var first time.Time
	for _, a := range addrs {
		if at, ok := t.policySince[a]; ok && (first.IsZero() || at.Before(first)) {
			first = at
		}
	}
	return first
}

// persistPodSeen writes the pod seen-set's state once the loop stopped: pods counted
// unselected since the last report are kept consumed across the restart.
func (c *Controller) persistPodSeen() {
	if err := c.cfg.PodSeen.Persist(); err != nil {
		c.log.Warn("pod seen-set state not persisted: new pods' windows may be counted again after a restart", "err", err)
	}
}
