package e2enode

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/npagent/npagent/internal/testenv"
)

// EnvE2ENode selects this package's tests (make e2e-node sets it). Without it they
// skip: booting a node takes minutes and changes host state (IPv4 forwarding), so it
// is a profile, not a prerequisite, and make test leaves it out.
const EnvE2ENode = "NPAGENT_E2E_NODE"

// WorkloadImage is test/e2enode/images/workload, packed and imported by the test.
const WorkloadImage = "localhost/npagent-e2e/workload:1"

func TestNode(t *testing.T) {
	if os.Getenv(EnvE2ENode) != "1" {
		t.Skipf("%s=1 selects the real-node tests (make e2e-node)", EnvE2ENode)
	}
	n := Start(t)
	n.ImportImage(t, packWorkload(t, n.Dir))

	t.Run("PodGetsVethAndHostRoute", func(t *testing.T) {
		createNamespace(t, n, "plain")
		pod := n.RunPod(t, "plain", "plain", nil)
		ip := net.ParseIP(pod.Status.PodIP)
		_, cidr, _ := net.ParseCIDR(PodCIDR)
		if ip == nil || !cidr.Contains(ip) {
			t.Fatalf("pod IP %q, want one in %s", pod.Status.PodIP, PodCIDR)
		}
		link, route := hostRoute(t, ip)
		if link.Type() != "veth" {
			t.Fatalf("host route to %s goes through %s (%s), want a veth", ip, link.Attrs().Name, link.Type())
		}
		// The source address the node's own traffic (the kubelet's probes) carries to
		// the pod, and the addresses on the host-side veth (ptp puts the pod's gateway
		// there): what the agent must recognise as the node's.
		src := "?"
		if rs, err := netlink.RouteGet(ip); err == nil && len(rs) > 0 && rs[0].Src != nil {
			src = rs[0].Src.String()
		}
		addrs, _ := netlink.AddrList(link, netlink.FAMILY_V4)
		t.Logf("pod %s: IP %s, host route %s dev %s (veth, addresses %v); the node reaches it from %s", pod.Name, ip, route.Dst, link.Attrs().Name, addrs, src)
	})
	if t.Failed() {
		return
	}

	archive, version := agentImage(t)
	var agent *corev1.Pod
	ok := t.Run("AgentFromChart", func(t *testing.T) {
		n.ImportImage(t, archive)
		n.InstallAgent(t, "npagent", "npagent", n.AgentValues(version))
		agent = n.AgentPod(t, "npagent", 3*time.Minute)
		t.Logf("agent pod %s Ready (image %s)", agent.Name, agent.Status.ContainerStatuses[0].Image)
		n.checkAgentPrivileges(t, agent)
	})
	if !ok {
		return
	}

	t.Run("EnforcesBetweenPodsAndProbesPass", func(t *testing.T) {
		ctx := context.Background()
		createNamespace(t, n, "pe")
		server := n.RunPod(t, "pe", "server", map[string]string{"app": "server"})
		allowed := n.RunPod(t, "pe", "allowed", map[string]string{"app": "allowed"})
		denied := n.RunPod(t, "pe", "denied", map[string]string{"app": "denied"})
		clients := []*corev1.Pod{allowed, denied}
		n.matrix(t, server, clients, map[string]bool{"allowed": true, "denied": true}, 10*time.Second)

		pe := ingressPE("server-ingress", server, []*corev1.Pod{allowed})
		if err := n.CP.Client.Create(ctx, pe); err != nil {
			t.Fatalf("create PolicyEndpoint: %v", err)
		}
		n.matrix(t, server, clients, map[string]bool{"allowed": true, "denied": false}, 30*time.Second)

		// The kubelet's HTTP probes come from the node: the server, isolated for
		// ingress, stays Ready and is never restarted.
		n.steadyReady(t, server, 3*probePeriod*time.Second+2*time.Second)

		if err := n.CP.Client.Delete(ctx, pe); err != nil {
			t.Fatalf("delete PolicyEndpoint: %v", err)
		}
		n.matrix(t, server, clients, map[string]bool{"allowed": true, "denied": true}, 30*time.Second)
	})
	if t.Failed() {
		return
	}

	// Strict mode (helm upgrade): a pod no policy selects is denied both ways, the
	// node's traffic excepted — so the kubelet's probes must still pass, for the
	// isolated server and for the unselected clients alike.
	t.Run("StrictModeProbesPass", func(t *testing.T) {
		ctx := context.Background()
		values := n.AgentValues(version)
		values["enforcingMode"] = "strict"
		agent := n.UpgradeAgent(t, "npagent", "npagent", values)
		if !slices.Contains(agent.Spec.Containers[0].Args, "--enforcing-mode=strict") {
			t.Fatalf("agent args %v: no --enforcing-mode=strict", agent.Spec.Containers[0].Args)
		}
		get := func(name string) *corev1.Pod {
			p, err := n.Kube.CoreV1().Pods("pe").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return p
		}
		server, allowed, denied := get("server"), get("allowed"), get("denied")
		pe := ingressPE("server-ingress-strict", server, []*corev1.Pod{allowed})
		if err := n.CP.Client.Create(ctx, pe); err != nil {
			t.Fatalf("create PolicyEndpoint: %v", err)
		}
		// allowed is selected by no policy: in strict mode it is denied both ways,
		// so it no longer reaches the server either.
		n.matrix(t, server, []*corev1.Pod{allowed, denied}, map[string]bool{"allowed": false, "denied": false}, 30*time.Second)
		// A policy selecting allowed, egress to the server: now it reaches it again.
		egress := ingressPE("allowed-egress-strict", allowed, nil)
		egress.Spec.PodIsolation = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
		egress.Spec.Egress = ingressPE("", server, []*corev1.Pod{server}).Spec.Ingress
		if err := n.CP.Client.Create(ctx, egress); err != nil {
			t.Fatalf("create PolicyEndpoint: %v", err)
		}
		n.matrix(t, server, []*corev1.Pod{allowed, denied}, map[string]bool{"allowed": true, "denied": false}, 30*time.Second)
		n.steadyReady(t, server, 3*probePeriod*time.Second+2*time.Second)
		n.steadyReady(t, denied, 2*time.Second)
	})
}

