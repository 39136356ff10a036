package reconcile

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/npagent/npagent/internal/kubewatch"
	"github.com/npagent/npagent/internal/translate"
)

// EnforcingMode is what a local pod gets before a policy selects it (Config.EnforcingMode),
// as the AWS network policy agent's NETWORK_POLICY_ENFORCING_MODE.
type EnforcingMode string

const (
	// EnforcingStandard: a pod is open until a policy selecting it is committed, and
	// open again when none selects it any more. The agent needs no pod watch.
	EnforcingStandard EnforcingMode = "standard"
	// EnforcingStrict: a pod on this node (not on the host network) is denied both
	// ways, node traffic excepted, from the moment the agent sees it with an IP until
	// a policy selecting it is committed; and denied again when the last policy
	// selecting it goes away. A pod no policy selects stays denied. The agent
	// watches the pods of its node (spec.nodeName) to see them before any
	// PolicyEndpoint names them.
	EnforcingStrict EnforcingMode = "strict"
)

// ParseEnforcingMode parses "standard" or "strict"; "" is standard.
func ParseEnforcingMode(s string) (EnforcingMode, error) {
	switch m := EnforcingMode(s); m {
	case "":
		return EnforcingStandard, nil
	case EnforcingStandard, EnforcingStrict:
		return m, nil
	}
	return "", fmt.Errorf("enforcing mode %q is not standard or strict", s)
}

// The strict mode's pod watch. Its informer lists only this node's pods
// (spec.nodeName) and keeps of each only what enforcement needs (see stripPod); its
// handlers record each pod's addresses in localPodSet (O(1), no-ops dropped) and
// queue the pod's key. One worker checks the key out and has the pod table deny,
// release or forget those addresses (podTable.commitStrict); an interface not there
// yet is retried with backoff, as for objects.

// localPodSet is the addresses of this node's pods as the pod informer last saw them,
// and those of pods since gone that the worker has not handled yet. Its own mutex:
// handlers never wait for the pod table's (held across dataplane calls).
type localPodSet struct {
	mu    sync.Mutex
	byKey map[string][]netip.Addr // pod key → its addresses (none: host network, or no IP yet)
	addrs map[netip.Addr]int      // address → how many pods have it (a reused IP may overlap)
	gone  map[string][]netip.Addr // pod key → addresses it no longer has, until checked out
}

func newLocalPodSet() *localPodSet {
	return &localPodSet{byKey: map[string][]netip.Addr{}, addrs: map[netip.Addr]int{}, gone: map[string][]netip.Addr{}}
}

// set records key's addresses (none: the pod is gone, done, on the host network or
// has no IP); it reports whether they changed.
func (s *localPodSet) set(key string, addrs []netip.Addr) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	prev := s.byKey[key]
	if slices.Equal(prev, addrs) {
		return false
	}
	for _, a := range prev {
		if s.addrs[a]--; s.addrs[a] <= 0 {
			delete(s.addrs, a)
		}
		if !slices.Contains(addrs, a) {
			s.gone[key] = append(s.gone[key], a)
		}
	}
	for _, a := range addrs {
		s.addrs[a]++
	}
	if len(addrs) == 0 {
		delete(s.byKey, key)
	} else {
		s.byKey[key] = addrs
	}
	return true
}

// checkout returns the addresses the worker must bring in line for key: its current
// ones and those it lost since the last checkout.
func (s *localPodSet) checkout(key string) []netip.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := union(s.byKey[key], s.gone[key])
	delete(s.gone, key)
	return out
}

// putBack returns addresses a failed worker pass still has to handle.
func (s *localPodSet) putBack(key string, addrs []netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range addrs {
		if !slices.Contains(s.byKey[key], a) && !slices.Contains(s.gone[key], a) {
			s.gone[key] = append(s.gone[key], a)
		}
	}
}

// has reports whether a pod of this node has the address.
func (s *localPodSet) has(a netip.Addr) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addrs[a] > 0
}

// all returns every address of this node's pods.
func (s *localPodSet) all() []netip.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]netip.Addr, 0, len(s.addrs))
	for a := range s.addrs {
		out = append(out, a)
	}
	return out
}

