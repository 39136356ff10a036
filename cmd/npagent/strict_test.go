package main

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/testenv"
	"github.com/npagent/npagent/internal/testenv/netlab"
)

// TestAgentStrictModeDeniesNewPod runs the binary with --enforcing-mode=strict as the
// chart runs it (CAP_BPF and CAP_NET_ADMIN only): a pod scheduled on its node with
// an IP and no PolicyEndpoint is denied to a peer while the node reaches it; its
// PolicyEndpoint then allows the peer on one port.
func TestAgentStrictModeDeniesNewPod(t *testing.T) {
	skipIfShort(t)
	l := newNodeLab(t, "nps", 209)
	netlab.ServeEcho(t, l.pod, "tcp4", l.podIP+":80")
	netlab.ServeEcho(t, l.pod, "tcp4", l.podIP+":81")
	reach := func(ns string, port int) error {
		return netlab.Exchange(ns, "tcp4", net.JoinHostPort(l.podIP, fmt.Sprint(port)), 400*time.Millisecond)
	}
	for _, port := range []int{80, 81} {
		testenv.Eventually(t, 10*time.Second, fmt.Sprintf("peer reaches pod port %d before any policy", port), func() bool { return reach(l.peer, port) == nil })
	}
	cp, a := l.startAgent(t, "--enforcing-mode=strict")
	ctx := context.Background()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-0"},
		Spec: corev1.PodSpec{NodeName: testNodeName, Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}}}
	if err := cp.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	pod.Status.PodIP, pod.Status.PodIPs = l.podIP, []corev1.PodIP{{IP: l.podIP}}
	if err := cp.Client.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "new pod denied to the peer", func() bool { return reach(l.peer, 80) != nil })
	if err := reach(l.node, 81); err != nil {
		t.Errorf("node to the strict-denied pod: %v, want node traffic allowed", err)
	}
	if got := a.logs(); !strings.Contains(got, "pod denied by strict mode until a policy selects it") || !strings.Contains(got, l.podIP) {
		t.Errorf("no log line naming the denied pod:\n%s", got)
	}

	proto, port := corev1.ProtocolTCP, int32(80)
	pe := &v1alpha1.PolicyEndpoint{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default",
			Annotations: map[string]string{v1alpha1.AnnotationLastChangeTriggerTime: time.Now().UTC().Format(time.RFC3339Nano)}},
		Spec: v1alpha1.PolicyEndpointSpec{
			PolicyRef:            v1alpha1.PolicyReference{Name: "web", Namespace: "default"},
			PodIsolation:         []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			PodSelectorEndpoints: []v1alpha1.PodEndpoint{{HostIP: v1alpha1.NetworkAddress(l.nodeIP), PodIP: v1alpha1.NetworkAddress(l.podIP), Name: "web-0", Namespace: "default"}},
			Ingress:              []v1alpha1.EndpointInfo{{CIDR: v1alpha1.NetworkAddress(l.peerIP), Ports: []v1alpha1.Port{{Protocol: &proto, Port: &port}}}},
		},
	}
	if err := cp.Client.Create(ctx, pe); err != nil {
		t.Fatalf("create PolicyEndpoint default/web: %v", err)
	}
	testenv.Eventually(t, 30*time.Second, "peer reaches port 80 once default/web is programmed", func() bool { return reach(l.peer, 80) == nil })
	if reach(l.peer, 81) == nil {
		t.Error("peer reached port 81, which default/web does not allow")
	}
	if code := a.stop(t); code != 0 {
		t.Fatalf("exit code after SIGTERM = %d, want 0", code)
	}
}
