package testenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/npagent/npagent/api/v1alpha1"
)

// ControlPlane is a running kube-apiserver and etcd with npagent's CRDs installed.
type ControlPlane struct {
	// Config reaches the apiserver as an admin user; it stays valid across restarts.
	Config *rest.Config
	// Client is a controller-runtime client for creating and changing test objects.
	Client client.Client
	// Scheme knows the built-in types and networking.k8s.aws/v1alpha1.
	Scheme *runtime.Scheme

	env *envtest.Environment
}

// Option changes how Start runs the control plane.
type Option func(*options)

type options struct {
	apiServerArgs map[string]string
}

// WithAPIServerArg sets a kube-apiserver flag, e.g. WithAPIServerArg("watch-cache",
// "false"). Default flags: shutdown-watch-termination-grace-period=2s, so a stop with
// open watches takes seconds, not the default ~20.
func WithAPIServerArg(name, value string) Option {
	return func(o *options) { o.apiServerArgs[name] = value }
}

// Start runs a control plane for the test and stops it in tb.Cleanup.
func Start(tb testing.TB, opts ...Option) *ControlPlane {
	tb.Helper()
	o := options{apiServerArgs: map[string]string{
		"shutdown-watch-termination-grace-period": "2s",
	}}
	for _, opt := range opts {
		opt(&o)
	}
	apiserver := ToolPath(tb, "kube-apiserver")
	etcd := ToolPath(tb, "etcd")

	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		tb.Fatalf("testenv: scheme: %v", err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		tb.Fatalf("testenv: scheme: %v", err)
	}
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		tb.Fatalf("testenv: scheme: %v", err)
	}

	// A fixed CertDir keeps the serving certificate across RestartAPIServer: without it
	// envtest makes a new CA on each start and every client fails TLS afterwards.
	certDir, err := os.MkdirTemp("", "npagent-apiserver-certs-")
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	tb.Cleanup(func() { os.RemoveAll(certDir) })

	env := &envtest.Environment{
		Scheme:                   scheme,
		CRDDirectoryPaths:        []string{CRDDir()},
		ErrorIfCRDPathMissing:    true,
		ControlPlaneStartTimeout: 2 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	env.ControlPlane.APIServer = &envtest.APIServer{Path: apiserver, CertDir: certDir}
	env.ControlPlane.Etcd = &envtest.Etcd{Path: etcd}
	args := env.ControlPlane.APIServer.Configure()
	for k, v := range o.apiServerArgs {
		args.Set(k, v)
	}

	start := time.Now()
	cfg, err := env.Start()
	if err != nil {
		tb.Fatalf("testenv: start kube-apiserver (%s) and etcd (%s): %v", apiserver, etcd, err)
	}
	tb.Cleanup(func() {
		if err := env.Stop(); err != nil {
			tb.Logf("testenv: stop control plane: %v", err)
		}
	})
	tb.Logf("testenv: control plane up in %v at %s", time.Since(start).Round(time.Millisecond), cfg.Host)

	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		tb.Fatalf("testenv: client: %v", err)
	}
	return &ControlPlane{Config: cfg, Client: c, Scheme: scheme, env: env}
}

// RestartAPIServer stops and starts kube-apiserver (etcd keeps running). Informers
// watching through it see their watch end and, with the watch cache on, relist.
func (c *ControlPlane) RestartAPIServer(tb testing.TB) {
	tb.Helper()
	api := c.env.ControlPlane.GetAPIServer()
	start := time.Now()
	if err := api.Stop(); err != nil {
		tb.Fatalf("testenv: stop kube-apiserver: %v", err)
	}
	if err := api.Start(); err != nil {
		tb.Fatalf("testenv: start kube-apiserver again: %v", err)
	}
	if err := c.waitReady(30 * time.Second); err != nil {
		tb.Fatalf("testenv: kube-apiserver not ready after restart: %v", err)
	}
	tb.Logf("testenv: kube-apiserver restarted in %v", time.Since(start).Round(time.Millisecond))
}

func (c *ControlPlane) waitReady(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last error
	for ctx.Err() == nil {
		var list v1alpha1.PolicyEndpointList
		if last = c.Client.List(ctx, &list, client.Limit(1)); last == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%w (last error: %v)", ctx.Err(), last)
}

// CRDDir is the folder of npagent's generated CRD manifests.
func CRDDir() string { return filepath.Join(RepoRoot(), "config", "crd") }
