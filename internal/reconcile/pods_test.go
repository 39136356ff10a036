package reconcile

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/seen"
	"github.com/npagent/npagent/internal/testenv"
)

func TestParseEnforcingMode(t *testing.T) {
	for in, want := range map[string]EnforcingMode{"": EnforcingStandard, "standard": EnforcingStandard, "strict": EnforcingStrict} {
		if got, err := ParseEnforcingMode(in); err != nil || got != want {
			t.Errorf("ParseEnforcingMode(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"Strict", "default-deny", " strict"} {
		if _, err := ParseEnforcingMode(in); err == nil {
			t.Errorf("ParseEnforcingMode(%q) accepted", in)
		}
	}
}

func addrs(s ...string) []netip.Addr {
	out := make([]netip.Addr, len(s))
	for i, a := range s {
		out[i] = netip.MustParseAddr(a)
	}
	return out
}

// TestPodAddrs: what of a pod strict mode enforces.
func TestPodAddrs(t *testing.T) {
	pod := func(change func(*corev1.Pod)) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}}
		change(p)
		return p
	}
	for _, tt := range []struct {
		name string
		pod  *corev1.Pod
		want []netip.Addr
	}{
		{"dual stack, sorted, no duplicates", pod(func(p *corev1.Pod) {
			p.Status.PodIPs = []corev1.PodIP{{IP: "fd00::7"}, {IP: "10.0.0.7"}, {IP: "10.0.0.7"}}
		}), addrs("10.0.0.7", "fd00::7")},
		{"podIP alone", pod(func(p *corev1.Pod) { p.Status.PodIP = "10.0.0.8" }), addrs("10.0.0.8")},
		{"IPv4-mapped unmapped", pod(func(p *corev1.Pod) { p.Status.PodIP = "::ffff:10.0.0.9" }), addrs("10.0.0.9")},
		{"no IP yet", pod(func(*corev1.Pod) {}), nil},
		{"unparsable IP", pod(func(p *corev1.Pod) { p.Status.PodIP = "10.0.0" }), nil},
		{"host network", pod(func(p *corev1.Pod) { p.Spec.HostNetwork = true; p.Status.PodIP = "192.0.2.1" }), nil},
		{"succeeded", pod(func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded; p.Status.PodIP = "10.0.0.10" }), nil},
		{"failed", pod(func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed; p.Status.PodIP = "10.0.0.11" }), nil},
	} {
		stripped, _ := stripPod(tt.pod)
		key, got, ok := podAddrs(stripped)
		if !ok || key != "ns/p" || !slices.Equal(got, tt.want) {
			t.Errorf("%s: podAddrs = %q %v %v, want ns/p %v", tt.name, key, got, ok, tt.want)
		}
	}
	if _, _, ok := podAddrs(&corev1.Node{}); ok {
		t.Error("podAddrs accepted a Node")
	}
}

// TestLocalPodSet: addresses are counted per pod (an IP two pods report stays until
// both let it go), unchanged sets are no-ops, and the addresses a pod lost are
// handed to the worker once.
func TestLocalPodSet(t *testing.T) {
	s := newLocalPodSet()
	a, b, c := addrs("10.0.0.1")[0], addrs("10.0.0.2")[0], addrs("fd00::1")[0]
	if !s.set("ns/x", []netip.Addr{a, c}) || s.set("ns/x", []netip.Addr{a, c}) {
		t.Fatal("set: want a change, then a no-op")
	}
	if got := s.checkout("ns/x"); !slices.Equal(got, []netip.Addr{a, c}) {
		t.Errorf("checkout = %v, want its addresses", got)
	}
	s.set("ns/y", []netip.Addr{a}) // the old pod's IP reused
	s.set("ns/x", []netip.Addr{b})
	if !s.has(a) || !s.has(b) || s.has(c) {
		t.Errorf("has a %v b %v c %v, want true true false", s.has(a), s.has(b), s.has(c))
	}
	if got := s.checkout("ns/x"); !slices.Equal(got, []netip.Addr{a, b, c}) {
		t.Errorf("checkout after a change = %v, want the new address and the two lost", got)
	}
	if got := s.checkout("ns/x"); !slices.Equal(got, []netip.Addr{b}) {
		t.Errorf("second checkout = %v, want the current address only", got)
	}
	s.putBack("ns/x", []netip.Addr{c})
	if got := s.checkout("ns/x"); !slices.Equal(got, []netip.Addr{b, c}) {
		t.Errorf("checkout after putBack = %v", got)
	}
	s.set("ns/y", nil)
	s.set("ns/x", nil)
	if s.has(a) || s.has(b) || len(s.all()) != 0 || len(s.keys()) != 0 {
		t.Errorf("after both pods went: all %v keys %v", s.all(), s.keys())
	}
}

