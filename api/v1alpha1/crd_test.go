package v1alpha1_test

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/testenv"
)

func ptr[T any](v T) *T { return &v }

var (
	tcp = ptr(corev1.ProtocolTCP)
	udp = ptr(corev1.ProtocolUDP)
)

// controllerObjects are objects in the shapes the AWS Network Policy Controller writes:
// pod peers as bare IPs, "allow all" as 0.0.0.0/0 plus ::/0, FQDN rules with a
// domainName and no cidr, a policy chunked into several PolicyEndpoints (one with
// rules and no pods), and ClusterPolicyEndpoints carrying the policy's subject.
func controllerObjects() []client.Object {
	selector := &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}
	pods := []v1alpha1.PodEndpoint{{HostIP: "192.0.2.10", PodIP: "10.1.0.5", Name: "web-0", Namespace: "shop"}}
	return []client.Object{
		&v1alpha1.PolicyEndpoint{
			ObjectMeta: metav1.ObjectMeta{Name: "allow-web-abcde", Namespace: "shop", Annotations: map[string]string{
				v1alpha1.AnnotationLastChangeTriggerTime: "2026-11-29T10:00:00.123456789Z",
			}},
			Spec: v1alpha1.PolicyEndpointSpec{
				PolicyRef:            v1alpha1.PolicyReference{Name: "allow-web", Namespace: "shop"},
				PodSelector:          selector,
				PodIsolation:         []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
				PodSelectorEndpoints: pods,
				Ingress: []v1alpha1.EndpointInfo{
					{CIDR: "10.1.0.9", Ports: []v1alpha1.Port{{Protocol: tcp, Port: ptr[int32](8080), EndPort: ptr[int32](8090)}}},
					{CIDR: "10.0.0.0/8", Except: []v1alpha1.NetworkAddress{"10.9.0.0/16"}},
					{CIDR: "fd00::5"},
				},
				Egress: []v1alpha1.EndpointInfo{
					{CIDR: "0.0.0.0/0", Ports: []v1alpha1.Port{{Protocol: udp, Port: ptr[int32](53)}}},
					{CIDR: "::/0", Ports: []v1alpha1.Port{{Protocol: udp, Port: ptr[int32](53)}}},
					{DomainName: "*.example.com", Ports: []v1alpha1.Port{{Protocol: tcp, Port: ptr[int32](443)}}},
				},
			},
		},
		// The second chunk of the same policy: rules, no pods.
		&v1alpha1.PolicyEndpoint{
			ObjectMeta: metav1.ObjectMeta{Name: "allow-web-fghij", Namespace: "shop"},
			Spec: v1alpha1.PolicyEndpointSpec{
				PolicyRef:    v1alpha1.PolicyReference{Name: "allow-web", Namespace: "shop"},
				PodSelector:  selector,
				PodIsolation: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
				Ingress:      []v1alpha1.EndpointInfo{{CIDR: "10.1.0.10"}, {CIDR: "10.1.0.11"}},
			},
		},
		&v1alpha1.ClusterPolicyEndpoint{
			ObjectMeta: metav1.ObjectMeta{Name: "deny-metadata"},
			Spec: v1alpha1.ClusterPolicyEndpointSpec{
				PolicyRef: v1alpha1.ClusterPolicyReference{Name: "deny-metadata"},
				Tier:      v1alpha1.TierAdmin,
				Priority:  10,
				Subject: v1alpha1.ClusterPolicySubject{Pods: &v1alpha1.NamespacedPod{
					NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{"team": "shop"}},
					PodSelector:       *selector,
				}},
				PodSelectorEndpoints: pods,
				Egress: []v1alpha1.ClusterEndpointInfo{
					{Action: v1alpha1.ClusterRuleActionDeny, CIDR: "169.254.169.254"},
					{Action: v1alpha1.ClusterRuleActionAccept, DomainName: "api.example.com.", Ports: []v1alpha1.Port{{Protocol: tcp, Port: ptr[int32](443)}}},
					{Action: v1alpha1.ClusterRuleActionPass, CIDR: "0.0.0.0/0", Ports: []v1alpha1.Port{{Protocol: udp, Port: ptr[int32](53)}}},
				},
			},
		},
		&v1alpha1.ClusterPolicyEndpoint{
			ObjectMeta: metav1.ObjectMeta{Name: "baseline-shop"},
			Spec: v1alpha1.ClusterPolicyEndpointSpec{
				PolicyRef: v1alpha1.ClusterPolicyReference{Name: "baseline-shop"},
				Tier:      v1alpha1.TierBaseline,
				Subject: v1alpha1.ClusterPolicySubject{Namespaces: &metav1.LabelSelector{
					MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "team", Operator: metav1.LabelSelectorOpExists}},
				}},
				Ingress: []v1alpha1.ClusterEndpointInfo{{Action: v1alpha1.ClusterRuleActionDeny, CIDR: "0.0.0.0/0"}, {Action: v1alpha1.ClusterRuleActionDeny, CIDR: "::/0"}},
			},
		},
	}
}

