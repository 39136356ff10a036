package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/testenv"
	"github.com/npagent/npagent/internal/testenv/netlab"
	"github.com/npagent/npagent/internal/testenv/skip"
)

// Capability numbers (linux/capability.h): what the DaemonSet grants, and nothing else.
const (
	capNetAdmin = 12
	capBPF      = 39
)

// TestAgentEnforcesWithOnlyBPFAndNetAdmin runs the binary as the chart does: root
// with exactly CAP_BPF and CAP_NET_ADMIN in its bounding set (setpriv; no_new_privs),
// the eBPF dataplane on the host's bpffs, in a node of its own (a network namespace
// holding a pod's and a peer's veths, routed between them). It programs a
// PolicyEndpoint from the real apiserver, and real TCP from the peer then passes to
// the allowed port and not to another; the process's effective set is checked too,
// so the test cannot pass with more privilege than the chart grants.
func TestAgentEnforcesWithOnlyBPFAndNetAdmin(t *testing.T) {
	skipIfShort(t)
	if os.Geteuid() != 0 {
		skip.Unmet(t, "needs root: builds network namespaces and runs the agent with CAP_BPF and CAP_NET_ADMIN")
	}
	for _, tool := range []string{"setpriv", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			skip.Unmet(t, "needs %s (util-linux) to run the agent in a node namespace with a reduced capability set", tool)
		}
	}
	netlab.RequireIP(t, "build the node, pod and peer namespaces")
	netlab.HostBPFFS(t) // the host's part: the agent never mounts it

	id := os.Getpid() % 250
	node, pod, peer := fmt.Sprintf("npc-node-%d", id), fmt.Sprintf("npc-pod-%d", id), fmt.Sprintf("npc-peer-%d", id)
	uplinkHost, nodeIP := fmt.Sprintf("10.205.%d.1", id), fmt.Sprintf("10.205.%d.2", id)
	podIP, peerIP := fmt.Sprintf("10.206.%d.2", id), fmt.Sprintf("10.206.%d.130", id)
	for _, ns := range []string{node, pod, peer} {
		netlab.AddNamespace(t, ns)
	}
	// The node's uplink to the host namespace, where the apiserver is (through a proxy).
	uplink := fmt.Sprintf("npc%d", id)
	netlab.Run(t, "ip", "link", "add", uplink, "type", "veth", "peer", "name", "up0", "netns", node)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", uplink).Run() })
	netlab.Run(t, "ip", "addr", "add", uplinkHost+"/30", "dev", uplink)
	netlab.Run(t, "ip", "link", "set", uplink, "up")
	netlab.Run(t, "ip", "-n", node, "addr", "add", nodeIP+"/30", "dev", "up0")
	netlab.Run(t, "ip", "-n", node, "link", "set", "up0", "up")
	// Pod and peer behind veths of the node, each with a host route as a CNI makes it.
	for _, p := range []struct{ ns, host, gw, addr string }{
		{pod, "eni1", fmt.Sprintf("10.206.%d.1", id), podIP},
		{peer, "eni2", fmt.Sprintf("10.206.%d.129", id), peerIP},
	} {
		netlab.Run(t, "ip", "-n", node, "link", "add", p.host, "type", "veth", "peer", "name", "eth0", "netns", p.ns)
		netlab.Run(t, "ip", "-n", node, "addr", "add", p.gw+"/32", "dev", p.host)
		netlab.Run(t, "ip", "-n", node, "link", "set", p.host, "up")
		netlab.Run(t, "ip", "-n", node, "route", "add", p.addr+"/32", "dev", p.host, "scope", "link")
		netlab.Run(t, "ip", "-n", p.ns, "addr", "add", p.addr+"/32", "dev", "eth0")
		netlab.Run(t, "ip", "-n", p.ns, "link", "set", "eth0", "up")
		netlab.Run(t, "ip", "-n", p.ns, "route", "add", p.gw, "dev", "eth0", "scope", "link")
		netlab.Run(t, "ip", "-n", p.ns, "route", "add", "default", "via", p.gw)
	}
	netlab.Run(t, "ip", "netns", "exec", node, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	netlab.ServeEcho(t, pod, "tcp4", podIP+":80")
	netlab.ServeEcho(t, pod, "tcp4", podIP+":81")
	reach := func(port int) error {
		return netlab.Exchange(peer, "tcp4", net.JoinHostPort(podIP, strconv.Itoa(port)), 400*time.Millisecond)
	}
	for _, port := range []int{80, 81} {
		testenv.Eventually(t, 10*time.Second, fmt.Sprintf("peer reaches pod port %d before any policy", port), func() bool { return reach(port) == nil })
	}

	cp, _, _ := startControlPlane(t)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	testenv.WriteKubeconfig(t, proxyAPIServer(t, cp.Config, uplinkHost), kubeconfig)

	pinPath := fmt.Sprintf("/sys/fs/bpf/npagent-caps-%d", os.Getpid())
	t.Cleanup(func() { _ = os.RemoveAll(pinPath) })
	cmd := exec.Command("nsenter", "--net=/var/run/netns/"+node, "--",
		"setpriv", "--bounding-set=-all,+bpf,+net_admin", "--inh-caps=-all", "--no-new-privs", "--",
		buildAgent(t), "--kubeconfig="+kubeconfig, "--node-name="+testNodeName, "--node-ip="+nodeIP,
		"--dataplane=ebpf", "--bpffs-path="+pinPath, "--state-file=", "--metrics-addr=127.0.0.1:0",
		"--log-format=json", "--pod-interface-prefixes=eni")
	a := &agentProcess{cmd: cmd, addr: make(chan string, 1), done: make(chan struct{})}
	cmd.Env = append(os.Environ(), "OTEL_TRACES_EXPORTER=none", "OTEL_METRICS_EXPORTER=none")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start agent: %v", err)
	}
	go a.scan(stderr)
	t.Cleanup(func() {
		select {
		case <-a.done:
		default:
			_ = cmd.Process.Kill()
			<-a.done
		}
		if t.Failed() {
			t.Logf("agent log:\n%s", a.logs())
		}
	})
	select {
	case <-a.addr:
	case <-a.done:
		t.Fatalf("agent exited before serving HTTP: %v\n%s", a.exit, a.logs())
	case <-time.After(60 * time.Second):
		t.Fatalf("agent did not serve HTTP within 60s:\n%s", a.logs())
	}
	// nsenter and setpriv exec: the pid is the agent's.
	for field, want := range map[string]uint64{"CapEff": 1<<capNetAdmin | 1<<capBPF, "CapBnd": 1<<capNetAdmin | 1<<capBPF} {
		if got := procCaps(t, cmd.Process.Pid, field); got != want {
			t.Fatalf("agent %s = %#x, want %#x (CAP_BPF and CAP_NET_ADMIN only)", field, got, want)
		}
	}

	proto, port := corev1.ProtocolTCP, int32(80)
	pe := &v1alpha1.PolicyEndpoint{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default",
			Annotations: map[string]string{v1alpha1.AnnotationLastChangeTriggerTime: time.Now().UTC().Format(time.RFC3339Nano)}},
		Spec: v1alpha1.PolicyEndpointSpec{
			PolicyRef:            v1alpha1.PolicyReference{Name: "web", Namespace: "default"},
			PodIsolation:         []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			PodSelectorEndpoints: []v1alpha1.PodEndpoint{{HostIP: v1alpha1.NetworkAddress(nodeIP), PodIP: v1alpha1.NetworkAddress(podIP), Name: "web-0", Namespace: "default"}},
			Ingress:              []v1alpha1.EndpointInfo{{CIDR: v1alpha1.NetworkAddress(peerIP), Ports: []v1alpha1.Port{{Protocol: &proto, Port: &port}}}},
		},
	}
	if err := cp.Client.Create(context.Background(), pe); err != nil {
		t.Fatalf("create PolicyEndpoint default/web: %v", err)
	}
	testenv.Eventually(t, 30*time.Second, "pod port 81 denied to the peer once default/web is programmed", func() bool { return reach(81) != nil })
	for range 3 {
		if err := reach(80); err != nil {
			t.Fatalf("peer to the allowed port 80: %v", err)
		}
		if reach(81) == nil {
			t.Fatal("peer reached port 81, which default/web does not allow")
		}
	}
	if code := a.stop(t); code != 0 {
		t.Fatalf("exit code after SIGTERM = %d, want 0", code)
	}
	// Pinned enforcement outlives the process, as it must across restarts.
	if reach(81) == nil {
		t.Fatal("port 81 open after the agent stopped: enforcement did not stay pinned")
	}
}

// procCaps reads a capability set (CapEff, CapBnd, ...) of a process.
func procCaps(t *testing.T, pid int, field string) uint64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// proxyAPIServer forwards TCP from listenIP (in the host namespace, which a node
// namespace reaches over its uplink) to the apiserver, and returns rc pointed at it,
// verifying the apiserver's certificate for its own name.
func proxyAPIServer(t *testing.T, rc *rest.Config, listenIP string) *rest.Config {
	t.Helper()
	u, err := url.Parse(rc.Host)
	if err != nil || u.Host == "" {
		u = &url.URL{Scheme: "https", Host: rc.Host}
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(listenIP, "0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				up, err := net.Dial("tcp", u.Host)
				if err != nil {
					return
				}
				defer up.Close()
				go func() { _, _ = io.Copy(up, c); _ = up.(*net.TCPConn).CloseWrite() }()
				_, _ = io.Copy(c, up)
			}()
		}
	}()
	out := rest.CopyConfig(rc)
	out.Host = "https://" + ln.Addr().String()
	if out.ServerName == "" {
		out.ServerName = u.Hostname()
	}
	return out
}
