package reconcile

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/testenv"
	"github.com/npagent/npagent/internal/testenv/netlab"
	"github.com/npagent/npagent/internal/testenv/skip"
)

// podLab is one pod the way a CNI makes it: a network namespace holding the pod's end
// of a veth pair, the host end in the test's own namespace, and a host route (/32) to
// the pod's IP through the host end. The host end also has the subnet's .1 address,
// so the node reaches the pod from it; the connected /24 that comes with that address
// is what a longest-prefix lookup would (wrongly) answer for a pod without its route.
type podLab struct {
	ns        string
	hostIf    string
	hostIP    string // the node's address on the host end
	podIP     string
	hostIndex int
}

func newPodLab(t *testing.T) *podLab {
	t.Helper()
	if os.Geteuid() != 0 {
		skip.Unmet(t, "needs root: creates a network namespace, a veth pair and a host route, and loads eBPF programs (CAP_NET_ADMIN, CAP_BPF)")
	}
	netlab.RequireIP(t, "build the pod's network namespace")
	id := os.Getpid() % 100000
	subnet := fmt.Sprintf("10.251.%d", id%250+1)
	l := &podLab{
		ns:     fmt.Sprintf("npr-pods-%d", id),
		hostIf: fmt.Sprintf("npr%d", id),
		hostIP: subnet + ".1",
		podIP:  subnet + ".2",
	}
	netlab.AddNamespace(t, l.ns)
	netlab.Run(t, "ip", "link", "add", l.hostIf, "type", "veth", "peer", "name", "eth0", "netns", l.ns)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", l.hostIf).Run() })
	netlab.Run(t, "ip", "addr", "add", l.hostIP+"/24", "dev", l.hostIf)
	netlab.Run(t, "ip", "link", "set", l.hostIf, "up")
	netlab.Run(t, "ip", "route", "add", l.podIP+"/32", "dev", l.hostIf, "scope", "link")
	netlab.Run(t, "ip", "-n", l.ns, "addr", "add", l.podIP+"/24", "dev", "eth0")
	netlab.Run(t, "ip", "-n", l.ns, "link", "set", "eth0", "up")
	link, err := net.InterfaceByName(l.hostIf)
	if err != nil {
		t.Fatal(err)
	}
	l.hostIndex = link.Index
	return l
}

// openKernelDataplane opens the eBPF dataplane under a pin path of its own (name
// tells the tests apart), as the host would have it: bpffs mounted. It is closed
// and unpinned at cleanup.
func openKernelDataplane(t *testing.T, name string) *bpfmaps.EBPF {
	t.Helper()
	netlab.HostBPFFS(t)
	pin := filepath.Join("/sys/fs/bpf", fmt.Sprintf("npagent-reconcile-%s-%d", name, os.Getpid()))
	t.Cleanup(func() { _ = os.RemoveAll(pin) })
	dp, err := bpfmaps.OpenEBPF(bpfmaps.EBPFOptions{PinPath: pin})
	if err != nil {
		if strings.Contains(err.Error(), "not supported") {
			skip.Unmet(t, "kernel lacks a needed eBPF feature: %v", err)
		}
		t.Fatalf("OpenEBPF: %v", err)
	}
	t.Cleanup(func() { _ = dp.Close() })
	return dp
}

// serve echoes TCP connections on the pod's IP and port, inside the pod's namespace.
func (l *podLab) serve(t *testing.T, port int) {
	t.Helper()
	netlab.ServeEcho(t, l.ns, "tcp4", fmt.Sprintf("%s:%d", l.podIP, port))
}

// reach dials the pod from the node and exchanges one message.
func (l *podLab) reach(port int) error {
	return netlab.Exchange("", "tcp4", fmt.Sprintf("%s:%d", l.podIP, port), 400*time.Millisecond)
}

// TestEBPFEnforcement programs a PolicyEndpoint written to a real apiserver into the
// kernel dataplane, through the route resolver, and checks real TCP connections.
func TestEBPFEnforcement(t *testing.T) {
	l := newPodLab(t)
	l.serve(t, 8080)
	l.serve(t, 8081)
	// The veth may still be coming up (the first SYN lost, its retransmission a
	// second later): wait for the path before asserting anything about policy.
	for _, port := range []int{8080, 8081} {
		testenv.Eventually(t, 10*time.Second, fmt.Sprintf("port %d reachable before any policy", port), func() bool {
			return l.reach(port) == nil
		})
	}
	dp := openKernelDataplane(t, "test")

	cp := sharedCP(t)
	const node = "192.0.2.20"
	createNamespace(t, cp, "ebpf")
	a := startAgent(t, cp, agentOptions{nodeIP: node, dp: dp}) // nil resolver: podif.NewRouteResolver
	pe := ingressPE("ebpf", "web", []v1alpha1.PodEndpoint{pod(node, l.podIP)}, l.hostIP+"/32", 8080)
	create(t, cp, pe)
	testenv.Eventually(t, 20*time.Second, "record for the create", func() bool { return len(a.sink.recordsFor(string(pe.UID))) == 1 })
	if got := dp.Pods(); len(got) != 1 || got[0] != l.hostIndex {
		t.Fatalf("dataplane pods = %v, want the veth %s (%d)", got, l.hostIf, l.hostIndex)
	}
	if err := l.reach(8080); err != nil {
		t.Errorf("allowed port 8080: %v", err)
	}
	if err := l.reach(8081); err == nil {
		t.Errorf("port 8081 reachable: the policy is not enforced")
	}

	update(t, cp, pe, func(pe *v1alpha1.PolicyEndpoint) {
		pe.Spec.Ingress[0].Ports = append(pe.Spec.Ingress[0].Ports, v1alpha1.Port{Port: ptr[int32](8081)})
	})
	testenv.Eventually(t, 20*time.Second, "record for the update", func() bool { return len(a.sink.recordsFor(string(pe.UID))) == 2 })
	if err := l.reach(8081); err != nil {
		t.Errorf("port 8081 after the update allowed it: %v", err)
	}

	remove(t, cp, pe)
	testenv.Eventually(t, 20*time.Second, "pod state removed", func() bool { return len(dp.Pods()) == 0 })
	if err := l.reach(8081); err != nil {
		t.Errorf("after delete the pod must be open again: %v", err)
	}
}