// keys returns the key of every pod with an address.
func (s *localPodSet) keys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.byKey))
	for k := range s.byKey {
		out = append(out, k)
	}
	return out
}

// podWatch is the informer of this node's pods, its registration and strict mode's
// queue. The pod condition (podstatus.go) shares the informer; in standard mode the
// queue stays empty (strict false).
type podWatch struct {
	informer cache.SharedIndexInformer
	reg      cache.ResourceEventHandlerRegistration
	queue    workqueue.TypedRateLimitingInterface[string]
	set      *localPodSet
	strict   bool
}

// newPodWatch builds the informer of this node's pods. Nothing runs until Run.
func newPodWatch(restConfig *rest.Config, cfg *Config, set *localPodSet, strict bool) (*podWatch, error) {
	cs, err := corev1client.NewForConfig(restConfig)
	if err != nil {
		return nil, fmt.Errorf("pods client: %w", err)
	}
	selector := fields.OneTermEqualSelector("spec.nodeName", cfg.NodeName).String()
	lw := cache.NewFilteredListWatchFromClient(cs.RESTClient(), "pods", metav1.NamespaceAll,
		func(o *metav1.ListOptions) { o.FieldSelector = selector })
	w := &podWatch{
		informer: cache.NewSharedIndexInformerWithOptions(lw, &corev1.Pod{},
			cache.SharedIndexInformerOptions{ResyncPeriod: 0, ObjectDescription: "pods"}),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](5*time.Millisecond, cfg.MaxRetryDelay),
			workqueue.TypedRateLimitingQueueConfig[string]{}),
		set:    set,
		strict: strict,
	}
	if err := w.informer.SetTransform(stripPod); err != nil {
		return nil, fmt.Errorf("pod informer: %w", err)
	}
	var forbiddenLogged atomic.Bool
	sayForbidden := func(err error) {
		if apierrors.IsForbidden(err) && !forbiddenLogged.Swap(true) {
			// The usual misconfiguration, said once and plainly: the reflector's own
			// message repeats at every retry.
			cfg.Logger.Error("listing this node's pods is forbidden (strict mode or the pod condition needs them): grant get, list and watch on pods (the chart does); until then the agent is not ready and programs nothing: no policy change and no new pod is enforced on this node, and only the enforcement pinned before stays in force",
				"node", cfg.NodeName, "err", err)
		}
	}
	errs := kubewatch.NewErrorHandler(cfg.Logger, "pods", sayForbidden)
	if err := w.informer.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		if !w.informer.HasSynced() {
			sayForbidden(err) // at start a 403 is the missing grant: said at once; later it may be a restarting apiserver's
		}
		errs.Handle(ctx, r, err)
	}); err != nil {
		return nil, fmt.Errorf("pod informer: %w", err)
	}
	record := func(obj any) {
		key, addrs, ok := podAddrs(obj)
		if ok && set.set(key, addrs) && strict {
			w.queue.Add(key)
		}
	}
	w.reg, err = w.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    record,
		UpdateFunc: func(_, obj any) { record(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if key, _, ok := podAddrs(obj); ok && set.set(key, nil) && strict {
				w.queue.Add(key)
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("pod informer: %w", err)
	}
	return w, nil
}

// stripPod keeps of a pod what enforcement and its condition need: its name,
// namespace, uid and labels (a PolicyEndpoint's podSelector), its addresses, its
// phase, whether it is on the host network, and the conditions podstatus.go reads
// (npagent's own, PodReadyToStartContainers). A node's pods are many and change often
// (status): the cache holds no spec or status beyond that.
func stripPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	var conds []corev1.PodCondition
	for _, c := range p.Status.Conditions {
		if keptCondition(c.Type) {
			conds = append(conds, c)
		}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion, Labels: p.Labels},
		Spec:       corev1.PodSpec{HostNetwork: p.Spec.HostNetwork},
		Status:     corev1.PodStatus{Phase: p.Status.Phase, PodIP: p.Status.PodIP, PodIPs: p.Status.PodIPs, Conditions: conds},
	}, nil
}

