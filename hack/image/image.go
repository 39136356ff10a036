package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// binaryPath is where the agent sits in the image, and the entrypoint.
const binaryPath = "/usr/local/bin/npagent"

// imageUser is the image's default user: root, whose capabilities the pod spec
// narrows (docs/how-to/build-image.md). Numeric, since the image has no /etc/passwd.
const imageUser = "0:0"

// platforms are the ones the eBPF objects are generated for (internal/bpfmaps).
var platforms = []v1.Platform{
	{OS: "linux", Architecture: "amd64"},
	{OS: "linux", Architecture: "arm64", Variant: "v8"},
}

// options says what to build and how to label it.
type options struct {
	Go        string    // the go command
	ModuleDir string    // the module's root, where go build runs
	Package   string    // the main package, relative to ModuleDir
	Version   string    // what the binary prints and the version label
	LDFlags   string    // go build -ldflags; must set main.version to Version
	Revision  string    // the commit: the revision label
	Source    string    // the repository's URL: the source label
	Created   time.Time // the commit's time: every timestamp in the image
}

// labels are the image config's labels (and the index's annotations).
func (o options) labels() map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":    "npagent",
		"org.opencontainers.image.version":  o.Version,
		"org.opencontainers.image.source":   o.Source,
		"org.opencontainers.image.revision": o.Revision,
		"org.opencontainers.image.created":  o.Created.UTC().Format(time.RFC3339),
	}
}

// goBuild builds the static binary for p into dir and returns its path.
func goBuild(ctx context.Context, o options, p v1.Platform, dir string, progress io.Writer) (string, error) {
	out := filepath.Join(dir, "npagent-"+p.OS+"-"+p.Architecture)
	args := []string{"build", "-trimpath", "-ldflags", o.LDFlags, "-o", out, o.Package}
	fmt.Fprintf(progress, "==> go %s (%s, CGO_ENABLED=0)\n", strings.Join(args, " "), platformString(p))
	start := time.Now()
	cmd := exec.CommandContext(ctx, o.Go, args...)
	cmd.Dir = o.ModuleDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.OS, "GOARCH="+p.Architecture)
	cmd.Stdout, cmd.Stderr = progress, progress
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build %s: %w", platformString(p), err)
	}
	fmt.Fprintf(progress, "    built in %v\n", time.Since(start).Round(100*time.Millisecond))
	return out, nil
}

// layerTar is the image's only layer, uncompressed: the binary at binaryPath and
// its parent directories, owned by root, every mtime t.
func layerTar(bin []byte, t time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dir := strings.TrimPrefix(path.Dir(binaryPath), "/")
	var parents []string
	for d := dir; d != "."; d = path.Dir(d) {
		parents = append([]string{d + "/"}, parents...)
	}
	for _, d := range parents {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: t, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(binaryPath, "/"), Mode: 0o755, Size: int64(len(bin)), ModTime: t, Format: tar.FormatPAX}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, err
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// newImage is the image for p around the binary at bin.
func newImage(o options, p v1.Platform, bin string) (v1.Image, error) {
	b, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	tb, err := layerTar(b, o.Created)
	if err != nil {
		return nil, fmt.Errorf("layer tar: %w", err)
	}
	layer, err := tarball.LayerFromOpener(
		func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(tb)), nil },
		tarball.WithMediaType(types.OCILayer),
		tarball.WithCompressionLevel(gzip.DefaultCompression),
		tarball.WithCompressedCaching)
	if err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	base, err = mutate.ConfigFile(base, &v1.ConfigFile{
		Architecture: p.Architecture,
		OS:           p.OS,
		Variant:      p.Variant,
		Created:      v1.Time{Time: o.Created},
		Config: v1.Config{
			Entrypoint: []string{binaryPath},
			User:       imageUser,
			Labels:     o.labels(),
		},
		RootFS: v1.RootFS{Type: "layers"},
	})
	if err != nil {
		return nil, err
	}
	return mutate.Append(base, mutate.Addendum{
		Layer: layer,
		History: v1.History{
			Created:   v1.Time{Time: o.Created},
			CreatedBy: fmt.Sprintf("CGO_ENABLED=0 go build -trimpath -ldflags %q %s", o.LDFlags, o.Package),
			Comment:   "hack/image",
		},
	})
}

// platformImage is one platform's image and the binary it holds.
type platformImage struct {
	Platform v1.Platform
	Binary   string
	Image    v1.Image
}

// newIndex is the multi-platform index over images.
func newIndex(o options, images []platformImage) v1.ImageIndex {
	adds := make([]mutate.IndexAddendum, 0, len(images))
	for _, pi := range images {
		p := pi.Platform
		adds = append(adds, mutate.IndexAddendum{Add: pi.Image, Descriptor: v1.Descriptor{Platform: &p}})
	}
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), adds...)
	return mutate.Annotations(idx, o.labels()).(v1.ImageIndex)
}

// writeLayout replaces dir with an OCI image layout holding idx, named by the
// version (org.opencontainers.image.ref.name in index.json).
func writeLayout(dir string, o options, idx v1.ImageIndex) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("oci layout %s: %w", dir, err)
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": o.Version})); err != nil {
		return fmt.Errorf("oci layout %s: %w", dir, err)
	}
	return nil
}

// tarballPath is where the docker-archive for p is written.
func tarballPath(dir string, o options, p v1.Platform) string {
	return filepath.Join(dir, fmt.Sprintf("npagent-%s-%s.tar", o.Version, p.Architecture))
}

// writeTarball writes img as a docker-archive tagged npagent:<version>.
func writeTarball(file string, o options, img v1.Image) error {
	tag, err := name.NewTag("npagent:" + o.Version)
	if err != nil {
		return fmt.Errorf("tag for version %q: %w", o.Version, err)
	}
	if err := tarball.WriteToFile(file, tag, img); err != nil {
		return fmt.Errorf("docker-archive %s: %w", file, err)
	}
	return nil
}

func platformString(p v1.Platform) string {
	s := p.OS + "/" + p.Architecture
	if p.Variant != "" {
		s += "/" + p.Variant
	}
	return s
}
