package reconcile

import (
	"context"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/podcond"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/testenv"
	"github.com/npagent/npagent/internal/translate"
)

// statusPatches counts the pods/status patches a client sends: the apiserver's
// requests, not the agent's own bookkeeping.
type statusPatches struct {
	rt http.RoundTripper
	n  *atomic.Int64
}

func (c statusPatches) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPatch && strings.Contains(r.URL.Path, "/pods/") && strings.HasSuffix(r.URL.Path, "/status") {
		c.n.Add(1)
	}
	return c.rt.RoundTrip(r)
}

func countingConfig(cp *testenv.ControlPlane, n *atomic.Int64) *rest.Config {
	cfg := rest.CopyConfig(cp.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return statusPatches{rt: rt, n: n} })
	return cfg
}

// podCondition reads the pod's npagent condition from the apiserver.
func podCondition(t *testing.T, cp *testenv.ControlPlane, ns, name string) *corev1.PodCondition {
	t.Helper()
	var p corev1.Pod
	if err := cp.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &p); err != nil {
		t.Fatalf("get pod %s/%s: %v", ns, name, err)
	}
	return findCondition(p.Status.Conditions)
}

// waitCondition waits until the pod's condition has status and reason, and its
// message contains each of words.
func waitCondition(t *testing.T, cp *testenv.ControlPlane, ns, name, status, reason string, words ...string) {
	t.Helper()
	var last *corev1.PodCondition
	ok := false
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) && !ok {
		last = podCondition(t, cp, ns, name)
		ok = last != nil && string(last.Status) == status && last.Reason == reason
		for _, w := range words {
			ok = ok && strings.Contains(last.Message, w)
		}
		if !ok {
			time.Sleep(50 * time.Millisecond)
		}
	}
	if !ok {
		t.Fatalf("pod %s/%s: condition %s = %+v, want %s/%s with %q", ns, name, podcond.Type, last, status, reason, words)
	}
}

// waitStatusIdle waits until the agent's condition writer has nothing queued.
func waitStatusIdle(t *testing.T, a *agent) {
	t.Helper()
	testenv.Eventually(t, 15*time.Second, "pod condition writer started and idle", func() bool {
		select {
		case <-a.c.podStatus.started:
		default:
			return false
		}
		return a.c.podStatus.queue.Len() == 0
	})
	time.Sleep(300 * time.Millisecond) // a key in flight
}