// podAddrs returns a pod's key and its addresses, sorted: none for a pod on the host
// network (its traffic is the node's: never enforced), without an IP yet, or done
// (Succeeded or Failed: its sandbox and interface are gone, and its IP may be another
// pod's by now, while the pod object can stay for long, a Job's say).
func podAddrs(obj any) (key string, addrs []netip.Addr, ok bool) {
	p, isPod := obj.(*corev1.Pod)
	if !isPod {
		return "", nil, false
	}
	key = p.Namespace + "/" + p.Name
	if p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return key, nil, true
	}
	ips := p.Status.PodIPs
	if len(ips) == 0 && p.Status.PodIP != "" {
		ips = []corev1.PodIP{{IP: p.Status.PodIP}}
	}
	addrs = make([]netip.Addr, 0, len(ips))
	for _, ip := range ips {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			addrs = append(addrs, a.Unmap())
		}
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	return key, slices.Compact(addrs), true
}

// startPodWorker starts the worker of the pod queue; it stops when the queue is shut
// down (Run does, when ctx is done).
func (c *Controller) startPodWorker(ctx context.Context, wg *sync.WaitGroup) {
	wg.Go(func() {
		for c.processPod(ctx) {
		}
	})
}

// processPod brings the dataplane in line for one pod's addresses.
func (c *Controller) processPod(ctx context.Context) bool {
	w := c.podWatch
	key, shutdown := w.queue.Get()
	if shutdown {
		return false
	}
	defer w.queue.Done(key)
	if ctx.Err() != nil {
		return false
	}
	addrs := w.set.checkout(key)
	res, requeue := c.pods.commitStrict(addrs)
	c.statusChanged(addrs)
	for _, k := range requeue {
		c.queue.Add(k)
	}
	if res.err != nil {
		c.log.Error("strict mode: commit failed", "pod", key, "err", res.err)
	}
	if len(res.notDone) > 0 {
		if res.err == nil && w.queue.NumRequeues(key) == 0 {
			c.log.Info("strict mode: waiting for pod interfaces", "pod", key, "addrs", fmt.Sprint(res.notDone), "err", res.resolveErr)
		}
		w.set.putBack(key, res.notDone)
		w.queue.AddRateLimited(key)
		return true
	}
	w.queue.Forget(key)
	return true
}

// requeuePods queues every pod with an address, once the initial sync collected the
// leftovers: a pod that held a previous process's state was left alone until then.
func (c *Controller) requeuePods() {
	for _, k := range c.podWatch.set.keys() {
		c.podWatch.queue.Add(k)
	}
}

// commitStrict brings in line the addresses of one pod of this node (its current
// ones and those it lost): one no object selects is denied while the pod has it, its
// state removed once no pod has it; one a held object names keeps what is pinned. An
// address some object selects is the object's to commit (its sync merges and reports
// it) — unless that commit did not reach the pod's interface now there (the pod was
// recreated with the same IP, or its interface came after the objects' sync): then
// their policy is committed here at once, never left open, and their keys are
// returned in requeue, so their syncs run again and report their pending triggers.
func (t *podTable) commitStrict(addrs []netip.Addr) (res commitResult, requeue []translate.Key) {
	res = t.lock()
	defer t.mu.Unlock()
	for _, pod := range addrs {
		keys := t.podIndex[pod]
		if len(keys) == 0 {
			t.unselected(&res, pod)
			continue
		}
		ifindex, err := t.resolver.Resolve(pod)
		if err != nil || t.programmed[pod] == ifindex {
			continue // not there yet (the objects' retry commits it), or committed
		}
		t.commitLocked(&res, []netip.Addr{pod})
		for k := range keys {
			requeue = append(requeue, k)
		}
	}
	res.attempt.End = time.Now()
	return res, requeue
}

