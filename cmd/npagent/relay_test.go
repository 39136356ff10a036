package main

import (
	"crypto/tls"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/npagent/npagent/internal/testenv"
)

// TestRelayCommand: npagent relay serves TLS with the given certificate, turns
// ready once synced with the apiserver, serves its metrics, refuses a request
// without a token, and exits 0 on SIGTERM.
func TestRelayCommand(t *testing.T) {
	_, kubeconfig, _ := startControlPlane(t)
	certFile, keyFile, pool := testenv.SelfSignedLoopback(t, t.TempDir())
	listen, health := testenv.FreeLoopbackAddr(t), testenv.FreeLoopbackAddr(t)
	cmd := exec.Command(buildAgent(t), "relay", "--kubeconfig="+kubeconfig, "--listen="+listen, "--health-addr="+health,
		"--tls-cert-file="+certFile, "--tls-key-file="+keyFile)
	var logs testenv.LogBuffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			t.Logf("relay log:\n%s", logs.String())
		}
	})
	get := func(c *http.Client, url string) (int, string) {
		resp, err := c.Get(url)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	testenv.Eventually(t, 30*time.Second, "relay /readyz 200", func() bool {
		code, _ := get(http.DefaultClient, "http://"+health+"/readyz")
		return code == http.StatusOK
	})
	if _, body := get(http.DefaultClient, "http://"+health+"/metrics"); !strings.Contains(body, "npagent_relay_watchers 0") {
		t.Errorf("/metrics:\n%s", body)
	}
	tlsClient := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	code, body := get(tlsClient, "https://"+listen+"/apis/networking.k8s.aws/v1alpha1/policyendpoints")
	if code != http.StatusUnauthorized || !strings.Contains(body, "bearer token is required") {
		t.Errorf("a list without a token over TLS = %d %s, want 401", code, body)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("exit after SIGTERM: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the relay did not exit 20s after SIGTERM")
	}
}