// TestCRDsAcceptWhatTheControllerWrites installs, into a real kube-apiserver, npagent's
// generated CRDs and — separately — the controller's own, and shows that both keep
// every object the controller writes unchanged (nothing pruned), default a port's
// protocol alike, and reject alike what the controller never writes.
func TestCRDsAcceptWhatTheControllerWrites(t *testing.T) {
	upstream := testenv.UpstreamCRDDir(t)
	for _, tc := range []struct{ name, dir string }{
		{"npagent config/crd", testenv.CRDDir()},
		{"controller's CRDs", upstream},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp := testenv.Start(t, testenv.WithCRDDir(tc.dir))
			checkRoundTrip(t, cp)
		})
	}
}

func checkRoundTrip(t *testing.T, cp *testenv.ControlPlane) {
	ctx := context.Background()
	if err := cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}); err != nil {
		t.Fatal(err)
	}
	for _, obj := range controllerObjects() {
		want := obj.DeepCopyObject().(client.Object)
		if err := cp.Client.Create(ctx, obj); err != nil {
			t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
		}
		got := get(t, cp, obj)
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

	// A port without protocol comes back as TCP: the schema's default.
	pe := &v1alpha1.PolicyEndpoint{
		ObjectMeta: metav1.ObjectMeta{Name: "no-protocol", Namespace: "shop"},
		Spec: v1alpha1.PolicyEndpointSpec{
			PolicyRef: v1alpha1.PolicyReference{Name: "no-protocol", Namespace: "shop"},
			Ingress:   []v1alpha1.EndpointInfo{{CIDR: "10.0.0.0/8", Ports: []v1alpha1.Port{{Port: ptr[int32](80)}}}},
		},
	}
	if err := cp.Client.Create(ctx, pe); err != nil {
		t.Fatalf("create PolicyEndpoint with a port without protocol: %v", err)
	}
	if p := get(t, cp, pe).(*v1alpha1.PolicyEndpoint).Spec.Ingress[0].Ports[0].Protocol; p == nil || *p != corev1.ProtocolTCP {
		t.Errorf("protocol of a port written without one = %v, want the default TCP", p)
	}

	// What the controller never writes is rejected by both schemas.
	base := controllerObjects()
	cpe := base[2].(*v1alpha1.ClusterPolicyEndpoint)
	for _, bad := range []struct {
		name   string
		mutate func() client.Object
	}{
		{"unknown tier", func() client.Object { c := cpe.DeepCopy(); c.Spec.Tier = "Platinum"; return c }},
		{"unknown action", func() client.Object { c := cpe.DeepCopy(); c.Spec.Egress[0].Action = "Allow"; return c }},
		{"no subject", func() client.Object { c := cpe.DeepCopy(); c.Spec.Subject = v1alpha1.ClusterPolicySubject{}; return c }},
		{"subject with namespaces and pods", func() client.Object {
			c := cpe.DeepCopy()
			c.Spec.Subject.Namespaces = &metav1.LabelSelector{}
			return c
		}},
		{"subject absent", func() client.Object { return without(t, cpe, "spec", "subject") }},
		{"policyRef without namespace", func() client.Object { return without(t, base[0], "spec", "policyRef", "namespace") }},
		{"domainName not a domain", func() client.Object {
			p := base[0].(*v1alpha1.PolicyEndpoint).DeepCopy()
			p.Spec.Egress[2].DomainName = "not a domain"
			return p
		}},
	} {
		obj := bad.mutate()
		obj.SetName("bad")
		obj.SetResourceVersion("")
		switch err := cp.Client.Create(ctx, obj); {
		case err == nil:
			t.Errorf("create %T with %s: want a validation error, got none", obj, bad.name)
			_ = cp.Client.Delete(ctx, obj)
		case !apierrors.IsInvalid(err):
			t.Errorf("create %T with %s: err = %v, want Invalid", obj, bad.name, err)
		default:
			t.Logf("%s: rejected: %v", bad.name, err)
		}
	}
}

// without is obj as unstructured with the field at path removed: the typed client
// cannot leave out a field its Go type always writes.
func without(t *testing.T, obj client.Object, path ...string) client.Object {
	t.Helper()
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: m}
	gvk, err := apiutil.GVKForObject(obj, scheme)
	if err != nil {
		t.Fatal(err)
	}
	u.SetGroupVersionKind(gvk)
	unstructured.RemoveNestedField(u.Object, path...)
	return u
}

var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}()

func get(t *testing.T, cp *testenv.ControlPlane, obj client.Object) client.Object {
	t.Helper()
	got := obj.DeepCopyObject().(client.Object)
	if err := cp.Client.Get(context.Background(), client.ObjectKeyFromObject(obj), got); err != nil {
		t.Fatalf("get %T %s: %v", obj, obj.GetName(), err)
	}
	return got
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