// probePeriod is the workload's probes' period, in seconds (failure threshold 3).
const probePeriod = 1

// steadyReady checks pod stays Ready, with no container restart, for d.
func (n *Node) steadyReady(t *testing.T, pod *corev1.Pod, d time.Duration) {
	t.Helper()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		p, err := n.Kube.CoreV1().Pods(pod.Namespace).Get(context.Background(), pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := ready(p); err != nil {
			t.Fatalf("pod %s not Ready while isolated: %v; events: %s", pod.Name, err, n.events(pod.Namespace, pod.Name))
		}
		if r := p.Status.ContainerStatuses[0].RestartCount; r != 0 {
			t.Fatalf("pod %s restarted %d times while isolated (liveness probe failed); events: %s", pod.Name, r, n.events(pod.Namespace, pod.Name))
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("pod %s stayed Ready with 0 restarts for %v (kubelet liveness and readiness probes every %ds)", pod.Name, d, probePeriod)
}

// hostRoute returns the host's route to ip (a /32 the CNI added) and its interface.
func hostRoute(t *testing.T, ip net.IP) (netlink.Link, netlink.Route) {
	t.Helper()
	routes, err := netlink.RouteGet(ip)
	if err != nil || len(routes) == 0 {
		t.Fatalf("route to %s: %v", ip, err)
	}
	link, err := netlink.LinkByIndex(routes[0].LinkIndex)
	if err != nil {
		t.Fatal(err)
	}
	all, err := netlink.RouteList(link, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range all {
		if r.Dst != nil && r.Dst.IP.Equal(ip) {
			if ones, _ := r.Dst.Mask.Size(); ones == 32 {
				return link, r
			}
		}
	}
	t.Fatalf("no /32 route to %s on %s: %v", ip, link.Attrs().Name, all)
	return nil, netlink.Route{}
}

// packWorkload builds test/e2enode/images/workload into an image archive in dir.
func packWorkload(t *testing.T, dir string) string {
	t.Helper()
	out := filepath.Join(dir, "workload.tar")
	cmd := exec.Command("go", "run", "./test/e2enode/images/pack", "-pkg", "./test/e2enode/images/workload", "-image", WorkloadImage, "-out", out)
	cmd.Dir = testenv.RepoRoot()
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pack workload: %v\n%s", err, b)
	}
	return out
}

// RunPod creates a pod running the workload's server (labels as given) in ns and
// waits until it is Running with an IP.
func (n *Node) RunPod(t *testing.T, ns, name string, labels map[string]string) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{
				Name:            "workload",
				Image:           WorkloadImage,
				ImagePullPolicy: corev1.PullNever,
				Args:            []string{"serve"},
				// A startup probe first: on this loaded 2-core machine a container may
				// take seconds to listen, and liveness counts only after it passes.
				StartupProbe:   probe(30),
				LivenessProbe:  probe(3),
				ReadinessProbe: probe(3),
			}},
		},
	}
	if _, err := n.Kube.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s/%s: %v", ns, name, err)
	}
	return n.WaitPod(t, ns, name, 2*time.Minute, func(p *corev1.Pod) error {
		if p.Status.PodIP == "" {
			return errPending(p)
		}
		return ready(p)
	})
}

func probe(failures int32) *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080)}},
		PeriodSeconds:    probePeriod,
		FailureThreshold: failures,
		TimeoutSeconds:   1,
	}
}
