// Command pack builds a Go program as a static linux/amd64 binary and writes it as a
// one-layer image (the binary at /, its entrypoint) to a docker-archive tar, which
// containerd's ctr imports without a registry. hack/tools.sh packs the pause image with
// it; the e2enode tests pack their workload image.
//
//	go run ./test/e2enode/images/pack -pkg ./test/e2enode/images/pause -image NAME:TAG -out pause.tar
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func main() {
	out := flag.String("out", "image.tar", "the docker-archive to write")
	pkg := flag.String("pkg", "", "the main package to build (run from the module's root)")
	image := flag.String("image", "", "the image's name:tag")
	flag.Parse()
	if *pkg == "" || *image == "" {
		fmt.Fprintln(os.Stderr, "pack: -pkg and -image are required")
		os.Exit(2)
	}
	if err := run(*pkg, *image, *out); err != nil {
		fmt.Fprintln(os.Stderr, "pack:", err)
		os.Exit(1)
	}
}

func run(pkg, image, out string) error {
	dir, err := os.MkdirTemp("", "pause-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	base := filepath.Base(pkg)
	bin := filepath.Join(dir, base)
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build: %w", err)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: base, Mode: 0o755, Size: int64(len(data)), ModTime: time.Unix(0, 0)}); err != nil {
		return err
	}
	if _, err := tw.Write(data); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	layerBytes := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerBytes)), nil
	})
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config = v1.Config{Entrypoint: []string{"/" + base}, User: "65535:65535"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	ref, err := name.NewTag(image)
	if err != nil {
		return err
	}
	return tarball.WriteToFile(out, ref, img)
}
