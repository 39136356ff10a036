package reconcile

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/podcond"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/translate"
)

// The pod condition (Config.PodStatus): the agent writes podcond.Type on each pod of
// its node that has an IP and is not on the host network, computed from the pod
// table (podcond.Compute). Its handlers share the pod informer of pods.go (one
// watch of spec.nodeName in either enforcing mode) and queue a pod's key when what
// the condition reads of it changed (addresses, labels, phase, the condition itself);
// each sync of an object queues the pods it brought in line. One worker checks a key
// out, computes the condition and patches pods/status only when it differs from the
// pod's (or from what the worker last wrote, while the informer has not caught up):
// the queue coalesces a pod's changes, a token bucket bounds the writes
// (Config.PodStatusQPS). Nothing is computed before the initial sync is done, so a
// restart computes the condition from every object and, when nothing changed,
// writes nothing; a relist or resync queues nothing.

// keptCondition reports whether the pod informer keeps a condition type (stripPod).
func keptCondition(t corev1.PodConditionType) bool {
	return t == podcond.Type || t == corev1.PodReadyToStartContainers
}

// podStatus is the condition's writer: its queue, its write budget, the index from
// addresses to pod keys (an object's sync names addresses), and what it wrote.
type podStatus struct {
	client  corev1client.PodsGetter
	queue   workqueue.TypedRateLimitingInterface[string]
	limiter *rate.Limiter
	reg     cache.ResourceEventHandlerRegistration

	started   chan struct{} // closed after the initial sync
	startOnce sync.Once

	mu      sync.Mutex
	byAddr  map[netip.Addr]map[string]struct{}
	addrsOf map[string][]netip.Addr
	written map[string]writtenCondition
	windows map[types.UID]podWindow // see podlatency.go
	sink    report.PodSink          // nil: windows not handed over

	patches, patchErrors atomic.Uint64
}

// writtenCondition is the condition last patched on a pod (by uid).
type writtenCondition struct {
	uid  types.UID
	cond podcond.Condition
}

// newPodStatus builds the writer on the pod informer; nothing runs until Run.
func (c *Controller) newPodStatus(restConfig *rest.Config, sink report.Sink) (*podStatus, error) {
	cs, err := corev1client.NewForConfig(restConfig)
	if err != nil {
		return nil, fmt.Errorf("pods client: %w", err)
	}
	burst := max(1, int(2*c.cfg.PodStatusQPS))
	s := &podStatus{
		client:  cs,
		limiter: rate.NewLimiter(rate.Limit(c.cfg.PodStatusQPS), burst),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](50*time.Millisecond, c.cfg.MaxRetryDelay),
			workqueue.TypedRateLimitingQueueConfig[string]{}),
		started: make(chan struct{}),
		byAddr:  map[netip.Addr]map[string]struct{}{},
		addrsOf: map[string][]netip.Addr{},
		written: map[string]writtenCondition{},
		windows: map[types.UID]podWindow{},
	}
	s.sink, _ = sink.(report.PodSink)
	s.reg, err = c.podWatch.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if key, addrs, ok := podAddrs(obj); ok {
				s.index(key, addrs)
				c.observePod(obj, addrs)
				s.queue.Add(key)
			}
		},
		UpdateFunc: func(oldObj, obj any) {
			key, addrs, ok := podAddrs(obj)
			if !ok {
				return
			}
			s.index(key, addrs)
			if statusInputsChanged(oldObj, obj) {
				c.observePod(obj, addrs)
				s.queue.Add(key)
			}
		},
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if key, _, ok := podAddrs(obj); ok {
				s.index(key, nil)
				s.mu.Lock()
				delete(s.written, key)
				s.mu.Unlock()
				c.forgetPod(obj)
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("pod informer: %w", err)
	}
	return s, nil
}

// statusInputsChanged reports whether what the condition reads of a pod changed
// between two cached (stripped) versions: not its resourceVersion alone (a relist,
// or a change of a status field the cache does not keep).
func statusInputsChanged(oldObj, obj any) bool {
	o, ok1 := oldObj.(*corev1.Pod)
	n, ok2 := obj.(*corev1.Pod)
	if !ok1 || !ok2 {
		return true
	}
	return o.UID != n.UID || o.Spec.HostNetwork != n.Spec.HostNetwork || o.Status.Phase != n.Status.Phase ||
		o.Status.PodIP != n.Status.PodIP || !slices.Equal(o.Status.PodIPs, n.Status.PodIPs) ||
		!labels.Equals(o.Labels, n.Labels) || !slices.EqualFunc(o.Status.Conditions, n.Status.Conditions, sameCondition)
}

