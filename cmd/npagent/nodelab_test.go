package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/npagent/npagent/internal/testenv"
	"github.com/npagent/npagent/internal/testenv/netlab"
	"github.com/npagent/npagent/internal/testenv/skip"
)

// nodeLab is a node of its own on this machine: a network namespace (the node)
// with an uplink to the host namespace, where the apiserver is, and a pod and a
// peer behind veths of the node, each with a host route as a CNI makes it, the
// node forwarding between them. The agent runs inside the node as the chart runs
// it: the eBPF dataplane on the host's bpffs, root with only CAP_BPF and
// CAP_NET_ADMIN.
type nodeLab struct {
	node, pod, peer    string // namespace names
	uplinkHost, nodeIP string // the uplink's host and node ends
	podIP, peerIP      string
	// debugSocket is the agent's debug socket (startAgent), a path in the host's
	// file system.
	debugSocket string
}

// newNodeLab builds a lab whose names start with prefix and whose addresses are in
// 10.<net>.x.0/24 (uplink) and 10.<net+1>.x.0/24 (pod and peer), x derived from the
// test process's pid so parallel test processes differ. Tests that build labs in one
// process give each its own prefix and net. It needs root, setpriv and nsenter
// (util-linux), ip (iproute2) and bpffs; a missing one is skip.Unmet.
func newNodeLab(t *testing.T, prefix string, net int) *nodeLab {
	t.Helper()
	if !skip.Root() {
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
	l := &nodeLab{
		node: fmt.Sprintf("%s-node-%d", prefix, id), pod: fmt.Sprintf("%s-pod-%d", prefix, id), peer: fmt.Sprintf("%s-peer-%d", prefix, id),
		uplinkHost: fmt.Sprintf("10.%d.%d.1", net, id), nodeIP: fmt.Sprintf("10.%d.%d.2", net, id),
		podIP: fmt.Sprintf("10.%d.%d.2", net+1, id), peerIP: fmt.Sprintf("10.%d.%d.130", net+1, id),
	}
	for _, ns := range []string{l.node, l.pod, l.peer} {
		netlab.AddNamespace(t, ns)
	}
	// The node's uplink to the host namespace, where the apiserver is (through a proxy).
	uplink := fmt.Sprintf("%s%d", prefix, id)
	netlab.Run(t, "ip", "link", "add", uplink, "type", "veth", "peer", "name", "up0", "netns", l.node)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", uplink).Run() })
	netlab.Run(t, "ip", "addr", "add", l.uplinkHost+"/30", "dev", uplink)
	netlab.Run(t, "ip", "link", "set", uplink, "up")
	netlab.Run(t, "ip", "-n", l.node, "addr", "add", l.nodeIP+"/30", "dev", "up0")
	netlab.Run(t, "ip", "-n", l.node, "link", "set", "up0", "up")
	// Pod and peer behind veths of the node, each with a host route as a CNI makes it.
	for _, p := range []struct{ ns, host, gw, addr string }{
		{l.pod, "eni1", fmt.Sprintf("10.%d.%d.1", net+1, id), l.podIP},
		{l.peer, "eni2", fmt.Sprintf("10.%d.%d.129", net+1, id), l.peerIP},
	} {
		netlab.Run(t, "ip", "-n", l.node, "link", "add", p.host, "type", "veth", "peer", "name", "eth0", "netns", p.ns)
		netlab.Run(t, "ip", "-n", l.node, "addr", "add", p.gw+"/32", "dev", p.host)
		netlab.Run(t, "ip", "-n", l.node, "link", "set", p.host, "up")
		netlab.Run(t, "ip", "-n", l.node, "route", "add", p.addr+"/32", "dev", p.host, "scope", "link")
		netlab.Run(t, "ip", "-n", p.ns, "addr", "add", p.addr+"/32", "dev", "eth0")
		netlab.Run(t, "ip", "-n", p.ns, "link", "set", "eth0", "up")
		netlab.Run(t, "ip", "-n", p.ns, "route", "add", p.gw, "dev", "eth0", "scope", "link")
		netlab.Run(t, "ip", "-n", p.ns, "route", "add", "default", "via", p.gw)
	}
	netlab.Run(t, "ip", "netns", "exec", l.node, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	return l
}

// startAgent starts a real control plane and the agent binary in the node,
// reaching the apiserver through a TCP proxy on the uplink's host end, with its
// debug socket at l.debugSocket, and waits until it serves HTTP. extra flags follow
// the lab's. It returns the control plane and the agent, which is killed at cleanup
// if still running.
func (l *nodeLab) startAgent(t *testing.T, extra ...string) (*testenv.ControlPlane, *agentProcess) {
	t.Helper()
	cp, _, _ := startControlPlane(t)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	testenv.WriteKubeconfig(t, proxyAPIServer(t, cp.Config, l.uplinkHost), kubeconfig)

	pinPath := fmt.Sprintf("/sys/fs/bpf/npagent-%s-%d", l.node, os.Getpid())
	t.Cleanup(func() { _ = os.RemoveAll(pinPath) })
	l.debugSocket = filepath.Join(shortTempDir(t), "debug.sock") // not the host's /run
	args := append([]string{"--net=/var/run/netns/" + l.node, "--",
		"setpriv", "--bounding-set=-all,+bpf,+net_admin", "--inh-caps=-all", "--no-new-privs", "--",
		buildAgent(t), "--kubeconfig=" + kubeconfig, "--node-name=" + testNodeName, "--node-ip=" + l.nodeIP,
		"--dataplane=ebpf", "--bpffs-path=" + pinPath, "--state-file=", "--metrics-addr=127.0.0.1:0",
		"--health-addr=127.0.0.1:0", "--log-format=json", "--pod-interface-prefixes=eni", "--debug-socket=" + l.debugSocket,
		// The lab's CNI puts a gateway address on each pod's host-side veth (as the
		// ptp plugin does): the node reaches a pod from it, so it is the node's.
		"--node-address-interfaces=eni*"}, extra...)
	cmd := exec.Command("nsenter", args...)
	a := &agentProcess{cmd: cmd, addr: make(chan string, 1), health: make(chan string, 1), done: make(chan struct{})}
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
	a.waitHTTP(t) // its URLs are in the node's namespace: reach them with nsenter
	return cp, a
}
