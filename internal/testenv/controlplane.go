package testenv

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	crlog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/testenv/skip"
)

// ControlPlane is a running kube-apiserver and etcd with npagent's CRDs installed (or
// the ones WithCRDDir names).
type ControlPlane struct {
	// Config reaches the apiserver as an admin user; it stays valid across restarts.
	Config *rest.Config
	// Client is a controller-runtime client for creating and changing test objects.
	Client client.Client
	// Scheme knows the built-in types and networking.k8s.aws/v1alpha1.
	Scheme *runtime.Scheme

	env     *envtest.Environment
	shared  bool // Shared's: no test may stop or restart it
	certDir string
}

// Option changes how Start runs the control plane.
type Option func(*options)

type options struct {
	apiServerArgs map[string]string
	crdDir        string
}

// WithAPIServerArg sets a kube-apiserver flag, e.g. WithAPIServerArg("watch-cache",
// "false"). Default flags: shutdown-watch-termination-grace-period=2s, so a stop with
// open watches takes seconds, not the default ~20.
func WithAPIServerArg(name, value string) Option {
	return func(o *options) { o.apiServerArgs[name] = value }
}

// WithCRDDir installs the CRD manifests of dir instead of npagent's generated ones
// (CRDDir), e.g. the controller's own (UpstreamCRDDir).
func WithCRDDir(dir string) Option {
	return func(o *options) { o.crdDir = dir }
}

// Start runs a control plane for the test and stops it in tb.Cleanup.
func Start(tb testing.TB, opts ...Option) *ControlPlane {
	tb.Helper()
	cp, stop := start(tb, opts...)
	tb.Cleanup(func() {
		if err := stop(); err != nil {
			tb.Logf("testenv: stop control plane: %v", err)
		}
	})
	return cp
}

// start runs a control plane; tb is for the tools, failures and the log, and stop,
// the caller's to call, ends it and removes its certificates.
func start(tb testing.TB, opts ...Option) (cp *ControlPlane, stop func() error) {
	tb.Helper()
	o := options{apiServerArgs: map[string]string{
		"shutdown-watch-termination-grace-period": "2s",
	}, crdDir: CRDDir()}
	for _, opt := range opts {
		opt(&o)
	}
	apiserver := ToolPath(tb, "kube-apiserver")
	etcd := ToolPath(tb, "etcd")
	// envtest logs through controller-runtime's logger, which otherwise prints a
	// "SetLogger was never called" warning with a stack trace into the test output.
	crlog.SetLogger(logr.Discard())

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

	env := &envtest.Environment{
		Scheme:                   scheme,
		CRDDirectoryPaths:        []string{o.crdDir},
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

	began := time.Now()
	cfg, err := env.Start()
	if err != nil {
		os.RemoveAll(certDir)
		tb.Fatalf("testenv: start kube-apiserver (%s) and etcd (%s): %v", apiserver, etcd, err)
	}
	stop = func() error {
		defer os.RemoveAll(certDir)
		return env.Stop()
	}
	tb.Logf("testenv: control plane up in %v at %s", time.Since(began).Round(time.Millisecond), cfg.Host)

	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		_ = stop()
		tb.Fatalf("testenv: client: %v", err)
	}
	return &ControlPlane{Config: cfg, Client: c, Scheme: scheme, env: env, certDir: certDir}, stop
}

// ServiceAccountKeyFile is the private key the apiserver verifies service-account
// tokens with (envtest writes it into the serving CertDir): a kube-controller-manager
// signs the tokens it mints with it (--service-account-private-key-file).
func (c *ControlPlane) ServiceAccountKeyFile() string {
	return filepath.Join(c.certDir, "sa-signer.key")
}

// RestartAPIServer stops and starts kube-apiserver (etcd keeps running). Informers
// watching through it see their watch end and, with the watch cache on, relist.
func (c *ControlPlane) RestartAPIServer(tb testing.TB) {
	tb.Helper()
	start := time.Now()
	c.StopAPIServer(tb)
	c.StartAPIServer(tb)
	tb.Logf("testenv: kube-apiserver restarted in %v", time.Since(start).Round(time.Millisecond))
}

// StopAPIServer stops kube-apiserver; etcd keeps running. StartAPIServer starts it
// again.
func (c *ControlPlane) StopAPIServer(tb testing.TB) {
	tb.Helper()
	if c.shared {
		tb.Fatal("testenv: StopAPIServer on the shared control plane: the package's other tests use it; use Start")
	}
	if err := c.env.ControlPlane.GetAPIServer().Stop(); err != nil {
		tb.Fatalf("testenv: stop kube-apiserver: %v", err)
	}
}

