package e2enode

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	ebpflink "github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/podcond"
	"github.com/npagent/npagent/internal/testenv"
	"github.com/npagent/npagent/internal/testenv/otlptest"
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

	// The collector a user would run: the agent (host network) exports to it over
	// OTLP/gRPC; it forwards to a sink inside the test.
	sink := newTelemetrySink(t)
	collector := otlptest.StartCollector(t, sink.URL)
	archive, version := agentImage(t)
	values := func(tag string) map[string]any {
		v := n.AgentValues(tag)
		v["otlp"] = map[string]any{"endpoint": "http://" + collector.GRPCAddr, "insecure": true}
		v["extraEnv"] = append(v["extraEnv"].([]any),
			map[string]any{"name": "OTEL_METRIC_EXPORT_INTERVAL", "value": "2000"},
			map[string]any{"name": "OTEL_BSP_SCHEDULE_DELAY", "value": "200"})
		return v
	}
	var agent *corev1.Pod
	ok := t.Run("AgentFromChart", func(t *testing.T) {
		n.ImportImage(t, archive)
		n.InstallAgent(t, "npagent", "npagent", values(version))
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

		// The change's latency reached the collector: its span and a histogram point.
		trigger, _ := time.Parse(time.RFC3339Nano, pe.Annotations[v1alpha1.AnnotationLastChangeTriggerTime])
		n.waitFor(t, "the PolicyEndpoint's policy.program span and latency point at the collector", time.Minute, func() error {
			if got := sink.reported(string(pe.UID), trigger); got != 1 || sink.latencyPoints() == 0 {
				return fmt.Errorf("%d spans for its trigger, %d latency points; collector: %s", got, sink.latencyPoints(), collector.Logs())
			}
			return nil
		})
		t.Logf("the trigger's span and %d latency point(s) reached the collector", sink.latencyPoints())

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
		strict := values(version)
		strict["enforcingMode"] = "strict"
		agent := n.UpgradeAgent(t, "npagent", "npagent", strict)
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
	if t.Failed() {
		return
	}

	// The pod condition as the kubelet sees it (the chart turns it on): a pod that
	// gates its readiness on npagent.io/PolicyProgrammed, in strict mode with no policy
	// yet, runs but is not Ready (denied by strict mode); a policy selecting it makes
	// it Ready — no Service would have sent it traffic before its policy was in force.
	t.Run("ReadinessGate", func(t *testing.T) {
		ctx := context.Background()
		gated := n.runGatedPod(t, "pe", "gated", map[string]string{"app": "gated"})
		if c := policyCondition(gated); c == nil || c.Status != corev1.ConditionFalse || c.Reason != podcond.ReasonDeniedByStrictMode {
			t.Fatalf("gated pod's %s = %+v, want False %s", podcond.Type, c, podcond.ReasonDeniedByStrictMode)
		}
		n.steadyGated(t, gated, 3*time.Second)
		pe := ingressPE("gated-ingress", gated, []*corev1.Pod{gated})
		written := time.Now()
		if err := n.CP.Client.Create(ctx, pe); err != nil {
			t.Fatalf("create PolicyEndpoint: %v", err)
		}
		p := n.WaitPod(t, "pe", "gated", time.Minute, func(p *corev1.Pod) error {
			if c := policyCondition(p); c == nil || c.Status != corev1.ConditionTrue {
				return fmt.Errorf("%s = %+v", podcond.Type, c)
			}
			return ready(p)
		})
		c := policyCondition(p)
		t.Logf("gated pod Ready %v after its PolicyEndpoint was written (%s %s: %s)", time.Since(written).Round(time.Millisecond), c.Status, c.Reason, c.Message)
	})
	if t.Failed() {
		return
	}

	// A rolling upgrade to a new image: the DaemonSet's one pod is replaced (the old
	// one gone before the new one is up) while clients connect every 100 ms; the
	// pinned programs judge throughout, so no allowed connection fails and no denied
	// one passes.
	t.Run("RollingUpgradeKeepsEnforcing", func(t *testing.T) {
		ctx := context.Background()
		get := func(name string) *corev1.Pod {
			p, err := n.Kube.CoreV1().Pods("pe").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return p
		}
		server, allowed, denied := get("server"), get("allowed"), get("denied")
		old := n.AgentPod(t, "npagent", time.Minute)
		nextTag := version + "-next"
		n.TagImage(t, old.Status.ContainerStatuses[0].Image, nextTag)

		const watchFor = 45 * time.Second
		type watched struct {
			out string
			err error
		}
		results := make(map[string]chan watched)
		for _, c := range []*corev1.Pod{allowed, denied} {
			ch := make(chan watched, 1)
			results[c.Name] = ch
			go func() {
				out, err := n.ExecFor(t, c, watchFor+30*time.Second, "/workload", "watch", "tcp", server.Status.PodIP+":8080", fmt.Sprint(int(watchFor.Seconds())))
				ch <- watched{out, err}
			}()
		}
		time.Sleep(3 * time.Second) // both watching before the old agent goes
		started := time.Now()
		upgraded := strictValues(values(nextTag))
		agent := n.UpgradeAgent(t, "npagent", "npagent", upgraded)
		rolled := time.Since(started)
		if agent.Name == old.Name || !strings.HasSuffix(agent.Spec.Containers[0].Image, ":"+nextTag) {
			t.Fatalf("after the upgrade the agent is %s with image %s; want a new pod with tag %s", agent.Name, agent.Spec.Containers[0].Image, nextTag)
		}
		if rolled > watchFor-5*time.Second {
			t.Fatalf("the rollout took %v: longer than the clients watched", rolled)
		}
		t.Logf("rolled %s → %s (%s) in %v", old.Name, agent.Name, agent.Spec.Containers[0].Image, rolled.Round(time.Millisecond))
		want := map[string]string{"allowed": "fail=0", "denied": "ok=0"}
		for name, ch := range results {
			w := <-ch
			if w.err != nil {
				t.Fatalf("%s's watch: %v", name, w.err)
			}
			lines := strings.Split(strings.TrimSpace(w.out), "\n")
			total := lines[len(lines)-1]
			if !strings.Contains(total, want[name]) {
				t.Errorf("%s -> server during the upgrade: %s, want %s; changes:\n%s", name, total, want[name], w.out)
				continue
			}
			t.Logf("%s -> server tcp/8080 every 100 ms through the upgrade: %s", name, total)
		}
	})
	if t.Failed() {
		return
	}

	// Uninstall as the chart says: cleanup first (every program detached, pins and
	// state removed), then helm uninstall. Nothing of npagent stays attached, and the
	// pods are open again.
	t.Run("CleanupThenUninstall", func(t *testing.T) {
		ctx := context.Background()
		pods := map[string]*corev1.Pod{}
		for _, name := range []string{"server", "allowed", "denied"} {
			p, err := n.Kube.CoreV1().Pods("pe").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			pods[name] = p
		}
		if attached := tcxPrograms(t, pods["server"]); attached == 0 {
			t.Fatal("before cleanup no tcx program is attached to the server's veth: the check below would prove nothing")
		}
		cleanup := strictValues(values(version + "-next"))
		cleanup["cleanup"] = true
		n.UpgradeAgent(t, "npagent", "npagent", cleanup)
		n.waitFor(t, "npagent's programs detached and pins removed", time.Minute, func() error {
			for name, p := range pods {
				if k := tcxPrograms(t, p); k != 0 {
					return fmt.Errorf("%d tcx programs still attached to %s's veth", k, name)
				}
			}
			if entries, err := os.ReadDir("/sys/fs/bpf/npagent"); err == nil && len(entries) > 0 {
				return fmt.Errorf("/sys/fs/bpf/npagent still holds %d entries", len(entries))
			}
			return nil
		})
		n.UninstallAgent(t, "npagent", "npagent")
		if dss, err := n.Kube.AppsV1().DaemonSets("npagent").List(ctx, metav1.ListOptions{}); err != nil || len(dss.Items) != 0 {
			t.Fatalf("after helm uninstall: daemonsets %v, err %v", len(dss.Items), err)
		}
		n.matrix(t, pods["server"], []*corev1.Pod{pods["allowed"], pods["denied"]}, map[string]bool{"allowed": true, "denied": true}, 30*time.Second)

		// A new install starts clean (no pins, no state) and enforces the policies
		// that are there: the server's ingress policy lets allowed through again, and
		// stops denied.
		n.InstallAgent(t, "npagent", "npagent", values(version))
		n.AgentPod(t, "npagent", 3*time.Minute)
		n.matrix(t, pods["server"], []*corev1.Pod{pods["allowed"], pods["denied"]}, map[string]bool{"allowed": true, "denied": false}, 30*time.Second)
	})

	// Through two upgrades, a restart in strict mode and a reinstall, each trigger was
	// reported once: the agent's seen-set state (a host path) outlived every pod, and
	// the reinstalled agent, with no state, reports no trigger older than its start.
	dups, distinct := sink.duplicates()
	if len(dups) > 0 {
		t.Errorf("triggers reported more than once across the agent's restarts: %v", dups)
	}
	if distinct < 4 {
		t.Errorf("%d distinct triggers reported, want the 4 PolicyEndpoints written", distinct)
	}
	t.Logf("%d triggers reported, each once, across 2 upgrades and a reinstall", distinct)
	if t.Failed() {
		return
	}

	// Last, as it uninstalls the agent: the local quick start, as a reader follows
	// it, with the real AWS Network Policy Controller writing the PolicyEndpoints.
	t.Run("QuickStartLocal", func(t *testing.T) { n.quickStartLocal(t, version) })
}

// runGatedPod creates a pod like RunPod's whose readiness is gated on the pod
// condition, and waits until it runs with an IP and its condition is written (not
// until it is Ready: the gate decides that).
func (n *Node) runGatedPod(t *testing.T, ns, name string, labels map[string]string) *corev1.Pod {
	t.Helper()
	pod := workloadPod(ns, name, labels)
	pod.Spec.ReadinessGates = []corev1.PodReadinessGate{{ConditionType: podcond.Type}}
	if _, err := n.Kube.CoreV1().Pods(ns).Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s/%s: %v", ns, name, err)
	}
	return n.WaitPod(t, ns, name, 2*time.Minute, func(p *corev1.Pod) error {
		if p.Status.PodIP == "" || policyCondition(p) == nil {
			return errPending(p)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.ContainersReady && c.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return errPending(p)
	})
}

// steadyGated checks pod stays not Ready for d while its containers are ready: the
// readiness gate holds it.
func (n *Node) steadyGated(t *testing.T, pod *corev1.Pod, d time.Duration) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		p, err := n.Kube.CoreV1().Pods(pod.Namespace).Get(context.Background(), pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if ready(p) == nil {
			t.Fatalf("pod %s Ready with its policy not programmed (%s = %+v)", pod.Name, podcond.Type, policyCondition(p))
		}
	}
	t.Logf("pod %s: containers ready, pod not Ready for %v (the readiness gate)", pod.Name, d)
}

