package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
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
	l := newNodeLab(t, "npc", 205)
	pod, peer, podIP, peerIP, nodeIP := l.pod, l.peer, l.podIP, l.peerIP, l.nodeIP
	netlab.ServeEcho(t, pod, "tcp4", podIP+":80")
	netlab.ServeEcho(t, pod, "tcp4", podIP+":81")
	reach := func(port int) error {
		return netlab.Exchange(peer, "tcp4", net.JoinHostPort(podIP, strconv.Itoa(port)), 400*time.Millisecond)
	}
	for _, port := range []int{80, 81} {
		testenv.Eventually(t, 10*time.Second, fmt.Sprintf("peer reaches pod port %d before any policy", port), func() bool { return reach(port) == nil })
	}

	cp, a := l.startAgent(t)
	cmd := a.cmd
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
