package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/npagent/npagent/internal/relay"
)

// runRelay is `npagent relay`: the relay tier (internal/relay), serving agents their
// node's policy endpoint objects over TLS, with health and metrics on a plain
// listener of their own.
func runRelay(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	flags := flag.NewFlagSet("npagent relay", flag.ContinueOnError)
	flags.SetOutput(stderr)
	envOr := func(name, def string) string {
		if v := getenv(name); v != "" {
			return v
		}
		return def
	}
	kubeconfig := flags.String("kubeconfig", envOr("KUBECONFIG", ""), "kubeconfig file; empty: in-cluster configuration [$KUBECONFIG]")
	listen := flags.String("listen", envOr("NPAGENT_RELAY_LISTEN", ":8443"), "host:port agents connect to (TLS) [$NPAGENT_RELAY_LISTEN]")
	certFile := flags.String("tls-cert-file", envOr("NPAGENT_RELAY_TLS_CERT_FILE", ""), "serving certificate (PEM), read again when the file changes (cert-manager renewals) [$NPAGENT_RELAY_TLS_CERT_FILE]")
	keyFile := flags.String("tls-key-file", envOr("NPAGENT_RELAY_TLS_KEY_FILE", ""), "its private key (PEM) [$NPAGENT_RELAY_TLS_KEY_FILE]")
	healthAddr := flags.String("health-addr", envOr("NPAGENT_RELAY_HEALTH_ADDR", ":8080"), "host:port serving /livez, /readyz (synced with the apiserver) and /metrics, plain HTTP [$NPAGENT_RELAY_HEALTH_ADDR]")
	window := flags.Int("window-events", 10000, "recent events kept per resource: a watch from an older resourceVersion is 410 Gone (the agent lists again)")
	bookmarks := flags.Duration("bookmark-interval", 15*time.Second, "how often an idle watch gets a bookmark")
	reviewTTL := flags.Duration("review-ttl", time.Minute, "how long a token's TokenReview and SubjectAccessReviews are cached")
	logLevel := flags.String("log-level", envOr("NPAGENT_LOG_LEVEL", "info"), "log level: debug, info, warn or error [$NPAGENT_LOG_LEVEL]")
	flags.Usage = func() {
		fmt.Fprint(stderr, `Usage: npagent relay --tls-cert-file FILE --tls-key-file FILE [flags]

Runs the relay tier: lists and watches PolicyEndpoints, ClusterPolicyEndpoints and
Nodes once, and serves each agent (npagent --relay-url) its node's view of the first
two with the apiserver's list and watch semantics. Agents authenticate with their
pod's service-account token (TokenReview; the token must name its node). Needs RBAC
to list and watch those three, and to create tokenreviews and subjectaccessreviews
(the chart's relay.enabled sets it up; docs/how-to/relay.md).

Flags:
`)
		flags.PrintDefaults()
	}
	pos, err := parseInterspersed(flags, args)
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	if err == nil && len(pos) > 0 {
		err = fmt.Errorf("relay: unexpected argument %q", pos[0])
	}
	if err == nil && (*certFile == "" || *keyFile == "") {
		err = errors.New("relay: --tls-cert-file and --tls-key-file are required (agents send their tokens: never in clear)")
	}
	var level slog.Level
	if err == nil {
		if e := level.UnmarshalText([]byte(*logLevel)); e != nil {
			err = fmt.Errorf("relay: --log-level %q: %w", *logLevel, e)
		}
	}
	if err != nil {
		return usageError{err}
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})).With("component", "relay")
	certs := &certReloader{certFile: *certFile, keyFile: *keyFile}
	if _, err := certs.get(nil); err != nil {
		return err
	}
	rc, err := loadRESTConfig(*kubeconfig)
	if err != nil {
		return err
	}
	r, err := relay.New(rc, relay.Config{WindowEvents: *window, BookmarkInterval: *bookmarks, ReviewTTL: *reviewTTL, Logger: log})
	if err != nil {
		return err
	}
	api := &http.Server{Addr: *listen, Handler: r.Handler(), TLSConfig: &tls.Config{GetCertificate: certs.get, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
	health := &http.Server{Addr: *healthAddr, Handler: r.Handler(), ReadHeaderTimeout: 10 * time.Second}
	apiLn, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("relay: --listen %s: %w", *listen, err)
	}
	healthLn, err := net.Listen("tcp", *healthAddr)
	if err != nil {
		apiLn.Close()
		return fmt.Errorf("relay: --health-addr %s: %w", *healthAddr, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	serveErr := make(chan error, 2)
	wg.Go(func() {
		if err := api.ServeTLS(apiLn, "", ""); !errors.Is(err, http.ErrServerClosed) {
			serveErr <- err
		}
	})
	wg.Go(func() {
		if err := health.Serve(healthLn); !errors.Is(err, http.ErrServerClosed) {
			serveErr <- err
		}
	})
	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(ctx) }()
	log.Info("relay started", "listen", apiLn.Addr().String(), "health", healthLn.Addr().String(), "version", agentVersion())
	select {
	case <-ctx.Done():
	case err = <-serveErr:
		log.Error("serving failed", "err", err)
	}
	cancel()
	shutdown, stop := context.WithTimeout(context.Background(), 5*time.Second)
	defer stop()
	_ = api.Shutdown(shutdown) // open watches end with their requests' contexts
	api.Close()
	_ = health.Shutdown(shutdown)
	wg.Wait()
	if e := <-runErr; err == nil {
		err = e
	}
	log.Info("relay stopped")
	return err
}

// certReloader serves the certificate of its files, read again when either
// changes (a renewal rewrites them; open connections keep theirs).
type certReloader struct {
	certFile, keyFile string

	mu      sync.Mutex
	cert    *tls.Certificate
	modTime time.Time
}

func (c *certReloader) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	var mod time.Time
	for _, f := range []string{c.certFile, c.keyFile} {
		fi, err := os.Stat(f)
		if err != nil {
			return nil, fmt.Errorf("relay: serving certificate: %w", err)
		}
		if fi.ModTime().After(mod) {
			mod = fi.ModTime()
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cert != nil && mod.Equal(c.modTime) {
		return c.cert, nil
	}
	cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		if c.cert != nil { // a renewal half written: keep the one that works
			return c.cert, nil
		}
		return nil, fmt.Errorf("relay: serving certificate %s, key %s: %w", c.certFile, c.keyFile, err)
	}
	c.cert, c.modTime = &cert, mod
	return c.cert, nil
}