// policyCondition is the pod's npagent.io/PolicyProgrammed condition, nil if none.
func policyCondition(p *corev1.Pod) *corev1.PodCondition {
	for i, c := range p.Status.Conditions {
		if c.Type == podcond.Type {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

// strictValues is v with enforcingMode strict.
func strictValues(v map[string]any) map[string]any {
	v["enforcingMode"] = "strict"
	return v
}

// tcxPrograms is how many tcx programs (ingress and egress) are attached to the
// host-side veth of pod.
func tcxPrograms(t *testing.T, pod *corev1.Pod) int {
	t.Helper()
	link, _ := hostRoute(t, net.ParseIP(pod.Status.PodIP))
	total := 0
	for _, attach := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
		res, err := ebpflink.QueryPrograms(ebpflink.QueryOptions{Target: link.Attrs().Index, Attach: attach})
		if err != nil {
			t.Fatalf("query tcx programs on %s: %v", link.Attrs().Name, err)
		}
		total += len(res.Programs)
	}
	return total
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
	pod := workloadPod(ns, name, labels)
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

// workloadPod is a pod running the workload's server, with its probes.
func workloadPod(ns, name string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
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
}

func probe(failures int32) *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080)}},
		PeriodSeconds:    probePeriod,
		FailureThreshold: failures,
		TimeoutSeconds:   1,
	}
}
