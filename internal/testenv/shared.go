package testenv

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The test binary's shared control plane (Shared), started by the first test that
// asks and stopped by Main.
var shared struct {
	mu   sync.Mutex
	main bool // Main runs the tests: it will stop the control plane
	cp   *ControlPlane
	stop func() error
	seq  int // namespaces handed out
}

// Main runs a package's tests and then stops the shared control plane, if one was
// started. A package whose tests call Shared has
//
//	func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
func Main(m *testing.M) int {
	shared.mu.Lock()
	shared.main = true
	shared.mu.Unlock()
	code := m.Run()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.stop != nil {
		if err := shared.stop(); err != nil {
			fmt.Fprintf(os.Stderr, "testenv: stop the shared control plane: %v\n", err)
		}
		shared.cp, shared.stop = nil, nil
	}
	return code
}

// Shared returns the control plane shared by the tests of this test binary (one
// package): kube-apiserver and etcd with npagent's CRDs, as Start gives, booted once
// instead of once per test (about 5-10 s each on 2 cores). For tests that leave
// each other alone: each keeps to its own namespace (Namespace) or its own
// cluster-scoped names, and none stops, restarts or compacts it (those fail the
// test: use Start). Needs Main in the package's TestMain, which stops it.
func Shared(tb testing.TB) *ControlPlane {
	tb.Helper()
	shared.mu.Lock()
	defer shared.mu.Unlock() // also when ToolPath skips the test
	if !shared.main {
		tb.Fatal("testenv: Shared needs func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) } in the package, which stops it")
	}
	if shared.cp == nil {
		shared.cp, shared.stop = start(tb)
		shared.cp.shared = true
	}
	return shared.cp
}

// Namespace creates a namespace of the test's own in c and returns its name; it is
// deleted when the test ends. Tests on the shared control plane keep to theirs.
func (c *ControlPlane) Namespace(tb testing.TB) string {
	tb.Helper()
	shared.mu.Lock()
	shared.seq++
	name := fmt.Sprintf("test-%d", shared.seq)
	shared.mu.Unlock()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := c.Client.Create(context.Background(), ns); err != nil {
		tb.Fatalf("testenv: create namespace %s: %v", name, err)
	}
	tb.Cleanup(func() { _ = c.Client.Delete(context.Background(), ns) })
	return name
}
