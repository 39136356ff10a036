package translate

import (
	"net/netip"
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
)

// TestNodeLocalCompilesFromSource: a PolicyEndpoint version with no local pod is
// kept without its rules once settled, and a merge that needs them gets the full
// compile of the same source object (then kept); a version with a local pod, and
// a ClusterPolicyEndpoint, are kept as compiled. The kept version refers to its
// source: what it relies on (see nodelocal.go) is that the source never changes.
func TestNodeLocalCompilesFromSource(t *testing.T) {
	var o Options
	remote := &v1alpha1.PolicyEndpoint{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "rules-only", UID: "u1"},
		Spec: v1alpha1.PolicyEndpointSpec{
			PolicyRef:            v1alpha1.PolicyReference{Namespace: "shop", Name: "np"},
			PodSelectorEndpoints: []v1alpha1.PodEndpoint{pod("192.0.2.99", "10.1.0.9")},
			Ingress:              []v1alpha1.EndpointInfo{{CIDR: "10.2.0.0/16"}, {CIDR: "10.3.0.0/16"}},
		},
	}
	full, err := o.Compile(remote, testNode)
	if err != nil {
		t.Fatal(err)
	}
	want := full.Allow
	kept := o.NodeLocal(full, remote, testNode)
	if kept == full {
		t.Fatal("a version with no local pod is kept as compiled")
	}
	if got := kept.HeldRules(); got != 2 {
		t.Errorf("before Settle the kept version holds %d rules, want the caller's compile's 2", got)
	}
	kept.Settle()
	if got := kept.HeldRules(); got != 0 {
		t.Errorf("settled version with no local pod holds %d rules, want 0", got)
	}
	if got := kept.Rules(); !reflect.DeepEqual(got.Allow, want) {
		t.Errorf("rules recompiled from the source = %v, want %v", got.Allow, want)
	}
	if got := kept.HeldRules(); got != 2 {
		t.Errorf("after a merge read them the version holds %d rules, want 2 (kept)", got)
	}
	pol := MergePodPolicy([]*Compiled{kept})
	if !pol.Ingress.Verdict(netip.MustParseAddr("10.3.0.1"), bpfmaps.ProtocolTCP, 80) || pol.Ingress.Verdict(netip.MustParseAddr("10.4.0.1"), bpfmaps.ProtocolTCP, 80) {
		t.Errorf("merged policy of the kept version = %+v, want its two rules", pol.Ingress)
	}

	local := remote.DeepCopy()
	local.Spec.PodSelectorEndpoints = []v1alpha1.PodEndpoint{pod(testNode.String(), "10.1.0.1")}
	c, err := o.Compile(local, testNode)
	if err != nil {
		t.Fatal(err)
	}
	if got := o.NodeLocal(c, local, testNode); got != c {
		t.Error("a version with a local pod is not kept as compiled")
	}
	cpe := &v1alpha1.ClusterPolicyEndpoint{ObjectMeta: metav1.ObjectMeta{Name: "admin", UID: "u2"}, Spec: v1alpha1.ClusterPolicyEndpointSpec{Tier: v1alpha1.TierAdmin}}
	if c, err = o.Compile(cpe, testNode); err != nil {
		t.Fatal(err)
	}
	if got := o.NodeLocal(c, cpe, testNode); got != c {
		t.Error("a ClusterPolicyEndpoint is not kept as compiled")
	}
}