// TestPodCondition: the condition on a real apiserver's pods, through each reason
// and back to True; a pod with a readiness gate on it gets it; then a relist, a
// resync and an agent restart write nothing.
func TestPodCondition(t *testing.T) {
	cp := testenv.Start(t)
	const node, ns = "192.0.2.51", "ps"
	mine := "node-" + node
	createNamespace(t, cp, ns)
	resolver := newLookupTableResolver("10.51.0.1", 21, "10.51.0.2", 22, "10.51.0.4", 24)
	dp := bpfmaps.NewMemory()
	var patches atomic.Int64
	a := startAgent(t, cp, agentOptions{nodeIP: node, dp: dp, resolver: resolver, podStatus: true,
		resync: 200 * time.Millisecond, restConfig: countingConfig(cp, &patches)})

	// A pod before any policy (standard mode): open by design, True. It opts in to
	// a readiness gate on the condition.
	early := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "early"},
		Spec: corev1.PodSpec{NodeName: mine, Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}},
			ReadinessGates: []corev1.PodReadinessGate{{ConditionType: podcond.Type}}}}
	if err := cp.Client.Create(context.Background(), early); err != nil {
		t.Fatal(err)
	}
	early.Status.PodIP, early.Status.PodIPs = "10.51.0.1", []corev1.PodIP{{IP: "10.51.0.1"}}
	if err := cp.Client.Status().Update(context.Background(), early); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, cp, ns, "early", podcond.True, podcond.ReasonNoPolicy)
	// A host-network pod and another node's get none.
	hostNet := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "hostnet"},
		Spec: corev1.PodSpec{NodeName: mine, HostNetwork: true, Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}}}
	if err := cp.Client.Create(context.Background(), hostNet); err != nil {
		t.Fatal(err)
	}
	createPod(t, cp, ns, "elsewhere", "another-node", "10.51.0.9")

	// Its PolicyEndpoint comes: programmed, named.
	web := ingressPE(ns, "web", []v1alpha1.PodEndpoint{pod(node, "10.51.0.1")}, "10.99.0.1/32", 80)
	create(t, cp, web)
	waitCondition(t, cp, ns, "early", podcond.True, podcond.ReasonProgrammed, "PolicyEndpoint ps/web")

	// A pod after its PolicyEndpoint, whose podSelector matches it before the
	// controller lists it: Pending until listed and programmed.
	lateSel := ingressPE(ns, "late", nil, "10.99.0.2/32", 80)
	lateSel.Spec.PodSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "late"}}
	create(t, cp, lateSel)
	late := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "late", Labels: map[string]string{"app": "late"}},
		Spec: corev1.PodSpec{NodeName: mine, Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}}}
	if err := cp.Client.Create(context.Background(), late); err != nil {
		t.Fatal(err)
	}
	late.Status.PodIP, late.Status.PodIPs = "10.51.0.2", []corev1.PodIP{{IP: "10.51.0.2"}}
	if err := cp.Client.Status().Update(context.Background(), late); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, cp, ns, "late", podcond.False, podcond.ReasonPending, "PolicyEndpoint ps/late")
	update(t, cp, lateSel, func(pe *v1alpha1.PolicyEndpoint) {
		pe.Spec.PodSelectorEndpoints = []v1alpha1.PodEndpoint{pod(node, "10.51.0.2")}
		pe.Spec.PodSelectorEndpoints[0].Namespace = ns
	})
	waitCondition(t, cp, ns, "late", podcond.True, podcond.ReasonProgrammed, "PolicyEndpoint ps/late")

	// A pod whose interface is not there: NoInterface until it is.
	createPod(t, cp, ns, "noif", mine, "10.51.0.3")
	noif := ingressPE(ns, "noif", []v1alpha1.PodEndpoint{pod(node, "10.51.0.3")}, "10.99.0.3/32", 80)
	create(t, cp, noif)
	waitCondition(t, cp, ns, "noif", podcond.False, podcond.ReasonNoInterface, "PolicyEndpoint ps/noif")
	resolver.set("10.51.0.3", 23)
	waitCondition(t, cp, ns, "noif", podcond.True, podcond.ReasonProgrammed)

	// An invalid version of web: its last valid version stays in force, Rejected;
	// fixed, True again.
	update(t, cp, web, func(pe *v1alpha1.PolicyEndpoint) { pe.Spec.Ingress[0].CIDR = "10.99.0.1/33" })
	waitCondition(t, cp, ns, "early", podcond.False, podcond.ReasonRejected, "PolicyEndpoint ps/web")
	update(t, cp, web, func(pe *v1alpha1.PolicyEndpoint) { pe.Spec.Ingress[0].CIDR = "10.99.0.1/32" })
	waitCondition(t, cp, ns, "early", podcond.True, podcond.ReasonProgrammed)
	// A new object that was never valid isolates the pod: Isolated; deleted, True.
	bad := ingressPE(ns, "bad", []v1alpha1.PodEndpoint{pod(node, "10.51.0.1")}, "10.99.0.4/33", 80)
	create(t, cp, bad)
	waitCondition(t, cp, ns, "early", podcond.False, podcond.ReasonIsolated, "PolicyEndpoint ps/bad")
	remove(t, cp, bad)
	waitCondition(t, cp, ns, "early", podcond.True, podcond.ReasonProgrammed, "PolicyEndpoint ps/web")

	// A chunked policy: one chunk lists the pod, a rules-only sibling carries its
	// rules. The condition covers both: an invalid sibling makes it Rejected.
	createPod(t, cp, ns, "chunked", mine, "10.51.0.4")
	chunkA := ingressPE(ns, "chunky-a", []v1alpha1.PodEndpoint{pod(node, "10.51.0.4")}, "10.99.0.5/32", 80)
	chunkA.Spec.PolicyRef.Name = "chunky"
	chunkB := ingressPE(ns, "chunky-b", nil, "10.99.0.6/32", 443)
	chunkB.Spec.PolicyRef.Name = "chunky"
	create(t, cp, chunkA)
	create(t, cp, chunkB)
	waitCondition(t, cp, ns, "chunked", podcond.True, podcond.ReasonProgrammed, "PolicyEndpoint ps/chunky-a, PolicyEndpoint ps/chunky-b")
	update(t, cp, chunkB, func(pe *v1alpha1.PolicyEndpoint) { pe.Spec.Ingress[0].CIDR = "10.99.0.6/33" })
	waitCondition(t, cp, ns, "chunked", podcond.False, podcond.ReasonRejected, "PolicyEndpoint ps/chunky-b")
	update(t, cp, chunkB, func(pe *v1alpha1.PolicyEndpoint) { pe.Spec.Ingress[0].CIDR = "10.99.0.6/32" })
	waitCondition(t, cp, ns, "chunked", podcond.True, podcond.ReasonProgrammed)

	for _, name := range []string{"hostnet", "elsewhere"} {
		if c := podCondition(t, cp, ns, name); c != nil {
			t.Errorf("pod %s has condition %+v, want none (host network; another node's)", name, c)
		}
	}
	if n := a.c.podStatus.patchErrors.Load(); n != 0 {
		t.Errorf("%d patches failed", n)
	}

	// Nothing changes from here: resyncs (every 200ms), a relist after an apiserver
	// restart, and a restarted agent write nothing.
	waitStatusIdle(t, a)
	before := patches.Load()
	t.Logf("pods/status patches for the transitions above: %d", before)
	time.Sleep(time.Second) // five resyncs
	cp.RestartAPIServer(t)
	testenv.Eventually(t, 30*time.Second, "informers relisted", func() bool {
		var c report.Counts
		a.c.Counts(&c)
		return c.Deliveries[report.KindPolicyEndpoint][report.CauseRelist] > 0
	})
	waitStatusIdle(t, a)
	if got := patches.Load(); got != before {
		t.Errorf("resyncs and a relist wrote %d pods/status patches, want 0", got-before)
	}
	a.stop()
	var restarted atomic.Int64
	b := startAgent(t, cp, agentOptions{nodeIP: node, dp: dp, resolver: resolver, podStatus: true,
		restConfig: countingConfig(cp, &restarted)})
	waitStatusIdle(t, b)
	if got := restarted.Load(); got != 0 {
		t.Errorf("a restarted agent wrote %d pods/status patches, want 0 (nothing changed)", got)
	}
	waitCondition(t, cp, ns, "early", podcond.True, podcond.ReasonProgrammed)
}