// TestStrictModePods runs strict mode against a real apiserver with the memory
// dataplane: only this node's pods with an IP, not on the host network and not done,
// are denied; a pod's IP reported later is denied then; a pod that finishes is let
// go; standard mode reads no pods.
func TestStrictModePods(t *testing.T) {
	cp := sharedCP(t)
	const node = "192.0.2.41"
	createNamespace(t, cp, "sp")
	resolver := newLookupTableResolver("10.9.0.1", 11, "10.9.0.2", 12, "10.9.0.3", 13, "10.9.0.4", 14, "fd00:9::1", 11)
	dp := bpfmaps.NewMemory()
	a := startAgent(t, cp, agentOptions{nodeIP: node, dp: dp, resolver: resolver, mode: EnforcingStrict})
	denied := func(ifindex int) bool {
		return slices.Contains(dp.Pods(), ifindex) &&
			!dp.Verdict(ifindex, bpfmaps.Ingress, netip.MustParseAddr("10.99.0.1"), bpfmaps.ProtocolTCP, 80) &&
			!dp.Verdict(ifindex, bpfmaps.Egress, netip.MustParseAddr("10.99.0.1"), bpfmaps.ProtocolTCP, 80)
	}
	mine := "node-" + node
	web := createPod(t, cp, "sp", "web", mine, "10.9.0.1", "fd00:9::1")
	hostNet := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "sp", Name: "hostnet"},
		Spec: corev1.PodSpec{NodeName: mine, HostNetwork: true, Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}}}
	if err := cp.Client.Create(context.Background(), hostNet); err != nil {
		t.Fatal(err)
	}
	hostNet.Status.PodIP = "10.9.0.2" // stands for the node's address
	if err := cp.Client.Status().Update(context.Background(), hostNet); err != nil {
		t.Fatal(err)
	}
	createPod(t, cp, "sp", "elsewhere", "another-node", "10.9.0.3")
	later := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "sp", Name: "later"},
		Spec: corev1.PodSpec{NodeName: mine, Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}}}
	if err := cp.Client.Create(context.Background(), later); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "pod web denied", func() bool { return denied(11) })
	time.Sleep(300 * time.Millisecond)
	if got := dp.Pods(); !slices.Equal(got, []int{11}) {
		t.Errorf("dataplane pods = %v, want only web's 11 (not the host-network pod, another node's, one without IP)", got)
	}
	later.Status.PodIP = "10.9.0.4"
	if err := cp.Client.Status().Update(context.Background(), later); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "pod later denied once it has an IP", func() bool { return denied(14) })

	// A policy selecting web by its IPv4 address alone replaces its denial; the
	// IPv6 address of the same interface does not take it back.
	pe := ingressPE("sp", "web", []v1alpha1.PodEndpoint{pod(node, "10.9.0.1")}, "10.99.0.1/32", 80)
	create(t, cp, pe)
	testenv.Eventually(t, 10*time.Second, "record for the PolicyEndpoint", func() bool { return len(a.sink.recordsFor(string(pe.UID))) == 1 })
	if !dp.Verdict(11, bpfmaps.Ingress, netip.MustParseAddr("10.99.0.1"), bpfmaps.ProtocolTCP, 80) {
		t.Error("web's policy not in force")
	}
	if n := a.c.Stats().PodsStrictDenied; n != 1 {
		t.Errorf("pods strict-denied = %d, want 1 (later)", n)
	}
	// Its PolicyEndpoint stops selecting it: denied again, not opened; then back.
	update(t, cp, pe, func(pe *v1alpha1.PolicyEndpoint) { pe.Spec.PodSelectorEndpoints = nil })
	testenv.Eventually(t, 10*time.Second, "web denied again once no policy selects it", func() bool { return denied(11) })
	update(t, cp, pe, func(pe *v1alpha1.PolicyEndpoint) {
		pe.Spec.PodSelectorEndpoints = []v1alpha1.PodEndpoint{pod(node, "10.9.0.1")}
		pe.Spec.PodSelectorEndpoints[0].Namespace = "sp"
	})
	testenv.Eventually(t, 10*time.Second, "web's policy back", func() bool {
		return dp.Verdict(11, bpfmaps.Ingress, netip.MustParseAddr("10.99.0.1"), bpfmaps.ProtocolTCP, 80)
	})

	// The pod finishes: its interface is gone and its IP may be reused; let it go.
	later.Status.Phase = corev1.PodSucceeded
	if err := cp.Client.Status().Update(context.Background(), later); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "finished pod's state removed", func() bool { return !slices.Contains(dp.Pods(), 14) })
	if err := cp.Client.Delete(context.Background(), web, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if !slices.Contains(dp.Pods(), 11) {
		t.Error("web's state removed while its PolicyEndpoint still selects it")
	}
}

