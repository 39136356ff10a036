package main

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/npagent/npagent/internal/testenv"
)

// TestAgentRelayDownFallsBack: an agent told to read its policy endpoints from a
// relay that does not answer reads them from the apiserver: it turns ready, says so
// in its log, and handles a PolicyEndpoint written after it started.
func TestAgentRelayDownFallsBack(t *testing.T) {
	cp, kubeconfig, stateFile := startControlPlane(t)
	_, deadRelay := deadAPIServer(t) // an address nothing listens at
	a := startAgent(t, kubeconfig, stateFile, "--relay-url", "https://"+deadRelay)
	testenv.Eventually(t, 30*time.Second, "/readyz 200", func() bool { code, _ := a.get(t, "/readyz"); return code == http.StatusOK })
	if !strings.Contains(a.logs(), "relay did not answer: using the apiserver") {
		t.Errorf("no fallback to the apiserver in the log:\n%s", a.logs())
	}
	// A PolicyEndpoint with no pod on this node: consumed without a report.
	pe := policyEndpoint("elsewhere", "10.99.0.1", time.Now())
	pe.Spec.PodSelectorEndpoints[0].HostIP = "192.0.2.250"
	if err := cp.Client.Create(context.Background(), pe); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the PolicyEndpoint written after the start reaches the agent", func() bool {
		return a.metric(t, suppressed, `reason="no_local_pods"`) >= 1
	})
	if code := a.stop(t); code != 0 {
		t.Fatalf("exit code after SIGTERM = %d, want 0", code)
	}
}
