package reconcile

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/report"
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
	for key, obj := range map[objectKey]any{peKey: pe, cpeKey: cpe} {
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
	if n := again.prune(func(k objectKey) bool { return k == peKey }); n != 1 {
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

// TestLastValidLongNames: an object whose namespace and name take the most
// Kubernetes allows (63 and 253 bytes; kind_namespace_name.json would be 337 bytes,
// past the file system's 255) is saved under a cut, hashed name, and round-trips
// through a restart: the new store lists its key (read back from the file), loads
// it, keeps it while live, prunes it when not. Two keys that differ only past the
// cut get two files.
func TestLastValidLongNames(t *testing.T) {
	dir := t.TempDir()
	s, err := newLastValidStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	ns, name := strings.Repeat("n", 63), strings.Repeat("a", 250)
	var keys []objectKey
	for _, suffix := range []string{"-x1", "-x2"} {
		pe := &v1alpha1.PolicyEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + suffix, UID: types.UID("u" + suffix), ResourceVersion: "7"}}
		key := keyOf(report.KindPolicyEndpoint, pe)
		if err := s.save(key, pe); err != nil {
			t.Fatalf("save %d-byte name: %v", len(pe.Name), err)
		}
		keys = append(keys, key)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 2 {
		t.Fatalf("%d files for two keys: %v", len(ents), ents)
	}
	for _, e := range ents {
		if len(e.Name()) > 255 || !strings.HasPrefix(e.Name(), "PolicyEndpoint_"+ns+"_aaa") {
			t.Errorf("file name %q (%d bytes): want at most 255, readable prefix", e.Name(), len(e.Name()))
		}
	}

	again, err := newLastValidStore(dir) // a new process
	if err != nil {
		t.Fatal(err)
	}
	got := again.keys()
	slices.SortFunc(got, objectKey.compare)
	if !slices.Equal(got, keys) {
		t.Fatalf("keys after restart = %v, want %v", got, keys)
	}
	for i, key := range keys {
		obj, err := again.load(key, types.UID([]string{"u-x1", "u-x2"}[i]))
		if p, ok := obj.(*v1alpha1.PolicyEndpoint); err != nil || !ok || p.Name != key.name {
			t.Errorf("load %d = %v, %v; want the saved object", i, obj, err)
		}
	}
	if n := again.prune(func(k objectKey) bool { return k == keys[0] }); n != 1 {
		t.Errorf("pruned %d, want the second key's file", n)
	}
	if got := again.keys(); !slices.Equal(got, keys[:1]) {
		t.Errorf("keys after prune = %v, want %v", got, keys[:1])
	}
}

// TestLastValidRemovesStaleTemporaries: the temporaries a crash left in the
// directory (this build's and an older build's ".tmp-*") are removed when the store
// opens; the saved versions stay.
func TestLastValidRemovesStaleTemporaries(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{".tmp-123456", ".PolicyEndpoint_shop_web.json.tmp-5eed", "PolicyEndpoint_shop_web.json"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("{}"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := newLastValidStore(dir); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 || ents[0].Name() != "PolicyEndpoint_shop_web.json" {
		t.Errorf("directory holds %v, want the saved version only", ents)
	}
}