func sameCondition(a, b corev1.PodCondition) bool {
	return a.Type == b.Type && a.Status == b.Status && a.Reason == b.Reason && a.Message == b.Message &&
		a.LastTransitionTime.Equal(&b.LastTransitionTime)
}

// index records key's addresses (none: gone, no IP, host network, done).
func (s *podStatus) index(key string, addrs []netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	prev := s.addrsOf[key]
	if slices.Equal(prev, addrs) {
		return
	}
	for _, a := range prev {
		if keys := s.byAddr[a]; keys != nil {
			delete(keys, key)
			if len(keys) == 0 {
				delete(s.byAddr, a)
			}
		}
	}
	for _, a := range addrs {
		if s.byAddr[a] == nil {
			s.byAddr[a] = map[string]struct{}{}
		}
		s.byAddr[a][key] = struct{}{}
	}
	if len(addrs) == 0 {
		delete(s.addrsOf, key)
	} else {
		s.addrsOf[key] = addrs
	}
}

// start lets the worker compute conditions: the initial sync is done. Every pod is
// queued (a pod whose condition is current is then left alone).
func (s *podStatus) start() {
	s.startOnce.Do(func() {
		s.mu.Lock()
		for key := range s.addrsOf {
			s.queue.Add(key)
		}
		s.mu.Unlock()
		close(s.started)
	})
}

// statusChanged queues the pods with these addresses (an object's sync brought them
// in line; their condition may change).
func (c *Controller) statusChanged(addrs []netip.Addr) {
	s := c.podStatus
	if s == nil || len(addrs) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range addrs {
		for key := range s.byAddr[a] {
			s.queue.Add(key)
		}
	}
}

// statusSynced records that the key's sync handled version rv of uid, then queues
// the pods it touched. Deferred by sync, so a rejection is noted before.
func (c *Controller) statusSynced(key translate.Key, uid types.UID, rv string, touched []netip.Addr) {
	if c.podStatus == nil {
		return
	}
	reach := c.pods.noteSynced(key, uid, rv)
	c.statusChanged(union(touched, reach))
}

// noteSynced records the resourceVersion a sync of key handled, and returns the
// pods its valid version reaches (those of every chunk of its policy: a rejected
// rules-only chunk changes their condition too).
func (t *podTable) noteSynced(key translate.Key, uid types.UID, rv string) []netip.Addr {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.objects[key]
	if st == nil || st.uid != uid {
		return nil
	}
	st.syncedRV = rv
	return t.reach(st.compiled)
}

// startStatusWorker runs the condition's worker until its queue shuts down.
func (c *Controller) startStatusWorker(ctx context.Context, wg *sync.WaitGroup) {
	s := c.podStatus
	wg.Go(func() {
		select {
		case <-s.started:
		case <-ctx.Done():
			return
		}
		for c.processStatus(ctx) {
		}
	})
}

func (c *Controller) processStatus(ctx context.Context) bool {
	s := c.podStatus
	key, shutdown := s.queue.Get()
	if shutdown {
		return false
	}
	defer s.queue.Done(key)
	if ctx.Err() != nil {
		return false
	}
	if err := c.syncStatus(ctx, key); err != nil {
		s.patchErrors.Add(1)
		if s.queue.NumRequeues(key) == 0 {
			c.log.Warn("pod condition not written; retrying", "pod", key, "condition", podcond.Type, "err", err)
		}
		s.queue.AddRateLimited(key)
		return true
	}
	s.queue.Forget(key)
	return true
}

// syncStatus brings one pod's condition in line.
func (c *Controller) syncStatus(ctx context.Context, key string) error {
	s := c.podStatus
	obj, exists, err := c.podWatch.informer.GetIndexer().GetByKey(key)
	if err != nil || !exists {
		return err
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return nil
	}
	_, addrs, _ := podAddrs(pod)
	if len(addrs) == 0 {
		return nil // host network, no IP yet, or done: nothing to protect
	}
	facts := c.podFacts(pod, addrs)
	want := podcond.Compute(facts)
	c.podWindowEnd(pod, addrs, want, facts)
	cur := findCondition(pod.Status.Conditions)
	s.mu.Lock()
	w, wrote := s.written[key]
	s.mu.Unlock()
	switch {
	case cur != nil && string(cur.Status) == want.Status && cur.Reason == want.Reason && cur.Message == want.Message:
		return nil
	case wrote && w.uid == pod.UID && w.cond == want:
		return nil // written; the informer has not brought it back yet
	}
	if err := s.limiter.Wait(ctx); err != nil {
		return nil // stopping
	}
	transition := metav1.Now()
	if cur != nil && string(cur.Status) == want.Status {
		transition = cur.LastTransitionTime
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"uid": pod.UID}, // a precondition: never another pod of that name
		"status": map[string]any{"conditions": []corev1.PodCondition{{
			Type: podcond.Type, Status: corev1.ConditionStatus(want.Status), Reason: want.Reason, Message: want.Message,
			LastTransitionTime: transition,
		}}},
	})
	if err != nil {
		return err
	}
	_, err = s.client.Pods(pod.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	switch {
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		return nil // gone, or recreated (its own event queues the new pod)
	case err != nil:
		return fmt.Errorf("patch pods/status: %w", err)
	}
	s.patches.Add(1)
	s.mu.Lock()
	s.written[key] = writtenCondition{uid: pod.UID, cond: want}
	s.mu.Unlock()
	return nil
}