// StartAPIServer starts kube-apiserver after StopAPIServer and returns once it serves
// a list of PolicyEndpoints (ready again).
func (c *ControlPlane) StartAPIServer(tb testing.TB) {
	tb.Helper()
	if err := c.env.ControlPlane.GetAPIServer().Start(); err != nil {
		tb.Fatalf("testenv: start kube-apiserver again: %v", err)
	}
	if err := c.waitReady(30 * time.Second); err != nil {
		tb.Fatalf("testenv: kube-apiserver not ready after restart: %v", err)
	}
}

// CompactEtcd compacts etcd's history up to its current revision, through etcd's
// HTTP gateway, and returns that revision. A watch or list at an older
// resourceVersion is then answered 410 Gone by etcd (with the watch cache off, or
// while the apiserver restarts its cache).
func (c *ControlPlane) CompactEtcd(tb testing.TB) int64 {
	tb.Helper()
	if c.shared {
		tb.Fatal("testenv: CompactEtcd on the shared control plane: the package's other tests use it; use Start")
	}
	base := c.env.ControlPlane.Etcd.URL.String()
	post := func(path, body string, out any) {
		resp, err := http.Post(base+path, "application/json", strings.NewReader(body))
		if err != nil {
			tb.Fatalf("testenv: etcd %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			tb.Fatalf("testenv: etcd %s: %s: %s", path, resp.Status, b)
		}
		if out != nil {
			if err := json.Unmarshal(b, out); err != nil {
				tb.Fatalf("testenv: etcd %s: %v: %s", path, err, b)
			}
		}
	}
	var status struct {
		Header struct {
			Revision string `json:"revision"` // int64 as a JSON string (grpc-gateway)
		} `json:"header"`
	}
	post("/v3/kv/range", `{"key":"AA=="}`, &status) // key "\x00": only the header is wanted
	rev, err := strconv.ParseInt(status.Header.Revision, 10, 64)
	if err != nil {
		tb.Fatalf("testenv: etcd revision %q: %v", status.Header.Revision, err)
	}
	post("/v3/kv/compaction", fmt.Sprintf(`{"revision":"%d","physical":true}`, rev), nil)
	return rev
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

// CRDDir is the folder of npagent's generated CRD manifests (make generate). They are
// schema-compatible with the controller's (api/v1alpha1's tests check it), so tests
// and the demo install them; in a cluster the controller installs its own.
func CRDDir() string { return filepath.Join(RepoRoot(), "config", "crd") }

// EnvUpstreamCRDs names a directory holding the AWS Network Policy Controller's CRD
// manifests, when they are not beside the checkout (CONTRIBUTING.md: Tests in tiers).
const EnvUpstreamCRDs = "NPAGENT_UPSTREAM_CRDS"

// UpstreamCRDDir returns the directory of the controller's own CRD manifests (test
// data kept outside the repository, never copied into it): $NPAGENT_UPSTREAM_CRDS when
// set, else ../shared/upstream-crds beside the checkout. Nothing else: the project
// finds its test data relative to itself or where it is told, never at one
// machine's absolute path (.ci/run tells it where a CI machine keeps them). When
// neither holds the manifests the test is skipped — a failure under
// NPAGENT_TEST_NO_SKIP=1.
func UpstreamCRDDir(tb testing.TB) string {
	tb.Helper()
	dir, err := upstreamCRDDir(os.Getenv(EnvUpstreamCRDs), RepoRoot())
	if err != nil {
		skip.Unmet(tb, "testenv: %v", err)
	}
	return dir
}

// upstreamCRDDir is UpstreamCRDDir's lookup: env ($NPAGENT_UPSTREAM_CRDS) when set,
// with no fallback (a wrong path is not hidden by another copy), else
// ../shared/upstream-crds beside repoRoot.
func upstreamCRDDir(env, repoRoot string) (string, error) {
	dir := env
	if dir == "" {
		dir = filepath.Join(repoRoot, "..", "shared", "upstream-crds")
	}
	if !hasUpstreamCRDs(dir) {
		return "", fmt.Errorf("the controller's CRDs (%s and %s) are not in %s; set %s to their directory",
			UpstreamPolicyEndpointCRD, UpstreamClusterPolicyEndpointCRD, dir, EnvUpstreamCRDs)
	}
	return filepath.Clean(dir), nil
}

// File names of the controller's CRD manifests, as it publishes them (controller-gen's
// naming, the same as config/crd's).
const (
	UpstreamPolicyEndpointCRD        = "networking.k8s.aws_policyendpoints.yaml"
	UpstreamClusterPolicyEndpointCRD = "networking.k8s.aws_clusterpolicyendpoints.yaml"
)

func hasUpstreamCRDs(dir string) bool {
	for _, f := range []string{UpstreamPolicyEndpointCRD, UpstreamClusterPolicyEndpointCRD} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || !st.Mode().IsRegular() {
			return false
		}
	}
	return true
}
