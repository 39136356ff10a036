package reconcile

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/explain"
	"github.com/npagent/npagent/internal/testenv"
	"github.com/npagent/npagent/internal/testenv/netlab"
	"github.com/npagent/npagent/internal/testenv/skip"
)

// strictLab is a pod in a network namespace of its own, dual stack, behind a veth
// whose host end also carries two non-node peers per family (an allowed one and a
// denied one). Only the host end's first address is the node's (the node set).
type strictLab struct {
	podLab
	podIP6, hostIP6 string
	allowed, denied [2]string // IPv4, IPv6 peers (not node addresses)
	route4, route6  []string  // the host routes to the pod, for del/add
	nodeAddrs       []netip.Prefix
}

func newStrictLab(t *testing.T, name string) *strictLab {
	t.Helper()
	if os.Geteuid() != 0 {
		skip.Unmet(t, "needs root: creates a network namespace, a veth pair and host routes, and loads eBPF programs (CAP_NET_ADMIN, CAP_BPF)")
	}
	netlab.RequireIP(t, "build the pod's network namespace")
	id := os.Getpid() % 100000
	sub := fmt.Sprintf("10.253.%d", id%250+1)
	sub6 := fmt.Sprintf("fd00:5743:%x:%x", id, name[0]) // "strict" ULA, per process and test
	l := &strictLab{
		podLab: podLab{
			ns:     fmt.Sprintf("strict-%s-%d", name, id),
			hostIf: fmt.Sprintf("strict%s%d", name[:1], id),
			hostIP: sub + ".1",
			podIP:  sub + ".2",
		},
		hostIP6: sub6 + "::1",
		podIP6:  sub6 + "::2",
		allowed: [2]string{sub + ".3", sub6 + "::3"},
		denied:  [2]string{sub + ".4", sub6 + "::4"},
	}
	netlab.AddNamespace(t, l.ns)
	netlab.Run(t, "ip", "link", "add", l.hostIf, "type", "veth", "peer", "name", "eth0", "netns", l.ns)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", l.hostIf).Run() })
	netlab.Run(t, "ip", "addr", "add", l.hostIP+"/24", "dev", l.hostIf)
	netlab.Run(t, "ip", "addr", "add", l.hostIP6+"/64", "dev", l.hostIf, "nodad")
	for _, a := range []string{l.allowed[0], l.denied[0]} {
		netlab.Run(t, "ip", "addr", "add", a+"/32", "dev", l.hostIf)
	}
	for _, a := range []string{l.allowed[1], l.denied[1]} {
		netlab.Run(t, "ip", "addr", "add", a+"/128", "dev", l.hostIf, "nodad")
	}
	netlab.Run(t, "ip", "link", "set", l.hostIf, "up")
	l.route4 = []string{l.podIP + "/32", "dev", l.hostIf, "scope", "link"}
	l.route6 = []string{l.podIP6 + "/128", "dev", l.hostIf}
	netlab.Run(t, append([]string{"ip", "route", "add"}, l.route4...)...)
	netlab.Run(t, append([]string{"ip", "-6", "route", "add"}, l.route6...)...)
	netlab.Run(t, "ip", "-n", l.ns, "addr", "add", l.podIP+"/24", "dev", "eth0")
	netlab.Run(t, "ip", "-n", l.ns, "addr", "add", l.podIP6+"/64", "dev", "eth0", "nodad")
	netlab.Run(t, "ip", "-n", l.ns, "link", "set", "eth0", "up")
	link, err := net.InterfaceByName(l.hostIf)
	if err != nil {
		t.Fatal(err)
	}
	l.hostIndex = link.Index
	l.nodeAddrs = []netip.Prefix{netip.MustParsePrefix(l.hostIP + "/32"), netip.MustParsePrefix(l.hostIP6 + "/128")}
	netlab.ServeEcho(t, l.ns, "tcp4", l.podIP+":8080")
	netlab.ServeEcho(t, l.ns, "tcp6", "["+l.podIP6+"]:8080")
	for _, from := range l.sources() {
		testenv.Eventually(t, 10*time.Second, from+" reaches the pod before any policy", func() bool { return l.dial(from) == nil })
	}
	return l
}

// sources are every address the lab dials the pod from: the node's, the allowed
// and the denied peer's, both families.
func (l *strictLab) sources() []string {
	return []string{l.hostIP, l.hostIP6, l.allowed[0], l.allowed[1], l.denied[0], l.denied[1]}
}

