package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// testOptions builds the agent from this module with a version no real build has.
func testOptions() options {
	const version = "v0.0.0-imagetest"
	return options{
		Go:        "go",
		ModuleDir: "../..",
		Package:   "./cmd/npagent",
		Version:   version,
		LDFlags:   "-X main.version=" + version,
		Revision:  "0123456789abcdef0123456789abcdef01234567",
		Source:    "https://github.com/npagent/npagent",
		Created:   time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC),
	}
}

// TestImage builds the image the way make image does, twice, writes the OCI
// layout and a docker-archive, and reads them back as a registry client would.
func TestImage(t *testing.T) {
	if testing.Short() {
		t.Skip("go build for two platforms and gzip of both binaries: not a -short test")
	}
	o := testOptions()
	images, err := buildImages(t.Context(), o, t.TempDir(), testWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	idx := newIndex(o, images)
	want, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}

	t.Run("reproducible", func(t *testing.T) {
		again, err := buildImages(t.Context(), o, t.TempDir(), testWriter{t})
		if err != nil {
			t.Fatal(err)
		}
		got, err := newIndex(o, again).Digest()
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("second build's index is %s, first's %s: the build is not reproducible", got, want)
		}
	})

	dir := filepath.Join(t.TempDir(), "oci")
	if err := writeLayout(dir, o, idx); err != nil {
		t.Fatal(err)
	}
	read := readLayout(t, dir, o.Version)
	if got, err := read.Digest(); err != nil || got != want {
		t.Fatalf("layout's index is %v (%v), want %s", got, err, want)
	}
	im, err := read.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if im.MediaType != types.OCIImageIndex {
		t.Errorf("index media type %s, want %s", im.MediaType, types.OCIImageIndex)
	}
	var got []string
	for _, d := range im.Manifests {
		if d.Platform == nil {
			t.Fatalf("manifest %s has no platform", d.Digest)
		}
		p := *d.Platform
		got = append(got, p.OS+"/"+p.Architecture)
		t.Run(p.OS+"/"+p.Architecture, func(t *testing.T) {
			if d.MediaType != types.OCIManifestSchema1 {
				t.Errorf("manifest media type %s, want %s", d.MediaType, types.OCIManifestSchema1)
			}
			img, err := read.Image(d.Digest)
			if err != nil {
				t.Fatal(err)
			}
			checkConfig(t, img, o, p)
			bin := checkFilesystem(t, img, o)
			checkStatic(t, bin)
			if p.OS == runtime.GOOS && p.Architecture == runtime.GOARCH {
				checkVersion(t, bin, o.Version)
			} else {
				t.Logf("not running the %s binary on %s/%s", p.Architecture, runtime.GOOS, runtime.GOARCH)
			}
		})
	}
	slices.Sort(got)
	if want := []string{"linux/amd64", "linux/arm64"}; !slices.Equal(got, want) {
		t.Errorf("index platforms %v, want %v", got, want)
	}

	t.Run("docker-archive", func(t *testing.T) {
		pi := images[0]
		file := tarballPath(t.TempDir(), o, pi.Platform)
		if err := writeTarball(file, o, pi.Image); err != nil {
			t.Fatal(err)
		}
		img, err := tarball.ImageFromPath(file, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			what string
			f    func(v1.Image) (v1.Hash, error)
		}{{"config", v1.Image.ConfigName}, {"layer", firstLayerDigest}} {
			a, errA := c.f(img)
			b, errB := c.f(pi.Image)
			if err := errors.Join(errA, errB); err != nil || a != b {
				t.Errorf("docker-archive's %s is %v, the index's %v (%v)", c.what, a, b, err)
			}
		}
	})
}

