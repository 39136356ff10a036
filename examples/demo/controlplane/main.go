// Command controlplane runs a local Kubernetes control plane for the demo: etcd and
// kube-apiserver (binaries built by hack/tools.sh) through envtest, with npagent's
// CRDs installed (schema-compatible with the controller's; --crd-dir can name the
// controller's own instead), bound to 127.0.0.1 on free ports. It writes an admin
// kubeconfig and keeps running until SIGTERM or SIGINT.
//
// SIGUSR1 restarts kube-apiserver (etcd keeps running, the serving certificate is
// kept): watches end and informers relist, which is the re-delivery storm npagent
// must not measure as latency. It logs "kube-apiserver restarted" when the new
// process answers.
//
// Usage:
//
//	controlplane --apiserver=PATH --etcd=PATH --crd-dir=config/crd --kubeconfig=OUT
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/npagent/npagent/api/v1alpha1"
)

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(log); err != nil {
		log.Error("controlplane failed", "err", err)
		os.Exit(1)
	}
}

func run(log *slog.Logger) error {
	// A FlagSet of its own: controller-runtime registers --kubeconfig on the global one.
	fs := flag.NewFlagSet("controlplane", flag.ExitOnError)
	apiserver := fs.String("apiserver", "", "kube-apiserver binary (required)")
	etcd := fs.String("etcd", "", "etcd binary (required)")
	crdDir := fs.String("crd-dir", "config/crd", "directory of the CRD manifests to install")
	kubeconfig := fs.String("kubeconfig", "", "where to write the admin kubeconfig (required)")
	certDir := fs.String("cert-dir", "", "directory for the apiserver's certificates (default: a temp dir)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return err
	}
	if *apiserver == "" || *etcd == "" || *kubeconfig == "" {
		return errors.New("--apiserver, --etcd and --kubeconfig are required")
	}

	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, v1alpha1.AddToScheme, apiextensionsv1.AddToScheme} {
		if err := add(scheme); err != nil {
			return err
		}
	}
	// A fixed certificate directory keeps the serving CA across the SIGUSR1 restart;
	// without it envtest makes a new CA and every client fails TLS afterwards.
	dir := *certDir
	if dir == "" {
		d, err := os.MkdirTemp("", "npagent-demo-certs-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	env := &envtest.Environment{
		Scheme:                   scheme,
		CRDDirectoryPaths:        []string{*crdDir},
		ErrorIfCRDPathMissing:    true,
		ControlPlaneStartTimeout: 2 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	env.ControlPlane.APIServer = &envtest.APIServer{Path: *apiserver, CertDir: dir}
	env.ControlPlane.Etcd = &envtest.Etcd{Path: *etcd}
	// Open watches end within 2s when the apiserver stops (default ~20s).
	env.ControlPlane.APIServer.Configure().Set("shutdown-watch-termination-grace-period", "2s")

	start := time.Now()
	cfg, err := env.Start()
	if err != nil {
		return fmt.Errorf("start kube-apiserver %s and etcd %s: %w", *apiserver, *etcd, err)
	}
	defer func() {
		if err := env.Stop(); err != nil {
			log.Warn("stop control plane", "err", err)
		}
	}()
	if err := writeKubeconfig(cfg, *kubeconfig); err != nil {
		return err
	}
	log.Info("control plane up", "apiserver", cfg.Host, "kubeconfig", *kubeconfig, "took", time.Since(start).Round(time.Millisecond))

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGUSR1)
	for sig := range sigs {
		if sig != syscall.SIGUSR1 {
			log.Info("stopping control plane", "signal", sig.String())
			return nil
		}
		api := env.ControlPlane.GetAPIServer()
		t0 := time.Now()
		if err := api.Stop(); err != nil {
			return fmt.Errorf("stop kube-apiserver: %w", err)
		}
		if err := api.Start(); err != nil {
			return fmt.Errorf("start kube-apiserver again: %w", err)
		}
		if err := waitReady(cfg, 30*time.Second); err != nil {
			return fmt.Errorf("kube-apiserver %s not ready after restart: %w", cfg.Host, err)
		}
		log.Info("kube-apiserver restarted", "apiserver", cfg.Host, "took", time.Since(t0).Round(time.Millisecond))
	}
	return nil
}

// waitReady polls until the apiserver serves the npagent API group again.
func waitReady(cfg *rest.Config, timeout time.Duration) error {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last error
	for ctx.Err() == nil {
		if last = dc.RESTClient().Get().AbsPath("/apis/" + v1alpha1.SchemeGroupVersion.String()).Do(ctx).Error(); last == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%w (last error: %v)", ctx.Err(), last)
}

// writeKubeconfig writes cfg as a kubeconfig file, atomically (the demo waits for
// the file to appear).
func writeKubeconfig(cfg *rest.Config, path string) error {
	server := cfg.Host
	if !strings.Contains(server, "://") {
		server = "https://" + server
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["demo"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["demo"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["demo"] = &clientcmdapi.Context{Cluster: "demo", AuthInfo: "demo"}
	kc.CurrentContext = "demo"
	tmp := path + ".tmp"
	if err := clientcmd.WriteToFile(*kc, tmp); err != nil {
		return fmt.Errorf("write kubeconfig %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	return nil
}
