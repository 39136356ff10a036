package main

import (
	"bufio"
	"context"
	"io"
	"log"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/registry"

	"github.com/npagent/npagent/deploy/charts"
)

// writeLayout writes an OCI layout shaped as hack/image writes it — one index for
// plats, labelled and named builtAs — with random single-layer images (the
// packaging under test does not look inside them).
func writeLayout(t *testing.T, builtAs string, plats ...string) string {
	t.Helper()
	var adds []mutate.IndexAddendum
	for _, p := range plats {
		img, err := random.Image(256, 1)
		if err != nil {
			t.Fatal(err)
		}
		os, arch, _ := strings.Cut(p, "/")
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: os, Architecture: arch}}})
	}
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), adds...)
	idx = mutate.Annotations(idx, map[string]string{versionLabel: builtAs}).(v1.ImageIndex)
	dir := filepath.Join(t.TempDir(), "oci")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{refName: builtAs})); err != nil {
		t.Fatal(err)
	}
	return dir
}

func testOptions(t *testing.T, layoutDir string) options {
	return options{Version: "0.2.0", ImageLayout: layoutDir, Chart: charts.Dir("npagent"), Repository: "registry.example/npagent/npagent", Out: t.TempDir()}
}

// renderImage renders the packaged chart with Helm (install, client-only dry run)
// and returns the agent container's image.
func renderImage(t *testing.T, ch *chart.Chart) string {
	t.Helper()
	install := action.NewInstall(&action.Configuration{})
	install.ClientOnly, install.DryRun, install.ReleaseName, install.Namespace = true, true, "npagent", "npagent"
	install.KubeVersion = &chartutil.KubeVersion{Version: "v1.37.2", Major: "1", Minor: "37"} // the chart's kubeVersion range
	rel, err := install.Run(ch, nil)
	if err != nil {
		t.Fatalf("helm install --dry-run of the packaged chart: %v", err)
	}
	for _, line := range strings.Split(rel.Manifest, "\n") {
		if s := strings.TrimSpace(line); strings.HasPrefix(s, "image: ") {
			return strings.Trim(strings.TrimPrefix(s, "image: "), `"`)
		}
	}
	t.Fatal("no image in the rendered manifest")
	return ""
}

