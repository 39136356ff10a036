package charts

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestExamplesAreTheChartRendered: examples/deploy is what make chart writes, and its
// rbac.yaml, daemonset.yaml and pod-status-policy.yaml together are helm template of
// the default values.
func TestExamplesAreTheChartRendered(t *testing.T) {
	want, err := Examples()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(filepath.Dir(Dir("npagent")), "..", "..", "examples", "deploy")
	got := map[string]string{}
	for _, f := range want {
		b, err := os.ReadFile(filepath.Join(dir, f.Name))
		if err != nil {
			t.Fatalf("%v (make chart writes it)", err)
		}
		got[f.Name] = string(b)
		if string(b) != f.Content {
			t.Errorf("examples/deploy/%s is not the chart rendered: run make chart", f.Name)
		}
	}
	def := render(t, cases[0])
	if all := ExampleBody(got["rbac.yaml"]) + ExampleBody(got["daemonset.yaml"]) + ExampleBody(got["pod-status-policy.yaml"]); all != def.String() {
		t.Errorf("examples/deploy/rbac.yaml + daemonset.yaml + pod-status-policy.yaml differ from helm template of the default values: %s", firstDiff(all, def.String()))
	}
	ns := objects(t, Rendered{Manifests: []Manifest{{Content: ExampleBody(got["namespace.yaml"])}}})
	if len(ns) != 1 || ns[0].GetKind() != "Namespace" || ns[0].GetName() != ExampleRelease.Namespace {
		t.Errorf("examples/deploy/namespace.yaml: want the Namespace %s", ExampleRelease.Namespace)
	}
}

// firstDiff names the first line where got and want differ.
func firstDiff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := range max(len(g), len(w)) {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return fmt.Sprintf("line %d: %q, want %q", i+1, gl, wl)
		}
	}
	return "equal"
}