// dial connects from src to the pod's port 8080 in src's family and exchanges one
// message.
func (l *strictLab) dial(src string) error {
	if strings.Contains(src, ":") {
		return exchangeFrom(src, "["+l.podIP6+"]:8080")
	}
	return exchangeFrom(src, l.podIP+":8080")
}

// expect checks which sources reach the pod: those in pass do, every other does not.
func (l *strictLab) expect(t *testing.T, when string, pass ...string) {
	t.Helper()
	for _, src := range l.sources() {
		err := l.dial(src)
		switch want := slices.Contains(pass, src); {
		case want && err != nil:
			t.Errorf("%s: %s to the pod: %v, want it to connect", when, src, err)
		case !want && err == nil:
			t.Errorf("%s: %s connected to the pod, want it dropped", when, src)
		}
	}
}

// createPod writes a pod scheduled on node with the lab's addresses, as the kubelet
// would report them once the CNI gave it its IPs.
func createPod(t *testing.T, cp *testenv.ControlPlane, ns, name, node string, ips ...string) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}},
	}
	ctx := context.Background()
	if err := cp.Client.Create(ctx, p); err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	p.Status.PodIP = ips[0]
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	if err := cp.Client.Status().Update(ctx, p); err != nil {
		t.Fatalf("set pod %s IPs: %v", name, err)
	}
	return p
}

// strictPE allows the lab's allowed peers (both families) to port 8080 of its pod.
func (l *strictLab) strictPE(ns, node string) *v1alpha1.PolicyEndpoint {
	pe := ingressPE(ns, "web", []v1alpha1.PodEndpoint{pod(node, l.podIP), pod(node, l.podIP6)}, l.allowed[0]+"/32", 8080)
	pe.Spec.Ingress = append(pe.Spec.Ingress, v1alpha1.EndpointInfo{CIDR: v1alpha1.NetworkAddress(l.allowed[1] + "/128"),
		Ports: []v1alpha1.Port{{Port: ptr[int32](8080)}}})
	return pe
}