// readLayout opens the layout at dir and returns the index that index.json names
// by version.
func readLayout(t *testing.T, dir, version string) v1.ImageIndex {
	t.Helper()
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	top, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	m, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 1 {
		t.Fatalf("index.json lists %d manifests, want 1", len(m.Manifests))
	}
	d := m.Manifests[0]
	if got := d.Annotations["org.opencontainers.image.ref.name"]; got != version {
		t.Errorf("index.json ref.name %q, want %q", got, version)
	}
	idx, err := top.ImageIndex(d.Digest)
	if err != nil {
		t.Fatal(err)
	}
	return idx
}

func checkConfig(t *testing.T, img v1.Image, o options, p v1.Platform) {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != p.OS || cf.Architecture != p.Architecture {
		t.Errorf("config is for %s/%s, the index says %s", cf.OS, cf.Architecture, platformString(p))
	}
	if !slices.Equal(cf.Config.Entrypoint, []string{"/usr/local/bin/npagent"}) || len(cf.Config.Cmd) != 0 {
		t.Errorf("entrypoint %q cmd %q, want the binary alone", cf.Config.Entrypoint, cf.Config.Cmd)
	}
	if cf.Config.User != "0:0" {
		t.Errorf("user %q, want 0:0 (docs/how-to/build-image.md)", cf.Config.User)
	}
	if !cf.Created.Equal(o.Created) {
		t.Errorf("created %v, want the commit time %v", cf.Created.Time, o.Created)
	}
	want := map[string]string{
		"org.opencontainers.image.title":    "npagent",
		"org.opencontainers.image.version":  o.Version,
		"org.opencontainers.image.source":   o.Source,
		"org.opencontainers.image.revision": o.Revision,
		"org.opencontainers.image.created":  "2025-06-01T12:00:00Z",
	}
	if !maps.Equal(cf.Config.Labels, want) {
		t.Errorf("labels %v, want %v", cf.Config.Labels, want)
	}
}

// checkFilesystem checks the flattened filesystem (names as mutate.Extract
// cleans them) holds the binary and its directories and nothing else (no shell),
// every entry root's with the commit's time, and returns the binary.
func checkFilesystem(t *testing.T, img v1.Image, o options) []byte {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	var names []string
	var bin []byte
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.Uid != 0 || h.Gid != 0 || !h.ModTime.Equal(o.Created) {
			t.Errorf("%s: uid %d gid %d mtime %v, want 0 0 %v", h.Name, h.Uid, h.Gid, h.ModTime, o.Created)
		}
		if h.Name == "usr/local/bin/npagent" {
			if h.Mode != 0o755 {
				t.Errorf("%s: mode %o, want 755", h.Name, h.Mode)
			}
			if bin, err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, sh := range []string{"bin/sh", "usr/bin/sh", "bin/busybox"} {
		if slices.Contains(names, sh) {
			t.Errorf("the image has %s", sh)
		}
	}
	if want := []string{"usr", "usr/local", "usr/local/bin", "usr/local/bin/npagent"}; !slices.Equal(names, want) {
		t.Errorf("filesystem %q, want only %q", names, want)
	}
	if bin == nil {
		t.Fatal("no usr/local/bin/npagent in the image")
	}
	return bin
}

// checkStatic checks the binary asks for no dynamic loader (CGO_ENABLED=0): the
// image has no libc.
func checkStatic(t *testing.T, bin []byte) {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the binary is dynamically linked (PT_INTERP): the image has no libc")
		}
	}
}

// checkVersion runs the binary taken from the image and checks it prints the
// version it was built with.
func checkVersion(t *testing.T, bin []byte, version string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "npagent")
	if err := os.WriteFile(path, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(t.Context(), path, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("npagent version: %v: %s", err, out)
	}
	if got, want := string(out), "npagent "+version+"\n"; got != want {
		t.Errorf("npagent version printed %q, want %q", got, want)
	}
}

func firstLayerDigest(img v1.Image) (v1.Hash, error) {
	ls, err := img.Layers()
	if err != nil {
		return v1.Hash{}, err
	}
	if len(ls) != 1 {
		return v1.Hash{}, errors.New("want one layer")
	}
	return ls[0].Digest()
}

// testWriter sends the builder's progress to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
