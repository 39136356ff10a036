package main

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/Masterminds/semver/v3"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/registry"
)

// options are the flags.
type options struct {
	Version     string
	ImageLayout string
	Chart       string
	Repository  string
	Out         string
	Push        string
	PlainHTTP   bool
}

// Labels and annotations hack/image writes: the version the image was built as.
const (
	versionLabel = "org.opencontainers.image.version"
	refName      = "org.opencontainers.image.ref.name"
)

// platforms every release carries (hack/image builds both).
var platforms = []string{"linux/amd64", "linux/arm64"}

// artifact is one file written, with its checksum.
type artifact struct {
	Path   string
	SHA256 string
}

// result is what build wrote and read.
type result struct {
	Artifacts   []artifact
	ChartFile   string
	IndexDigest v1.Hash
	index       v1.ImageIndex
}

// build writes the release's files (see the package comment).
func build(o options) (*result, error) {
	if err := checkVersion(o.Version); err != nil {
		return nil, err
	}
	if _, err := name.NewRepository(o.Repository); err != nil {
		return nil, fmt.Errorf("-repository %q: %w", o.Repository, err)
	}
	idx, err := readIndex(o.ImageLayout, o.Version)
	if err != nil {
		return nil, err
	}
	digest, err := idx.Digest()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, err
	}
	r := &result{IndexDigest: digest, index: idx}
	if r.ChartFile, err = packageChart(o, digest); err != nil {
		return nil, err
	}
	layoutTar := filepath.Join(o.Out, fmt.Sprintf("npagent-%s-oci.tar", o.Version))
	if err := tarDir(o.ImageLayout, layoutTar); err != nil {
		return nil, fmt.Errorf("archive %s: %w", o.ImageLayout, err)
	}
	var sums bytes.Buffer
	for _, f := range []string{r.ChartFile, layoutTar} {
		sum, err := sha256File(f)
		if err != nil {
			return nil, err
		}
		r.Artifacts = append(r.Artifacts, artifact{Path: f, SHA256: sum})
		fmt.Fprintf(&sums, "%s  %s\n", sum, filepath.Base(f))
	}
	if err := os.WriteFile(filepath.Join(o.Out, "SHA256SUMS"), sums.Bytes(), 0o644); err != nil {
		return nil, err
	}
	return r, nil
}

// checkVersion refuses a version Helm would not take for a chart.
func checkVersion(v string) error {
	if _, err := semver.StrictNewVersion(v); err != nil {
		return fmt.Errorf("-version %q: want a semantic version such as 0.2.0 (Helm charts need one; make release VERSION=0.2.0): %w", v, err)
	}
	return nil
}

// readIndex returns the image index make image wrote to the layout at dir for version,
// checking that it was built as that version and for every platform.
func readIndex(dir, version string) (v1.ImageIndex, error) {
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("image layout %s (make image writes it): %w", dir, err)
	}
	top, err := p.ImageIndex()
	if err != nil {
		return nil, fmt.Errorf("image layout %s: %w", dir, err)
	}
	tm, err := top.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("image layout %s: %w", dir, err)
	}
	var names []string
	for _, d := range tm.Manifests {
		names = append(names, d.Annotations[refName])
		if d.Annotations[refName] != version {
			continue
		}
		idx, err := top.ImageIndex(d.Digest)
		if err != nil {
			return nil, fmt.Errorf("image layout %s: index %s: %w", dir, d.Digest, err)
		}
		im, err := idx.IndexManifest()
		if err != nil {
			return nil, err
		}
		if got := im.Annotations[versionLabel]; got != version {
			return nil, fmt.Errorf("image layout %s: the index is labelled %s=%q, want %q", dir, versionLabel, got, version)
		}
		var have []string
		for _, m := range im.Manifests {
			if m.Platform != nil {
				have = append(have, m.Platform.OS+"/"+m.Platform.Architecture)
			}
		}
		for _, want := range platforms {
			if !slices.Contains(have, want) {
				return nil, fmt.Errorf("image layout %s: the index has platforms %v, want %v", dir, have, platforms)
			}
		}
		return idx, nil
	}
	return nil, fmt.Errorf("image layout %s holds %v, not version %q: run make image VERSION=%s (make release does)", dir, names, version, version)
}

// imageBlock is the chart's values.yaml image block up to its next top-level key.
var imageBlock = regexp.MustCompile(`(?m)^image:\n(?:[ \t#].*\n|\n)*`)

