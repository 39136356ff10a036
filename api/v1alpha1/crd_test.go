package v1alpha1_test

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/testenv"
)

func ptr[T any](v T) *T { return &v }

// TestCRDRoundTrip installs the generated CRDs into a real kube-apiserver and shows that
// an object of each kind, in the shape the AWS controller writes, comes back unchanged.
func TestCRDRoundTrip(t *testing.T) {
	cp := testenv.Start(t)
	ctx := context.Background()
	if err := cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}); err != nil {
		t.Fatal(err)
	}

	pe := &v1alpha1.PolicyEndpoint{
		ObjectMeta: metav1.ObjectMeta{Name: "allow-web-abcde", Namespace: "shop", Annotations: map[string]string{
			v1alpha1.AnnotationLastChangeTriggerTime: "2026-11-29T10:00:00.123456789Z",
		}},
		Spec: v1alpha1.PolicyEndpointSpec{
			PolicyRef:    v1alpha1.PolicyReference{Name: "allow-web", Namespace: "shop"},
			PodSelector:  &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			PodIsolation: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			PodSelectorEndpoints: []v1alpha1.PodEndpoint{
				{HostIP: "192.0.2.10", PodIP: "10.1.0.5", Name: "web-0", Namespace: "shop"},
			},
			Ingress: []v1alpha1.EndpointInfo{{
				CIDR:   "10.0.0.0/8",
				Except: []v1alpha1.NetworkAddress{"10.9.0.0/16"},
				Ports:  []v1alpha1.Port{{Protocol: ptr(corev1.ProtocolTCP), Port: ptr[int32](8080), EndPort: ptr[int32](8090)}},
			}},
			Egress: []v1alpha1.EndpointInfo{{CIDR: "fd00::/64"}},
		},
	}
	cpe := &v1alpha1.ClusterPolicyEndpoint{
		ObjectMeta: metav1.ObjectMeta{Name: "deny-metadata"},
		Spec: v1alpha1.ClusterPolicyEndpointSpec{
			PolicyRef: v1alpha1.PolicyReference{Name: "deny-metadata"},
			Tier:      v1alpha1.TierAdmin,
			Priority:  10,
			PodSelectorEndpoints: []v1alpha1.PodEndpoint{
				{HostIP: "192.0.2.10", PodIP: "10.1.0.5", Name: "web-0", Namespace: "shop"},
			},
			Egress: []v1alpha1.ClusterEndpointInfo{
				{Action: v1alpha1.ClusterRuleActionDeny, CIDR: "169.254.169.254/32"},
				{Action: v1alpha1.ClusterRuleActionPass, CIDR: "0.0.0.0/0", Ports: []v1alpha1.Port{{Protocol: ptr(corev1.ProtocolUDP), Port: ptr[int32](53)}}},
			},
		},
	}

	for _, obj := range []client.Object{pe, cpe} {
		want := obj.DeepCopyObject().(client.Object)
		if err := cp.Client.Create(ctx, obj); err != nil {
			t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
		}
		got := obj.DeepCopyObject().(client.Object)
		if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(obj), got); err != nil {
			t.Fatalf("get %T %s: %v", obj, obj.GetName(), err)
		}
		if got.GetUID() == "" || got.GetResourceVersion() == "" {
			t.Fatalf("%T %s: apiserver gave no uid/resourceVersion", obj, obj.GetName())
		}
		if !apiequality.Semantic.DeepEqual(specOf(t, want), specOf(t, got)) {
			t.Errorf("%T %s: spec changed in the round trip:\nwant %+v\ngot  %+v", obj, obj.GetName(), specOf(t, want), specOf(t, got))
		}
		if !apiequality.Semantic.DeepEqual(want.GetAnnotations(), got.GetAnnotations()) {
			t.Errorf("%T %s: annotations changed: want %v got %v", obj, obj.GetName(), want.GetAnnotations(), got.GetAnnotations())
		}
	}

	// The schema rejects what the controller never writes: an unknown tier.
	bad := cpe.DeepCopy()
	bad.ObjectMeta = metav1.ObjectMeta{Name: "bad-tier"}
	bad.Spec.Tier = "Platinum"
	if err := cp.Client.Create(ctx, bad); err == nil {
		t.Error("create ClusterPolicyEndpoint with tier Platinum: want a validation error, got none")
	}
}

func specOf(t *testing.T, obj client.Object) any {
	switch o := obj.(type) {
	case *v1alpha1.PolicyEndpoint:
		return o.Spec
	case *v1alpha1.ClusterPolicyEndpoint:
		return o.Spec
	}
	t.Fatalf("unexpected %T", obj)
	return nil
}