// exchangeFrom dials addr from the caller's namespace with source address src, sends
// one message and waits for its echo. An IPv6 src dials over IPv6.
func exchangeFrom(src, addr string) error {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 400 * time.Millisecond}
	network := "tcp4"
	if strings.Contains(src, ":") {
		network = "tcp6"
	}
	c, err := d.Dial(network, addr)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(400 * time.Millisecond))
	msg := []byte("npagent node")
	if _, err := c.Write(msg); err != nil {
		return err
	}
	buf := make([]byte, len(msg))
	_, err = io.ReadFull(c, buf)
	return err
}

// TestEBPFNodeTrafficExempt: with real packets, traffic between a pod and its own
// node passes whatever the pod's policy says (issue 10: kubelet probes to an
// ingress-isolated pod timed out). The pod is isolated both ways; its ingress allows
// one non-node peer on one port, its egress nothing. The node set holds the host-side
// veth address (what the agent discovers on the node), not the host end's other
// addresses, which stand for peers that are not the node.
func TestEBPFNodeTrafficExempt(t *testing.T) {
	l := newPodLab(t)
	subnet := strings.TrimSuffix(l.hostIP, ".1")
	peer, stranger := subnet+".3", subnet+".4" // not node addresses (not in the node set)
	for _, a := range []string{peer, stranger} {
		netlab.Run(t, "ip", "addr", "add", a+"/32", "dev", l.hostIf)
	}
	l.serve(t, 8080)
	l.serve(t, 8081)
	netlab.ServeEcho(t, "", "tcp4", l.hostIP+":8090") // the node's service (a node-local DNS cache, say)
	netlab.ServeEcho(t, "", "tcp4", peer+":8090")     // a non-node peer's service
	pod := func(port int) string { return fmt.Sprintf("%s:%d", l.podIP, port) }
	// Every path works before any policy, so a drop below is the policy's.
	for what, try := range map[string]func() error{
		"node to pod":     func() error { return exchangeFrom(l.hostIP, pod(8081)) },
		"peer to pod":     func() error { return exchangeFrom(peer, pod(8081)) },
		"stranger to pod": func() error { return exchangeFrom(stranger, pod(8080)) },
		"pod to node":     func() error { return netlab.Exchange(l.ns, "tcp4", l.hostIP+":8090", 400*time.Millisecond) },
		"pod to the peer": func() error { return netlab.Exchange(l.ns, "tcp4", peer+":8090", 400*time.Millisecond) },
	} {
		testenv.Eventually(t, 10*time.Second, what+" before any policy", func() bool { return try() == nil })
	}
	dp := openKernelDataplane(t, "node-test")
	if err := dp.SetNodeAddrs([]netip.Prefix{netip.MustParsePrefix(l.hostIP + "/32")}); err != nil {
		t.Fatal(err)
	}
	pol := bpfmaps.PodPolicy{
		Ingress: bpfmaps.DirectionPolicy{Isolated: true, Allow: []bpfmaps.Rule{{
			CIDR:  netip.MustParsePrefix(peer + "/32"),
			Ports: []bpfmaps.PortRule{{Protocol: bpfmaps.ProtocolTCP, Port: 8080}},
		}}},
		Egress: bpfmaps.DirectionPolicy{Isolated: true},
	}
	if _, err := dp.Commit(l.hostIndex, pol); err != nil {
		t.Fatal(err)
	}
	expect := func(what string, err error, pass bool) {
		t.Helper()
		if pass && err != nil {
			t.Errorf("%s: %v, want it to pass", what, err)
		}
		if !pass && err == nil {
			t.Errorf("%s passed, want it dropped", what)
		}
	}
	// The policy still decides for peers that are not the node.
	expect("allowed peer to port 8080", exchangeFrom(peer, pod(8080)), true)
	expect("allowed peer to port 8081", exchangeFrom(peer, pod(8081)), false)
	expect("other peer to port 8080", exchangeFrom(stranger, pod(8080)), false)
	expect("pod to a non-node peer", netlab.Exchange(l.ns, "tcp4", peer+":8090", 400*time.Millisecond), false)
	// The node reaches the pod on every port, and the pod the node.
	expect("node (host-side veth address) to port 8080", exchangeFrom(l.hostIP, pod(8080)), true)
	expect("node (host-side veth address) to port 8081", exchangeFrom(l.hostIP, pod(8081)), true)
	expect("pod to the node", netlab.Exchange(l.ns, "tcp4", l.hostIP+":8090", 400*time.Millisecond), true)

	// The exemption is the node set's: emptied, the node is policed as any peer.
	if err := dp.SetNodeAddrs(nil); err != nil {
		t.Fatal(err)
	}
	expect("node to port 8081 with an empty node set", exchangeFrom(l.hostIP, pod(8081)), false)
	expect("pod to the node with an empty node set", netlab.Exchange(l.ns, "tcp4", l.hostIP+":8090", 400*time.Millisecond), false)
}