func findCondition(conds []corev1.PodCondition) *corev1.PodCondition {
	for i := range conds {
		if conds[i].Type == podcond.Type {
			return &conds[i]
		}
	}
	return nil
}

// statusCandidate is an object, as the informer's cache holds it, that may select
// the pod: it lists one of its addresses on this node, or its podSelector (a
// PolicyEndpoint of the pod's namespace) or subject (a ClusterPolicyEndpoint)
// selects the pod.
type statusCandidate struct {
	key     translate.Key
	policy  translate.PolicyKey
	lists   bool
	selects bool
}

// podFacts gathers what the condition is computed from.
func (c *Controller) podFacts(pod *corev1.Pod, addrs []netip.Addr) podcond.Facts {
	var cands []statusCandidate
	objs, _ := c.informers[report.KindPolicyEndpoint].GetIndexer().ByIndex(cache.NamespaceIndex, pod.Namespace)
	for _, o := range objs {
		pe, ok := o.(*v1alpha1.PolicyEndpoint)
		if !ok {
			continue
		}
		cand := statusCandidate{
			key:    translate.Key{Kind: report.KindPolicyEndpoint, Namespace: pe.Namespace, Name: pe.Name},
			policy: translate.PolicyOf(report.KindPolicyEndpoint, pe.Namespace, pe.Spec.PolicyRef.Name),
		}
		cand.lists = c.listsOnNode(pe.Spec.PodSelectorEndpoints, addrs)
		if pe.Spec.PodSelector != nil {
			if sel, err := metav1.LabelSelectorAsSelector(pe.Spec.PodSelector); err == nil && sel.Matches(labels.Set(pod.Labels)) {
				cand.selects = true
			}
		}
		if cand.lists || cand.selects || cand.policy != (translate.PolicyKey{}) {
			cands = append(cands, cand)
		}
	}
	cands = append(cands, c.clusterCandidates(pod, addrs)...)
	return c.pods.facts(addrs, cands, c.cfg.EnforcingMode == EnforcingStrict, c.cachedVersion)
}

// clusterCandidates are the ClusterPolicyEndpoints that may select the pod: they
// list one of its addresses on this node, or their subject selects it.
func (c *Controller) clusterCandidates(pod *corev1.Pod, addrs []netip.Addr) []statusCandidate {
	if c.namespaces == nil {
		return nil
	}
	nsLabels, _ := c.namespaces.labelsOf(pod.Namespace)
	var cands []statusCandidate
	for _, o := range c.informers[report.KindClusterPolicyEndpoint].GetStore().List() {
		cpe, ok := o.(*v1alpha1.ClusterPolicyEndpoint)
		if !ok {
			continue
		}
		cand := statusCandidate{
			key:     translate.Key{Kind: report.KindClusterPolicyEndpoint, Name: cpe.Name},
			policy:  translate.PolicyOf(report.KindClusterPolicyEndpoint, "", cpe.Spec.PolicyRef.Name),
			lists:   c.listsOnNode(cpe.Spec.PodSelectorEndpoints, addrs),
			selects: subjectSelects(cpe.Spec.Subject, nsLabels, labels.Set(pod.Labels)),
		}
		if cand.lists || cand.selects || cand.policy != (translate.PolicyKey{}) {
			cands = append(cands, cand)
		}
	}
	return cands
}

// listsOnNode reports whether endpoints list one of addrs on this node.
func (c *Controller) listsOnNode(endpoints []v1alpha1.PodEndpoint, addrs []netip.Addr) bool {
	for _, ep := range endpoints {
		host, err1 := netip.ParseAddr(string(ep.HostIP))
		ip, err2 := netip.ParseAddr(string(ep.PodIP))
		if err1 == nil && err2 == nil && host.Unmap() == c.cfg.NodeIP && slices.Contains(addrs, ip.Unmap()) {
			return true
		}
	}
	return false
}