// packageChart writes the chart with the release's version and image to o.Out and
// returns the file's path.
func packageChart(o options, digest v1.Hash) (string, error) {
	ch, err := loader.Load(o.Chart)
	if err != nil {
		return "", fmt.Errorf("chart %s: %w", o.Chart, err)
	}
	ch.Metadata.Version, ch.Metadata.AppVersion = o.Version, o.Version
	var values *chart.File
	for _, f := range ch.Raw {
		if f.Name == chartutil.ValuesfileName {
			values = f
		}
	}
	if values == nil {
		return "", fmt.Errorf("chart %s: no %s", o.Chart, chartutil.ValuesfileName)
	}
	// Edit the text, not the parsed values: Helm packages values.yaml as written, and
	// its comments are the chart's documentation.
	block := imageBlock.Find(values.Data)
	if block == nil {
		return "", fmt.Errorf("chart %s: %s has no top-level image: block", o.Chart, chartutil.ValuesfileName)
	}
	edited, err := setScalar(block, "repository", o.Repository)
	if err == nil {
		edited, err = setScalar(edited, "digest", digest.String())
	}
	if err != nil {
		return "", fmt.Errorf("chart %s: %s: %w", o.Chart, chartutil.ValuesfileName, err)
	}
	values.Data = bytes.Replace(values.Data, block, edited, 1)
	parsed, err := chartutil.ReadValues(values.Data)
	if err != nil {
		return "", fmt.Errorf("chart %s: edited %s: %w", o.Chart, chartutil.ValuesfileName, err)
	}
	if img, _ := parsed["image"].(map[string]any); img["repository"] != o.Repository || img["digest"] != digest.String() {
		return "", fmt.Errorf("chart %s: edited %s has image %v, want repository %s and digest %s", o.Chart, chartutil.ValuesfileName, img, o.Repository, digest)
	}
	ch.Values = parsed
	if err := ch.Validate(); err != nil {
		return "", fmt.Errorf("chart %s: %w", o.Chart, err)
	}
	file, err := chartutil.Save(ch, o.Out)
	if err != nil {
		return "", fmt.Errorf("package chart: %w", err)
	}
	return file, nil
}

// setScalar replaces the value of the two-space-indented key in block.
func setScalar(block []byte, key, value string) ([]byte, error) {
	re := regexp.MustCompile(`(?m)^(  ` + regexp.QuoteMeta(key) + `:) .*$`)
	if !re.Match(block) {
		return nil, fmt.Errorf("image.%s not found", key)
	}
	return re.ReplaceAll(block, []byte("${1} "+value)), nil
}

// tarDir writes dir as a tar with sorted entries and fixed times and owners, so the
// same layout gives the same archive.
func tarDir(dir, file string) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error { // lexical order
		if err != nil || p == dir {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		hdr := &tar.Header{Name: filepath.ToSlash(rel), ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		if d.IsDir() {
			hdr.Typeflag, hdr.Name, hdr.Mode = tar.TypeDir, hdr.Name+"/", 0o755
			return tw.WriteHeader(hdr)
		}
		hdr.Typeflag, hdr.Mode, hdr.Size = tar.TypeReg, 0o644, info.Size()
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		src, err := os.Open(p)
		if err != nil {
			return err
		}
		defer src.Close()
		_, err = io.Copy(tw, src)
		return err
	})
	if err == nil {
		err = tw.Close()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func sha256File(file string) (string, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// pushed are the references push wrote.
type pushed struct {
	Image string // repository:version
	Chart string // oci://…/charts/npagent:version
}

// push sends the image index to o.Push:<version> and the chart to charts/npagent
// beside it.
func push(ctx context.Context, o options, r *result) (pushed, error) {
	var opts []name.Option
	if o.PlainHTTP {
		opts = append(opts, name.Insecure)
	}
	tag, err := name.NewTag(o.Push+":"+o.Version, opts...)
	if err != nil {
		return pushed{}, fmt.Errorf("-push %q: %w", o.Push, err)
	}
	if err := remote.WriteIndex(tag, r.index, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return pushed{}, fmt.Errorf("push image %s: %w", tag, err)
	}
	repo := tag.Repository
	chartRef := path.Join(repo.RegistryStr(), path.Dir(repo.RepositoryStr()), "charts", "npagent") + ":" + o.Version
	if path.Dir(repo.RepositoryStr()) == "." {
		chartRef = path.Join(repo.RegistryStr(), "charts", "npagent") + ":" + o.Version
	}
	var copts []registry.ClientOption
	if o.PlainHTTP {
		copts = append(copts, registry.ClientOptPlainHTTP())
	}
	client, err := registry.NewClient(copts...)
	if err != nil {
		return pushed{}, err
	}
	data, err := os.ReadFile(r.ChartFile)
	if err != nil {
		return pushed{}, err
	}
	if _, err := client.Push(data, chartRef); err != nil {
		return pushed{}, fmt.Errorf("push chart %s: %w", chartRef, err)
	}
	return pushed{Image: tag.String(), Chart: "oci://" + strings.TrimSuffix(chartRef, ":"+o.Version) + " --version " + o.Version}, nil
}