// TestPodConditionStrictMode: strict mode's pod is DeniedByStrictMode until a
// policy selecting it is programmed.
func TestPodConditionStrictMode(t *testing.T) {
	cp := testenv.Start(t)
	const node, ns = "192.0.2.52", "pss"
	createNamespace(t, cp, ns)
	resolver := newLookupTableResolver("10.52.0.1", 31)
	startAgent(t, cp, agentOptions{nodeIP: node, resolver: resolver, podStatus: true, mode: EnforcingStrict})
	createPod(t, cp, ns, "web", "node-"+node, "10.52.0.1")
	waitCondition(t, cp, ns, "web", podcond.False, podcond.ReasonDeniedByStrictMode, "denied both ways")
	create(t, cp, ingressPE(ns, "web", []v1alpha1.PodEndpoint{pod(node, "10.52.0.1")}, "10.99.0.1/32", 80))
	waitCondition(t, cp, ns, "web", podcond.True, podcond.ReasonProgrammed, "PolicyEndpoint pss/web")
}

// TestPodFactsChunkNotSynced: a chunk of the pod's policy that the informer holds
// and no sync has handled yet keeps the pod Pending: the condition waits for every
// chunk, not only the one listing the pod.
func TestPodFactsChunkNotSynced(t *testing.T) {
	resolver := newLookupTableResolver("10.53.0.1", 41)
	tbl := newPodTable(bpfmaps.NewMemory(), resolver, &counters{}, testLogger(t), nil, 0)
	podIP := netip.MustParseAddr("10.53.0.1")
	keyA := translate.Key{Kind: report.KindPolicyEndpoint, Namespace: "ns", Name: "chunky-a"}
	keyB := translate.Key{Kind: report.KindPolicyEndpoint, Namespace: "ns", Name: "chunky-b"}
	policy := translate.PolicyOf(report.KindPolicyEndpoint, "ns", "chunky")
	a := &translate.Compiled{Key: keyA, UID: "a", ResourceVersion: "1", Pods: []netip.Addr{podIP}, Policy: policy, Isolated: [2]bool{true, false}}
	if res := tbl.commitVersion(keyA, "a", a, nil, nil); res.err != nil || len(res.notDone) > 0 {
		t.Fatalf("commit chunk a: %+v", res)
	}
	tbl.noteSynced(keyA, "a", "1")
	cached := func(k translate.Key) (types.UID, string, bool) {
		switch k {
		case keyA:
			return "a", "1", true
		case keyB:
			return "b", "7", true
		}
		return "", "", false
	}
	cands := []statusCandidate{{key: keyA, policy: policy, lists: true}, {key: keyB, policy: policy}}
	got := podcond.Compute(tbl.facts([]netip.Addr{podIP}, cands, false, cached))
	if got.Status != podcond.False || got.Reason != podcond.ReasonPending || !strings.Contains(got.Message, "ns/chunky-b") {
		t.Fatalf("condition with chunk b not synced = %+v, want Pending naming ns/chunky-b", got)
	}
	b := &translate.Compiled{Key: keyB, UID: "b", ResourceVersion: "7", Policy: policy}
	tbl.commitVersion(keyB, "b", b, nil, nil)
	tbl.noteSynced(keyB, "b", "7")
	if got := podcond.Compute(tbl.facts([]netip.Addr{podIP}, cands, false, cached)); got.Status != podcond.True {
		t.Fatalf("condition with every chunk synced = %+v, want True", got)
	}
}

