package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "image:", err)
		}
		os.Exit(2)
	}
}

// run parses args, builds every platform's binary and image, and writes the OCI
// layout and the docker-archives under -out, printing progress to stdout.
func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	var o options
	var out string
	created := fs.String("created", getenv("SOURCE_DATE_EPOCH"), "the commit's time in Unix seconds: every timestamp in the image [SOURCE_DATE_EPOCH]")
	fs.StringVar(&o.Go, "go", "go", "the go command")
	fs.StringVar(&o.ModuleDir, "C", ".", "the module's root")
	fs.StringVar(&o.Package, "pkg", "./cmd/npagent", "the main package")
	fs.StringVar(&o.Version, "version", "", "the version: -X main.version, the label, the tag (required)")
	fs.StringVar(&o.LDFlags, "ldflags", "", `go build -ldflags (default "-X main.version=<version>")`)
	fs.StringVar(&o.Revision, "revision", "", "the commit the source is at (required)")
	fs.StringVar(&o.Source, "source", "https://github.com/npagent/npagent", "the repository's URL")
	fs.StringVar(&out, "out", "bin/image", "where to write oci/ and the docker-archives")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (flags only)", fs.Arg(0))
	}
	if o.Version == "" || o.Revision == "" {
		return errors.New("-version and -revision are required")
	}
	if o.LDFlags == "" {
		o.LDFlags = "-X main.version=" + o.Version
	}
	secs, err := strconv.ParseInt(*created, 10, 64)
	if err != nil {
		return fmt.Errorf("-created %q: want the commit's time in Unix seconds (git log -1 --format=%%ct), for reproducible digests", *created)
	}
	o.Created = time.Unix(secs, 0).UTC()

	bins, err := os.MkdirTemp("", "npagent-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(bins)
	images, err := buildImages(ctx, o, bins, stdout)
	if err != nil {
		return err
	}
	idx := newIndex(o, images)
	digest, err := idx.Digest()
	if err != nil {
		return err
	}
	dir := filepath.Join(out, "oci")
	fmt.Fprintf(stdout, "==> OCI layout %s (index %s, ref.name %s)\n", dir, digest, o.Version)
	if err := writeLayout(dir, o, idx); err != nil {
		return err
	}
	for _, pi := range images {
		file := tarballPath(out, o, pi.Platform)
		fmt.Fprintf(stdout, "==> docker-archive %s (npagent:%s, %s)\n", file, o.Version, platformString(pi.Platform))
		if err := writeTarball(file, o, pi.Image); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "==> image npagent:%s index %s\n", o.Version, digest)
	return nil
}

// buildImages builds each platform's binary into dir and its image.
func buildImages(ctx context.Context, o options, dir string, progress io.Writer) ([]platformImage, error) {
	var images []platformImage
	for _, p := range platforms {
		bin, err := goBuild(ctx, o, p, dir, progress)
		if err != nil {
			return nil, err
		}
		img, err := newImage(o, p, bin)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", platformString(p), err)
		}
		d, err := img.Digest()
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", platformString(p), err)
		}
		fmt.Fprintf(progress, "    image %s %s\n", platformString(p), d)
		images = append(images, platformImage{Platform: p, Binary: bin, Image: img})
	}
	return images, nil
}
