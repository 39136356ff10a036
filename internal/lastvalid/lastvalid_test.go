package lastvalid

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// version is a Version for the tests: an object's identity and a payload.
type version struct {
	Kind, Namespace, Name, UID, RV string
	Payload                        string `json:",omitempty"`
}

func (v version) Identity() (Key, string, string, bool) {
	if v.Kind == "" {
		return Key{}, "", "", false
	}
	return Key{v.Kind, v.Namespace, v.Name}, v.UID, v.RV, true
}

func (v version) key() Key { k, _, _, _ := v.Identity(); return k }

var kinds = []string{"PolicyEndpoint", "ClusterPolicyEndpoint"}

// TestStore: a saved version comes back for its uid only (a recreated object's
// predecessor is not it), survives a new store on the same directory, is pruned when
// its key is not live, and is removed with its object; a nil store keeps nothing and
// fails nothing.
func TestStore(t *testing.T) {
	dir := t.TempDir()
	s, err := Open[version](dir, kinds...)
	if err != nil {
		t.Fatal(err)
	}
	pe := version{Kind: "PolicyEndpoint", Namespace: "shop", Name: "web-ab.c", UID: "u1", RV: "7", Payload: "10.0.0.0/8"}
	cpe := version{Kind: "ClusterPolicyEndpoint", Name: "deny", UID: "u2", RV: "8"}
	for _, v := range []version{pe, cpe} {
		if err := s.Save(v); err != nil {
			t.Fatal(err)
		}
	}

	again, err := Open[version](dir, kinds...) // a new process
	if err != nil {
		t.Fatal(err)
	}
	if got, ok, err := again.Load(pe.key(), "u1"); err != nil || !ok || got != pe {
		t.Errorf("Load PE = %#v, %v, %v; want %#v", got, ok, err, pe)
	}
	if got, ok, err := again.Load(pe.key(), "u-recreated"); ok || err != nil {
		t.Errorf("Load for another uid = %v, %v, %v; want nothing", got, ok, err)
	}
	if got, ok, err := again.Load(cpe.key(), "u2"); err != nil || !ok || got.Name != "deny" {
		t.Errorf("Load CPE = %v, %v, %v", got, ok, err)
	}
	if n := again.Prune(func(k Key) bool { return k == pe.key() }); n != 1 {
		t.Errorf("pruned %d, want the CPE's file", n)
	}
	if _, ok, _ := again.Load(cpe.key(), "u2"); ok {
		t.Errorf("pruned CPE still loads")
	}
	if err := again.Remove(pe.key()); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("files left: %v", ents)
	}
	var none *Store[version] // Open("") returns it: nothing kept, nothing fails
	if s, err := Open[version]("", kinds...); s != nil || err != nil {
		t.Errorf(`Open("") = %v, %v; want nil`, s, err)
	}
	if err := none.Save(pe); err != nil {
		t.Error(err)
	}
	if got, ok, err := none.Load(pe.key(), "u1"); ok || err != nil {
		t.Errorf("nil store Load = %v, %v, %v", got, ok, err)
	}
	if keys, n := none.Keys(), none.Prune(func(Key) bool { return false }); keys != nil || n != 0 {
		t.Errorf("nil store Keys, Prune = %v, %d", keys, n)
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
	s, err := Open[version](dir, kinds...)
	if err != nil {
		t.Fatal(err)
	}
	ns, name := strings.Repeat("n", 63), strings.Repeat("a", 250)
	var keys []Key
	for _, suffix := range []string{"-x1", "-x2"} {
		v := version{Kind: "PolicyEndpoint", Namespace: ns, Name: name + suffix, UID: "u" + suffix, RV: "7"}
		if err := s.Save(v); err != nil {
			t.Fatalf("save %d-byte name: %v", len(v.Name), err)
		}
		keys = append(keys, v.key())
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

	again, err := Open[version](dir, kinds...) // a new process
	if err != nil {
		t.Fatal(err)
	}
	got := again.Keys()
	slices.SortFunc(got, Key.Compare)
	if !slices.Equal(got, keys) {
		t.Fatalf("keys after restart = %v, want %v", got, keys)
	}
	for i, key := range keys {
		v, ok, err := again.Load(key, []string{"u-x1", "u-x2"}[i])
		if err != nil || !ok || v.Name != key.Name {
			t.Errorf("load %d = %v, %v, %v; want the saved object", i, v, ok, err)
		}
	}
	if n := again.Prune(func(k Key) bool { return k == keys[0] }); n != 1 {
		t.Errorf("pruned %d, want the second key's file", n)
	}
	if got := again.Keys(); !slices.Equal(got, keys[:1]) {
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
	if _, err := Open[version](dir, kinds...); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 || ents[0].Name() != "PolicyEndpoint_shop_web.json" {
		t.Errorf("directory holds %v, want the saved version only", ents)
	}
}

// TestKeysSkipsOtherFiles: a file whose name carries a kind the store was not opened
// with, or no ".json", is not one of its keys.
func TestKeysSkipsOtherFiles(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"Pod_shop_web.json", "PolicyEndpoint_shop_web", "PolicyEndpoint_shop_web.json"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("{}"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s, err := Open[version](dir, kinds...)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s.Keys(), []Key{{"PolicyEndpoint", "shop", "web"}}; !slices.Equal(got, want) {
		t.Errorf("Keys = %v, want %v", got, want)
	}
}