// namespaceRelabeled queues the pods of a namespace whose labels changed: a
// cluster policy's subject may select them now, or no longer.
func (c *Controller) namespaceRelabeled(namespace string) {
	s := c.podStatus
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for key := range s.addrsOf {
		if strings.HasPrefix(key, namespace+"/") {
			s.queue.Add(key)
		}
	}
}

// cachedVersion is the uid and resourceVersion of the key's object in the informer's
// cache.
func (c *Controller) cachedVersion(key translate.Key) (types.UID, string, bool) {
	obj, exists, err := c.informers[key.Kind].GetIndexer().GetByKey(key.StoreKey())
	if err != nil || !exists {
		return "", "", false
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return "", "", false
	}
	return m.GetUID(), m.GetResourceVersion(), true
}

// facts is what the table knows of a pod with these addresses: every object
// selecting it (those listing it, every chunk of their policies, those holding it,
// and the cache's candidates) and where each stands, and the pod's own state.
func (t *podTable) facts(addrs []netip.Addr, cands []statusCandidate, strict bool, cached func(translate.Key) (types.UID, string, bool)) podcond.Facts {
	t.mu.Lock()
	defer t.mu.Unlock()
	keys := map[translate.Key]bool{} // → selected by its podSelector only (not listed yet)
	policies := map[translate.PolicyKey]bool{}
	var selected []netip.Addr // the addresses some object of the table selects
	for _, p := range addrs {
		if len(t.podIndex[p])+len(t.heldIndex[p]) > 0 {
			selected = append(selected, p)
		}
		for k := range t.podIndex[p] {
			keys[k] = false
			if st := t.objects[k]; st != nil && st.compiled != nil && st.compiled.Policy != (translate.PolicyKey{}) {
				policies[st.compiled.Policy] = true
				for sibling := range t.chunks[st.compiled.Policy] {
					keys[sibling] = false
				}
			}
		}
		for k := range t.heldIndex[p] {
			keys[k] = false
		}
	}
	for _, cand := range cands {
		if cand.lists {
			keys[cand.key] = false
			if cand.policy != (translate.PolicyKey{}) {
				policies[cand.policy] = true
			}
		}
	}
	for _, cand := range cands {
		inPolicy := cand.policy != (translate.PolicyKey{}) && policies[cand.policy]
		if _, known := keys[cand.key]; known {
			continue
		}
		switch {
		case inPolicy:
			keys[cand.key] = false // a chunk of a policy selecting the pod (not synced yet)
		case cand.selects:
			keys[cand.key] = true
		}
	}
	f := podcond.Facts{Strict: strict}
	if len(selected) == 0 {
		selected = addrs
	}
	programmed, noInterface := true, false
	for _, p := range selected {
		if _, ok := t.programmed[p]; !ok {
			programmed = false
			if _, err := t.resolver.Resolve(p); err != nil {
				noInterface = true
			}
		}
	}
	for _, p := range addrs {
		_, denied := t.strictDenied[p]
		_, isolated := t.uncommittable[p]
		f.StrictDenied = f.StrictDenied || denied
		f.Uncommittable = f.Uncommittable || isolated
	}
	f.NoInterface = noInterface && (len(keys) > 0 || strict)
	for k, unlisted := range keys {
		state := t.objectStateFor(k, unlisted, addrs, cached)
		if state == podcond.Programmed && !programmed {
			state = podcond.Pending // the pod's own commit is still to come
		}
		f.Objects = append(f.Objects, podcond.Object{Kind: k.Kind.String(), Namespace: k.Namespace, Name: k.Name, State: state})
	}
	return f
}

// objectStateFor is where one object selecting the pod stands. Called with mu held.
func (t *podTable) objectStateFor(k translate.Key, unlisted bool, addrs []netip.Addr, cached func(translate.Key) (types.UID, string, bool)) podcond.State {
	uid, rv, exists := cached(k)
	st := t.objects[k]
	switch {
	case unlisted:
		return podcond.Pending // its podSelector matches; the controller has not listed the pod yet
	case st == nil || !exists || st.uid != uid || st.syncedRV != rv:
		return podcond.Pending // a version (or its delete) not synced yet
	case st.rejectedRV == rv && st.compiled == nil && anyIn(st.isolation.Pods, addrs):
		return podcond.Isolated
	case st.rejectedRV == rv:
		return podcond.Rejected
	case anyIn(st.dirty, addrs):
		return podcond.Pending // a commit of the pod still to do
	}
	return podcond.Programmed
}

func anyIn(list, addrs []netip.Addr) bool {
	for _, a := range addrs {
		if slices.Contains(list, a) {
			return true
		}
	}
	return false
}