// TestPodConditionClusterSubject: a pod that only a ClusterPolicyEndpoint selects,
// by its subject, is Pending until the controller lists it — not NoPolicy, which is
// True and would open a readiness gate before the cluster policy is in force —
// then Programmed. Relabeling the namespace out of a subject makes a pod it
// selected, and nothing lists, NoPolicy; back in, Pending again.
func TestPodConditionClusterSubject(t *testing.T) {
	cp := sharedCP(t)
	ctx := context.Background()
	const node, ns = "192.0.2.57", "pcs"
	mine := "node-" + node
	createNamespace(t, cp, ns)
	label := func(team string) {
		t.Helper()
		var n corev1.Namespace
		if err := cp.Client.Get(ctx, client.ObjectKey{Name: ns}, &n); err != nil {
			t.Fatal(err)
		}
		if n.Labels == nil {
			n.Labels = map[string]string{}
		}
		n.Labels["team"] = team
		if err := cp.Client.Update(ctx, &n); err != nil {
			t.Fatalf("label namespace %s team=%s: %v", ns, team, err)
		}
	}
	label("blue")
	resolver := newLookupTableResolver("10.57.0.1", 31, "10.57.0.2", 32)
	startAgent(t, cp, agentOptions{nodeIP: node, dp: bpfmaps.NewMemory(), resolver: resolver, podStatus: true})

	blue := &v1alpha1.ClusterPolicyEndpoint{
		ObjectMeta: metav1.ObjectMeta{Name: "pcs-blue"},
		Spec: v1alpha1.ClusterPolicyEndpointSpec{
			PolicyRef: v1alpha1.ClusterPolicyReference{Name: "blue"}, Tier: v1alpha1.TierAdmin, Priority: 5,
			Subject: v1alpha1.ClusterPolicySubject{Namespaces: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "blue"}}},
			Ingress: []v1alpha1.ClusterEndpointInfo{{Action: v1alpha1.ClusterRuleActionDeny, CIDR: "10.2.66.0/24"}},
		},
	}
	create(t, cp, blue)
	db := &v1alpha1.ClusterPolicyEndpoint{
		ObjectMeta: metav1.ObjectMeta{Name: "pcs-db"},
		Spec: v1alpha1.ClusterPolicyEndpointSpec{
			PolicyRef: v1alpha1.ClusterPolicyReference{Name: "db"}, Tier: v1alpha1.TierAdmin, Priority: 6,
			Subject: v1alpha1.ClusterPolicySubject{Pods: &v1alpha1.NamespacedPod{
				NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{"team": "blue"}},
				PodSelector:       metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}}},
			Ingress: []v1alpha1.ClusterEndpointInfo{{Action: v1alpha1.ClusterRuleActionDeny, CIDR: "10.2.67.0/24"}},
		},
	}
	create(t, cp, db)

	// The namespace subject selects web; nothing lists it yet.
	createPod(t, cp, ns, "web", mine, "10.57.0.1")
	waitCondition(t, cp, ns, "web", podcond.False, podcond.ReasonPending, "pcs-blue")
	update(t, cp, blue, func(c *v1alpha1.ClusterPolicyEndpoint) {
		c.Spec.PodSelectorEndpoints = []v1alpha1.PodEndpoint{pod(node, "10.57.0.1")}
		c.Spec.PodSelectorEndpoints[0].Namespace = ns
	})
	waitCondition(t, cp, ns, "web", podcond.True, podcond.ReasonProgrammed, "pcs-blue")

	// The pods subject selects store by namespace AND pod labels: both pending.
	store := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "store", Labels: map[string]string{"app": "db"}},
		Spec: corev1.PodSpec{NodeName: mine, Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}}}
	if err := cp.Client.Create(ctx, store); err != nil {
		t.Fatal(err)
	}
	store.Status.PodIP, store.Status.PodIPs = "10.57.0.2", []corev1.PodIP{{IP: "10.57.0.2"}}
	if err := cp.Client.Status().Update(ctx, store); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, cp, ns, "store", podcond.False, podcond.ReasonPending, "pcs-blue", "pcs-db")

	// Out of both subjects, nothing selects store: NoPolicy. Back in: Pending.
	label("green")
	waitCondition(t, cp, ns, "store", podcond.True, podcond.ReasonNoPolicy)
	label("blue")
	waitCondition(t, cp, ns, "store", podcond.False, podcond.ReasonPending, "pcs-blue", "pcs-db")
}
