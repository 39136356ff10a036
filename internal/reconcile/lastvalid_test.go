package reconcile

import (
	"fmt"
	"os"
	"strconv"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/translate"
)

// TestLastValidStore: a saved version comes back for its uid only (a recreated
// object's predecessor is not it), survives a new store on the same directory,
// is pruned when its key is not live, and is removed with its object.
func TestLastValidStore(t *testing.T) {
	dir := t.TempDir()
	s, err := newLastValidStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	pe := &v1alpha1.PolicyEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-ab.c", UID: "u1", ResourceVersion: "7"},
		Spec: v1alpha1.PolicyEndpointSpec{Ingress: []v1alpha1.EndpointInfo{{CIDR: "10.0.0.0/8"}}}}
	cpe := &v1alpha1.ClusterPolicyEndpoint{ObjectMeta: metav1.ObjectMeta{Name: "deny", UID: "u2", ResourceVersion: "8"}, Spec: v1alpha1.ClusterPolicyEndpointSpec{Tier: v1alpha1.TierAdmin}}
	peKey := keyOf(report.KindPolicyEndpoint, pe)
	cpeKey := keyOf(report.KindClusterPolicyEndpoint, cpe)
	for key, obj := range map[translate.Key]any{peKey: pe, cpeKey: cpe} {
		if err := s.save(key, obj); err != nil {
			t.Fatal(err)
		}
	}

	again, err := newLastValidStore(dir) // a new process
	if err != nil {
		t.Fatal(err)
	}
	got, err := again.load(peKey, "u1")
	if p, ok := got.(*v1alpha1.PolicyEndpoint); err != nil || !ok || p.ResourceVersion != "7" || p.Spec.Ingress[0].CIDR != "10.0.0.0/8" {
		t.Errorf("load PE = %#v, %v; want resourceVersion 7 with its spec", got, err)
	}
	if got, err := again.load(peKey, "u-recreated"); got != nil || err != nil {
		t.Errorf("load for another uid = %v, %v; want nothing", got, err)
	}
	if got, err := again.load(cpeKey, "u2"); err != nil || got.(*v1alpha1.ClusterPolicyEndpoint).Name != "deny" {
		t.Errorf("load CPE = %v, %v", got, err)
	}
	if n := again.prune(func(k translate.Key) bool { return k == peKey }); n != 1 {
		t.Errorf("pruned %d, want the CPE's file", n)
	}
	if got, _ := again.load(cpeKey, "u2"); got != nil {
		t.Errorf("pruned CPE still loads")
	}
	if err := again.remove(peKey); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("files left: %v", ents)
	}
	var none *lastValidStore // "" directory: nothing kept, nothing fails
	if err := none.save(peKey, pe); err != nil {
		t.Error(err)
	}
	if got, err := none.load(peKey, "u1"); got != nil || err != nil {
		t.Errorf("nil store load = %v, %v", got, err)
	}
}

// BenchmarkLastValidSave: what saving a new valid version costs a sync (JSON, write,
// fsync, rename), for an object of 100 CIDRs.
func BenchmarkLastValidSave(b *testing.B) {
	s, err := newLastValidStore(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	pe := &v1alpha1.PolicyEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web", UID: "u1"}}
	for i := range 100 {
		pe.Spec.Ingress = append(pe.Spec.Ingress, v1alpha1.EndpointInfo{CIDR: v1alpha1.NetworkAddress(fmt.Sprintf("10.%d.%d.0/24", i/250, i%250))})
	}
	key := keyOf(report.KindPolicyEndpoint, pe)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		pe.ResourceVersion = strconv.Itoa(i) // a new version each time: no skip
		if err := s.save(key, pe); err != nil {
			b.Fatal(err)
		}
	}
}