// TestStrictModeWithoutPodRBAC: a strict agent that may not list pods says so once,
// plainly, and is not ready (its pod cache cannot sync).
func TestStrictModeWithoutPodRBAC(t *testing.T) {
	cp := sharedCP(t)
	ctx := context.Background()
	const user = "strict-agent-without-pods"
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: user}, Rules: []rbacv1.PolicyRule{{
		APIGroups: []string{"networking.k8s.aws"}, Resources: []string{"policyendpoints", "clusterpolicyendpoints"}, Verbs: []string{"get", "list", "watch"}}}}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: user},
		Subjects: []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: user}}}
	for _, o := range []client.Object{role, binding} {
		if err := cp.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	restConfig := rest.CopyConfig(cp.Config)
	restConfig.Impersonate = rest.ImpersonationConfig{UserName: user}
	set, err := seen.New(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	logs := &logBuffer{}
	c, err := New(restConfig, Config{NodeName: "node-192.0.2.42", NodeIP: netip.MustParseAddr("192.0.2.42"), Dataplane: bpfmaps.NewMemory(),
		Seen: set, EnforcingMode: EnforcingStrict, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	t.Cleanup(func() { cancel(); <-done })
	testenv.Eventually(t, 20*time.Second, "forbidden logged", func() bool {
		return len(logs.lines("listing this node's pods is forbidden", "grant get, list and watch on pods")) > 0
	})
	time.Sleep(2 * time.Second) // a retry or two of the reflector
	if n := len(logs.lines("listing this node's pods is forbidden")); n != 1 {
		t.Errorf("logged %d times, want once", n)
	}
	if c.HasSynced() {
		t.Error("ready without its pod cache")
	}
}

// BenchmarkPodEvent is the strict mode's pod handler on the event it sees most: a
// status update that leaves the pod's addresses as they were (dropped, nothing
// queued), among 110 pods of a node.
func BenchmarkPodEvent(b *testing.B) {
	s := newLocalPodSet()
	pods := make([]any, 110)
	for i := range pods {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("p%d", i)},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: fmt.Sprintf("10.0.%d.%d", i/250, i%250+1)}, {IP: fmt.Sprintf("fd00::%x", i+1)}}}}
		pods[i], _ = stripPod(p)
		key, a, _ := podAddrs(pods[i])
		s.set(key, a)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		key, a, ok := podAddrs(pods[i%len(pods)])
		if ok && s.set(key, a) {
			b.Fatal("unchanged pod reported as changed")
		}
	}
}

// TestStrictModeIsolatesBothWays: in strict mode a pod whose policy cannot be
// committed is isolated both ways, not only in the directions its policy constrains,
// even when its PolicyEndpoint comes before the pod watch reports it (the pod then
// belongs to the object's retries, not to the pod worker).
func TestStrictModeIsolatesBothWays(t *testing.T) {
	cp := sharedCP(t)
	const node = "192.0.2.43"
	createNamespace(t, cp, "iso")
	dp := bpfmaps.NewMemoryWithLimits(bpfmaps.Limits{EntriesV4: 8})
	a := startAgent(t, cp, agentOptions{nodeIP: node, dp: dp, resolver: newLookupTableResolver("10.8.0.1", 21), mode: EnforcingStrict})
	pe := ingressPE("iso", "wide", []v1alpha1.PodEndpoint{pod(node, "10.8.0.1")}, "10.99.0.1/32", 80)
	for i := range 15 { // 16 entries do not fit a trie of 8
		pe.Spec.Ingress = append(pe.Spec.Ingress, v1alpha1.EndpointInfo{CIDR: v1alpha1.NetworkAddress(fmt.Sprintf("10.77.%d.0/24", i))})
	}
	create(t, cp, pe)
	testenv.Eventually(t, 10*time.Second, "pod isolated", func() bool { return a.c.Stats().PodsIsolated == 1 })
	createPod(t, cp, "iso", "wide-0", "node-"+node, "10.8.0.1")
	time.Sleep(300 * time.Millisecond) // the pod worker had its turn
	peer := netip.MustParseAddr("10.99.0.1")
	if dp.Verdict(21, bpfmaps.Ingress, peer, bpfmaps.ProtocolTCP, 80) || dp.Verdict(21, bpfmaps.Egress, peer, bpfmaps.ProtocolTCP, 80) {
		t.Errorf("ingress allowed %v, egress allowed %v: want both denied until the policy is committed",
			dp.Verdict(21, bpfmaps.Ingress, peer, bpfmaps.ProtocolTCP, 80), dp.Verdict(21, bpfmaps.Egress, peer, bpfmaps.ProtocolTCP, 80))
	}
}