// TestReleaseArtifacts: the packaged chart carries the release's version and installs
// the built index by digest; the layout archive holds that index; SHA256SUMS checks
// both files.
func TestReleaseArtifacts(t *testing.T) {
	o := testOptions(t, writeLayout(t, "0.2.0", "linux/amd64", "linux/arm64"))
	r, err := build(o)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := loader.Load(r.ChartFile)
	if err != nil {
		t.Fatalf("load %s: %v", r.ChartFile, err)
	}
	if ch.Metadata.Version != "0.2.0" || ch.Metadata.AppVersion != "0.2.0" {
		t.Errorf("chart version %s, appVersion %s; want 0.2.0", ch.Metadata.Version, ch.Metadata.AppVersion)
	}
	want := o.Repository + "@" + r.IndexDigest.String()
	if got := renderImage(t, ch); got != want {
		t.Errorf("the packaged chart installs %s, want %s", got, want)
	}
	for _, f := range ch.Raw {
		if f.Name == "values.yaml" && !strings.Contains(string(f.Data), "# make image builds npagent:<version>") {
			t.Error("values.yaml lost its comments in the package")
		}
	}

	// The archive is the layout: unpacked, it holds the same index.
	dir := t.TempDir()
	if err := untar(filepath.Join(o.Out, "npagent-0.2.0-oci.tar"), dir); err != nil {
		t.Fatal(err)
	}
	idx, err := readIndex(dir, "0.2.0")
	if err != nil {
		t.Fatalf("the archived layout: %v", err)
	}
	if d, _ := idx.Digest(); d != r.IndexDigest {
		t.Errorf("the archived layout's index is %s, want %s", d, r.IndexDigest)
	}

	// SHA256SUMS names both files with their sums, as sha256sum -c reads it.
	f, err := os.Open(filepath.Join(o.Out, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lines := 0
	for sc := bufio.NewScanner(f); sc.Scan(); lines++ {
		sum, file, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			t.Fatalf("SHA256SUMS line %q", sc.Text())
		}
		got, err := sha256File(filepath.Join(o.Out, file))
		if err != nil || got != sum {
			t.Errorf("%s: sum %s, file's %s (%v)", file, sum, got, err)
		}
	}
	if lines != 2 {
		t.Errorf("SHA256SUMS has %d lines, want 2", lines)
	}

	// The same input gives the same archive (no times or owners of this machine).
	o2 := o
	o2.Out = t.TempDir()
	r2, err := build(o2)
	if err != nil {
		t.Fatal(err)
	}
	if r.Artifacts[1].SHA256 != r2.Artifacts[1].SHA256 {
		t.Error("two releases of one layout give different archives")
	}
}

// TestReleaseRefuses: what must not become a release is refused with the reason.
func TestReleaseRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, version, builtAs string
		plats                  []string
		want                   string
	}{
		{"not semantic", "0cca719-dirty", "0cca719-dirty", []string{"linux/amd64", "linux/arm64"}, "semantic version"},
		{"a v prefix", "v0.2.0", "v0.2.0", []string{"linux/amd64", "linux/arm64"}, "semantic version"},
		{"image of another version", "0.2.0", "0.1.9", []string{"linux/amd64", "linux/arm64"}, `not version "0.2.0": run make image VERSION=0.2.0`},
		{"one platform", "0.2.0", "0.2.0", []string{"linux/amd64"}, "want [linux/amd64 linux/arm64]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := testOptions(t, writeLayout(t, tc.builtAs, tc.plats...))
			o.Version = tc.version
			if _, err := build(o); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("build: %v, want an error containing %q", err, tc.want)
			}
			if entries, _ := os.ReadDir(o.Out); len(entries) != 0 {
				t.Errorf("a refused release wrote %d files", len(entries))
			}
		})
	}
}

// TestReleasePush: pushed to an OCI registry (go-containerregistry's, in the test),
// the image index is there under the version, and Helm pulls the chart back from its
// oci:// reference, pointing at that index.
func TestReleasePush(t *testing.T) {
	srv := httptest.NewServer(ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	o := testOptions(t, writeLayout(t, "0.2.0", "linux/amd64", "linux/arm64"))
	o.Push, o.PlainHTTP = u.Host+"/npagent/npagent", true
	o.Repository = o.Push
	r, err := build(o)
	if err != nil {
		t.Fatal(err)
	}
	refs, err := push(context.Background(), o, r)
	if err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag(o.Push+":0.2.0", name.Insecure)
	idx, err := remote.Index(tag)
	if err != nil {
		t.Fatalf("pull %s: %v", tag, err)
	}
	if d, _ := idx.Digest(); d != r.IndexDigest {
		t.Errorf("the registry holds %s at %s, want %s", d, tag, r.IndexDigest)
	}
	client, err := registry.NewClient(registry.ClientOptPlainHTTP())
	if err != nil {
		t.Fatal(err)
	}
	chartRef := u.Host + "/npagent/charts/npagent:0.2.0"
	if want := "oci://" + u.Host + "/npagent/charts/npagent --version 0.2.0"; refs.Chart != want {
		t.Errorf("chart pushed as %q, want %q", refs.Chart, want)
	}
	pulled, err := client.Pull(chartRef, registry.PullOptWithChart(true))
	if err != nil {
		t.Fatalf("helm pull oci://%s: %v", chartRef, err)
	}
	ch, err := loader.LoadArchive(strings.NewReader(string(pulled.Chart.Data)))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := renderImage(t, ch), o.Push+"@"+r.IndexDigest.String(); got != want {
		t.Errorf("the chart pulled from the registry installs %s, want %s", got, want)
	}
}
