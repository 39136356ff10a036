package testenv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeUpstreamCRDs puts the two manifest files UpstreamCRDDir looks for in dir.
func writeUpstreamCRDs(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{UpstreamPolicyEndpointCRD, UpstreamClusterPolicyEndpointCRD} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("kind: CustomResourceDefinition\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestUpstreamCRDDirIsRelativeOrTold: the CRDs are found beside the checkout
// (../shared/upstream-crds) or where NPAGENT_UPSTREAM_CRDS says, which then has no
// fallback; never at an absolute path of one machine.
func TestUpstreamCRDDirIsRelativeOrTold(t *testing.T) {
	root := t.TempDir()
	repo := filepath.Join(root, "clone")
	beside := filepath.Join(root, "shared", "upstream-crds")

	if _, err := upstreamCRDDir("", repo); err == nil {
		t.Fatal("no CRDs beside the checkout and no variable: found some (an absolute fallback?)")
	} else if !strings.Contains(err.Error(), EnvUpstreamCRDs) || !strings.Contains(err.Error(), beside) {
		t.Errorf("error %q names neither the directory looked in nor %s", err, EnvUpstreamCRDs)
	}

	writeUpstreamCRDs(t, beside)
	if got, err := upstreamCRDDir("", repo); err != nil || got != beside {
		t.Errorf("beside the checkout: %q, %v; want %q", got, err, beside)
	}

	told := filepath.Join(root, "elsewhere")
	if _, err := upstreamCRDDir(told, repo); err == nil {
		t.Error("variable set to a directory without the CRDs: fell back to the copy beside the checkout")
	}
	writeUpstreamCRDs(t, told)
	if got, err := upstreamCRDDir(told, repo); err != nil || got != told {
		t.Errorf("variable set: %q, %v; want %q", got, err, told)
	}
}