// TestEBPFStrictMode: with --enforcing-mode=strict, a pod that appears before any
// PolicyEndpoint names it is denied from every non-node peer, both families, while
// the node reaches it; an interface not there yet is retried; its PolicyEndpoint then
// replaces the denial with its policy; once no policy selects it, it is denied again
// (not opened); the denial survives a restart of the agent (the leftover cleanup
// does not open it); the pod's deletion removes its state. Real apiserver, real eBPF,
// real packets.
func TestEBPFStrictMode(t *testing.T) {
	l := newStrictLab(t, "s")
	dp := openKernelDataplane(t, "strict")
	if err := dp.SetNodeAddrs(l.nodeAddrs); err != nil {
		t.Fatal(err)
	}
	cp := sharedCP(t)
	const node = "192.0.2.31"
	createNamespace(t, cp, "strict")
	state := t.TempDir() + "/seen.state"
	logs := &logBuffer{}
	opts := agentOptions{nodeIP: node, dp: dp, state: state, mode: EnforcingStrict, logger: slog.New(slog.NewTextHandler(logs, nil))}
	a := startAgent(t, cp, opts)

	// The pod's IPs are known before its route is there (the CNI not done): retried.
	netlab.Run(t, append([]string{"ip", "route", "del"}, l.route4...)...)
	netlab.Run(t, append([]string{"ip", "-6", "route", "del"}, l.route6...)...)
	p := createPod(t, cp, "strict", "web", "node-"+node, l.podIP, l.podIP6)
	time.Sleep(300 * time.Millisecond)
	if n := a.c.Stats().PodsStrictDenied; n != 0 {
		t.Fatalf("%d pods denied before the pod's interface could be resolved", n)
	}
	netlab.Run(t, append([]string{"ip", "route", "add"}, l.route4...)...)
	netlab.Run(t, append([]string{"ip", "-6", "route", "add"}, l.route6...)...)
	testenv.Eventually(t, 20*time.Second, "new pod denied by strict mode", func() bool { return a.c.Stats().PodsStrictDenied == 2 })
	l.expect(t, "new pod, no policy yet", l.hostIP, l.hostIP6)
	if got := logs.lines("pod denied by strict mode until a policy selects it", l.podIP); len(got) == 0 {
		t.Errorf("no log line naming the denied pod %s; logs:\n%s", l.podIP, logs.String())
	}
	if ex := a.c.ExplainPod(explain.PodQuery{Namespace: "strict", Name: "web"}); !ex.StrictDenied || ex.IP != l.podIP {
		t.Errorf("explain pod strict/web = %+v, want StrictDenied for %s", ex, l.podIP)
	}

	// Its PolicyEndpoint arrives: its policy replaces the denial.
	pe := l.strictPE("strict", node)
	create(t, cp, pe)
	testenv.Eventually(t, 20*time.Second, "record for the PolicyEndpoint", func() bool { return len(a.sink.recordsFor(string(pe.UID))) == 1 })
	if n := a.c.Stats().PodsStrictDenied; n != 0 {
		t.Errorf("%d pods denied by strict mode once the policy is committed, want 0", n)
	}
	l.expect(t, "policy committed", l.hostIP, l.hostIP6, l.allowed[0], l.allowed[1])

	// No policy selects it any more: denied again, not opened.
	remove(t, cp, pe)
	testenv.Eventually(t, 20*time.Second, "denied again once its policy is gone", func() bool { return a.c.Stats().PodsStrictDenied == 2 })
	if got := dp.Pods(); !slices.Contains(got, l.hostIndex) {
		t.Fatalf("dataplane pods = %v, want the denied veth %d", got, l.hostIndex)
	}
	l.expect(t, "policy deleted", l.hostIP, l.hostIP6)

	// A restart: the new process keeps the pod denied, from its pins on.
	a.stop()
	if err := dp.Close(); err != nil {
		t.Fatal(err)
	}
	dp = openKernelDataplane(t, "strict")
	if err := dp.SetNodeAddrs(l.nodeAddrs); err != nil {
		t.Fatal(err)
	}
	l.expect(t, "agent down", l.hostIP, l.hostIP6)
	opts.dp = dp
	b := startAgent(t, cp, opts)
	testenv.Eventually(t, 20*time.Second, "initial sync done", func() bool { return initialSyncDone(b.c) })
	testenv.Eventually(t, 20*time.Second, "pod denied by the new process", func() bool { return b.c.Stats().PodsStrictDenied == 2 })
	if n := b.c.Stats().Removes; n != 0 {
		t.Errorf("the new process removed %d pods' state: the strict denial was opened", n)
	}
	l.expect(t, "after the restart", l.hostIP, l.hostIP6)

	// The pod is deleted (as the kubelet confirms it, grace period over): its state
	// goes.
	if err := cp.Client.Delete(context.Background(), p, client.GracePeriodSeconds(0)); err != nil {
		t.Fatalf("delete pod: %v", err)
	}
	testenv.Eventually(t, 20*time.Second, "pod state removed", func() bool { return !slices.Contains(dp.Pods(), l.hostIndex) })
	if n := b.c.Stats().PodsStrictDenied; n != 0 {
		t.Errorf("%d pods denied after the pod's deletion, want 0", n)
	}
}

// TestEBPFStandardModeOpenUntilProgrammed: with the default (standard) mode the same
// new pod is open until its PolicyEndpoint is committed, and open again once it is
// deleted; the agent does not watch pods.
func TestEBPFStandardModeOpenUntilProgrammed(t *testing.T) {
	l := newStrictLab(t, "d")
	dp := openKernelDataplane(t, "standard")
	if err := dp.SetNodeAddrs(l.nodeAddrs); err != nil {
		t.Fatal(err)
	}
	cp := sharedCP(t)
	const node = "192.0.2.32"
	createNamespace(t, cp, "standard")
	a := startAgent(t, cp, agentOptions{nodeIP: node, dp: dp})
	if a.c.podWatch != nil {
		t.Fatal("standard mode built a pod watch")
	}
	createPod(t, cp, "standard", "web", "node-"+node, l.podIP, l.podIP6)
	time.Sleep(500 * time.Millisecond)
	all := l.sources()
	l.expect(t, "new pod, no policy yet", all...)
	if got := dp.Pods(); len(got) != 0 {
		t.Errorf("dataplane pods = %v before any policy, want none", got)
	}

	pe := l.strictPE("standard", node)
	create(t, cp, pe)
	testenv.Eventually(t, 20*time.Second, "record for the PolicyEndpoint", func() bool { return len(a.sink.recordsFor(string(pe.UID))) == 1 })
	l.expect(t, "policy committed", l.hostIP, l.hostIP6, l.allowed[0], l.allowed[1])

	remove(t, cp, pe)
	testenv.Eventually(t, 20*time.Second, "pod state removed", func() bool { return len(dp.Pods()) == 0 })
	l.expect(t, "policy deleted", all...)
}
