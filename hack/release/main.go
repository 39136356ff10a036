package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "release:", err)
		}
		os.Exit(2)
	}
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("release", flag.ContinueOnError)
	var o options
	fs.StringVar(&o.Version, "version", "", "the release's semantic version, without a v (required): the chart's version and appVersion, the image's tag")
	fs.StringVar(&o.ImageLayout, "image", "bin/image/oci", "make image's OCI layout")
	fs.StringVar(&o.Chart, "chart", "deploy/charts/npagent", "the chart's directory")
	fs.StringVar(&o.Repository, "repository", "ghcr.io/npagent/npagent", "the image repository the chart's default values name")
	fs.StringVar(&o.Out, "out", "bin/release", "where to write the artifacts")
	fs.StringVar(&o.Push, "push", "", "push the image to <this>:<version> and the chart beside it (registry/path); empty: write files only")
	fs.BoolVar(&o.PlainHTTP, "plain-http", false, "talk to the -push registry over plain HTTP (a local test registry)")
	checkOnly := fs.Bool("check-version", false, "only check -version (make release does, before building the image)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (flags only)", fs.Arg(0))
	}
	if *checkOnly {
		return checkVersion(o.Version)
	}
	r, err := build(o)
	if err != nil {
		return err
	}
	for _, a := range r.Artifacts {
		fmt.Fprintf(stdout, "==> %s  %s\n", a.SHA256, a.Path)
	}
	fmt.Fprintf(stdout, "==> image index %s; the chart installs %s@%s\n", r.IndexDigest, o.Repository, r.IndexDigest)
	if o.Push == "" {
		return nil
	}
	refs, err := push(ctx, o, r)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "==> pushed %s and %s\n", refs.Image, refs.Chart)
	return nil
}
