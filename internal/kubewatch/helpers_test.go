package kubewatch

import (
	"context"
	"fmt"
	"strconv"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/testenv"
)

// benchPE, as reconcile's benchmarks build it: the lists these tests decode.
const benchNode = "192.0.2.30"

// benchPE is a PolicyEndpoint shaped like the AWS controller's: a few pods, of which
// the first is local, and a handful of ingress and egress rules.
func benchPE(i int, localPods int) *v1alpha1.PolicyEndpoint {
	pe := &v1alpha1.PolicyEndpoint{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: "PolicyEndpoint"},
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "bench", Name: fmt.Sprintf("pe-%05d", i),
			UID:             types.UID(fmt.Sprintf("00000000-0000-4000-8000-%012d", i)),
			ResourceVersion: strconv.Itoa(1000 + i),
			Annotations:     map[string]string{v1alpha1.AnnotationLastChangeTriggerTime: time.Now().UTC().Format(time.RFC3339Nano)},
		},
		Spec: v1alpha1.PolicyEndpointSpec{
			PolicyRef:    v1alpha1.PolicyReference{Name: fmt.Sprintf("np-%d", i), Namespace: "bench"},
			PodSelector:  &metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app-%d", i%50)}},
			PodIsolation: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
		},
	}
	pe.Spec.PodSelectorEndpoints = append(pe.Spec.PodSelectorEndpoints, pod(benchNode, fmt.Sprintf("10.60.%d.%d", (i%localPods)/250, (i%localPods)%250+1)))
	for j := range 3 {
		pe.Spec.PodSelectorEndpoints = append(pe.Spec.PodSelectorEndpoints, pod("192.0.2.99", fmt.Sprintf("10.61.%d.%d", i%250, j+1)))
	}
	for j := range pe.Spec.PodSelectorEndpoints {
		pe.Spec.PodSelectorEndpoints[j].Namespace = "bench"
	}
	for j := range 4 {
		pe.Spec.Ingress = append(pe.Spec.Ingress, v1alpha1.EndpointInfo{
			CIDR:  v1alpha1.NetworkAddress(fmt.Sprintf("10.%d.%d.0/24", 70+j, i%250)),
			Ports: []v1alpha1.Port{{Port: ptr(int32(8000 + j))}},
		})
	}
	pe.Spec.Egress = []v1alpha1.EndpointInfo{{CIDR: "10.96.0.0/12", Ports: []v1alpha1.Port{{Port: ptr[int32](53)}}}}
	return pe
}

func pod(hostIP, podIP string) v1alpha1.PodEndpoint {
	return v1alpha1.PodEndpoint{HostIP: v1alpha1.NetworkAddress(hostIP), PodIP: v1alpha1.NetworkAddress(podIP), Name: "p-" + podIP, Namespace: "shop"}
}

func ptr[T any](v T) *T { return &v }

// cpuTime is this process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func createNamespace(t testing.TB, cp *testenv.ControlPlane, name string) {
	t.Helper()
	if err := cp.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
}

func create(t testing.TB, cp *testenv.ControlPlane, obj client.Object) {
	t.Helper()
	if err := cp.Client.Create(context.Background(), obj); err != nil {
		t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
}
