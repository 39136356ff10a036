package main

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/podcond"
	"github.com/npagent/npagent/internal/testenv"
	"github.com/npagent/npagent/internal/testenv/netlab"
)

// TestAgentPodCondition runs the binary as the chart does with --pod-condition
// (CAP_BPF and CAP_NET_ADMIN only, real eBPF): a new pod the agent sees before its
// PolicyEndpoint is NoPolicy, then Programmed once the policy is in force (the
// peer's port 81 dropped when the condition says so), and its window is one point
// of npagent.pod.enforcement.latency.
func TestAgentPodCondition(t *testing.T) {
	skipIfShort(t)
	l := newNodeLab(t, "npq", 213)
	netlab.ServeEcho(t, l.pod, "tcp4", l.podIP+":81")
	cp, a := l.startAgent(t, "--pod-condition")
	ctx := context.Background()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-0", Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{NodeName: testNodeName, Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}}}
	if err := cp.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	pod.Status.PodIP, pod.Status.PodIPs = l.podIP, []corev1.PodIP{{IP: l.podIP}}
	if err := cp.Client.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	condition := func() *corev1.PodCondition {
		var p corev1.Pod
		if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(pod), &p); err != nil {
			t.Fatal(err)
		}
		for i := range p.Status.Conditions {
			if p.Status.Conditions[i].Type == podcond.Type {
				return &p.Status.Conditions[i]
			}
		}
		return nil
	}
	testenv.Eventually(t, 30*time.Second, "condition NoPolicy on the pod no policy selects", func() bool {
		c := condition()
		return c != nil && c.Reason == podcond.ReasonNoPolicy
	})

	proto, port := corev1.ProtocolTCP, int32(80)
	pe := &v1alpha1.PolicyEndpoint{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: v1alpha1.PolicyEndpointSpec{
			PolicyRef:            v1alpha1.PolicyReference{Name: "web", Namespace: "default"},
			PodSelector:          &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			PodIsolation:         []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			PodSelectorEndpoints: []v1alpha1.PodEndpoint{{HostIP: v1alpha1.NetworkAddress(l.nodeIP), PodIP: v1alpha1.NetworkAddress(l.podIP), Name: "web-0", Namespace: "default"}},
			Ingress:              []v1alpha1.EndpointInfo{{CIDR: v1alpha1.NetworkAddress(l.peerIP), Ports: []v1alpha1.Port{{Protocol: &proto, Port: &port}}}},
		},
	}
	if err := cp.Client.Create(ctx, pe); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "condition Programmed", func() bool {
		c := condition()
		return c != nil && c.Status == corev1.ConditionTrue && c.Reason == podcond.ReasonProgrammed
	})
	// True means in force: the peer's port 81, which default/web does not allow, is dropped.
	if err := netlab.Exchange(l.peer, "tcp4", net.JoinHostPort(l.podIP, fmt.Sprint(81)), 400*time.Millisecond); err == nil {
		t.Error("condition Programmed, yet the peer reaches port 81")
	}
	// The pod was first seen unselected: counted, not observed.
	code, body, err := nsGet(l.node, a.url+"/metrics") // its URLs are in the node's namespace
	if got := testenv.SumSamples(body, "npagent_pod_enforcement_unselected_total"); err != nil || code != 200 || got != 1 {
		t.Errorf("/metrics %d %v: npagent_pod_enforcement_unselected_total = %v, want 1", code, err, got)
	}

	// The pod is replaced (same interface, as a recreated pod may get): the new one
	// matches the policy's podSelector, so it is Pending, not NoPolicy, until the
	// controller lists it; its window is one point of the histogram.
	if err := cp.Client.Delete(ctx, pod, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	next := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-1", Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{NodeName: testNodeName, Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}}}
	if err := cp.Client.Create(ctx, next); err != nil {
		t.Fatal(err)
	}
	next.Status.PodIP, next.Status.PodIPs = l.podIP, []corev1.PodIP{{IP: l.podIP}}
	if err := cp.Client.Status().Update(ctx, next); err != nil {
		t.Fatal(err)
	}
	if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(pe), pe); err != nil {
		t.Fatal(err)
	}
	pe.Spec.PodSelectorEndpoints[0].Name = "web-1"
	if err := cp.Client.Update(ctx, pe); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the new pod's window observed", func() bool {
		_, body, _ := nsGet(l.node, a.url+"/metrics")
		return testenv.SumSamples(body, "npagent_pod_enforcement_latency_seconds_count", `npagent_pod_network_ready_source="first_seen_ip"`) == 1
	})
	if code := a.stop(t); code != 0 {
		t.Fatalf("exit code after SIGTERM = %d, want 0", code)
	}
}