// unselected brings in line a pod no object selects: a pod a held object names keeps
// its pinned enforcement; in strict mode a pod of this node is denied; otherwise its
// state is removed. Called with mu held.
func (t *podTable) unselected(res *commitResult, pod netip.Addr) {
	if _, held := t.heldIndex[pod]; held && t.hasState(pod) {
		return
	}
	if t.strict != nil && t.strict.has(pod) {
		t.denyStrict(res, pod)
		return
	}
	if ifindex, ok := t.programmed[pod]; ok && t.otherAddrSelected(pod, ifindex) {
		// The interface's state is the policy of the pod's other address (dual
		// stack): this address lets go of it, nothing is removed.
		delete(t.programmed, pod)
		delete(t.strictDenied, pod)
		return
	}
	t.removePod(res, pod)
}

// otherAddrSelected reports whether another address committed on ifindex (the same
// pod, dual stack) is selected by an object: the interface holds its policy. Called
// with mu held.
func (t *podTable) otherAddrSelected(pod netip.Addr, ifindex int) bool {
	for other, i := range t.programmed {
		if i == ifindex && other != pod && len(t.podIndex[other]) > 0 {
			return true
		}
	}
	return false
}

// hasState reports whether the pod's interface holds dataplane state: committed by
// this process, or pinned by a previous one. A held pod keeps that state; one without
// any has nothing to keep (in strict mode it is denied). Called with mu held.
func (t *podTable) hasState(pod netip.Addr) bool {
	if _, ok := t.programmed[pod]; ok {
		return true
	}
	ifindex, err := t.resolver.Resolve(pod)
	return err == nil && slices.Contains(t.dp.Pods(), ifindex)
}

// denyStrict denies a pod of this node both ways (node traffic excepted) until a
// policy selecting it is committed: strict mode's default for a pod no object
// selects. An interface not there yet is left to the caller's retry. Called with mu
// held.
func (t *podTable) denyStrict(res *commitResult, pod netip.Addr) {
	ifindex, err := t.resolver.Resolve(pod)
	if err != nil {
		res.resolveErr = firstErr(res.resolveErr, err)
		res.notDone = append(res.notDone, pod)
		return
	}
	if _, denied := t.strictDenied[pod]; denied && t.programmed[pod] == ifindex {
		return
	}
	if !t.initialDone && t.pinnedOnly(ifindex) {
		// A previous process's state (a policy whose object is not synced yet, or
		// its strict denial): it stays until the initial sync is done; then every
		// pod is queued again (requeuePods).
		return
	}
	if t.otherAddrSelected(pod, ifindex) {
		return // the pod's other address (dual stack) holds the policy selecting it
	}
	if old, ok := t.programmed[pod]; ok && old != ifindex {
		// A recreated pod with the same IP: the old interface's state is stale.
		res.calls++
		if _, err := t.dp.Remove(old); err != nil {
			t.log.Warn("remove stale pod state", "pod", pod, "ifindex", old, "err", err)
		}
		delete(t.programmed, pod)
	}
	cr, err := t.commitDeny(res, pod, ifindex, true, true)
	if err != nil {
		res.err = firstErr(res.err, fmt.Errorf("strict mode: deny pod %s (ifindex %d): %w", pod, ifindex, err))
		res.notDone = append(res.notDone, pod)
		return
	}
	addPhases(&res.attempt, cr)
	res.pods++
	t.strictDenied[pod] = struct{}{}
	delete(t.uncommittable, pod)
	delete(t.policySince, pod)
	t.stats.strictDenials.Add(1)
	t.log.Info("pod denied by strict mode until a policy selects it", "pod", pod, "ifindex", ifindex)
}

// strictReleased notes that pod's policy was committed: strict mode no longer denies
// it, nor its other addresses (the same interface). Called with mu held.
func (t *podTable) strictReleased(pod netip.Addr) {
	if len(t.strictDenied) == 0 {
		return
	}
	delete(t.strictDenied, pod)
	ifindex, ok := t.programmed[pod]
	if !ok {
		return
	}
	for other := range t.strictDenied {
		if t.programmed[other] == ifindex {
			delete(t.strictDenied, other)
		}
	}
}

// strictlyDenied reports whether strict mode denies the pod now (for explain).
func (t *podTable) strictlyDenied(pod netip.Addr) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.strictDenied[pod]
	return ok
}
