package testenv

import (
	"context"
	"os"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

// firstShared is the shared control plane's address as the first test that asked
// saw it.
var firstShared struct {
	sync.Mutex
	host string
}

// checkShared: every test that asks gets the one control plane, and a namespace of
// its own in it.
func checkShared(t *testing.T) {
	cp := Shared(t)
	firstShared.Lock()
	if firstShared.host == "" {
		firstShared.host = cp.Config.Host
	} else if cp.Config.Host != firstShared.host {
		t.Errorf("Shared: control plane at %s, the first test's at %s: want one", cp.Config.Host, firstShared.host)
	}
	firstShared.Unlock()
	ns := cp.Namespace(t)
	var got corev1.Namespace
	if err := cp.Client.Get(context.Background(), client.ObjectKey{Name: ns}, &got); err != nil {
		t.Fatalf("namespace %s: %v", ns, err)
	}
	if other := cp.Namespace(t); other == ns {
		t.Errorf("Namespace gave %s twice", ns)
	}
}

func TestSharedControlPlaneFirst(t *testing.T)  { checkShared(t) }
func TestSharedControlPlaneSecond(t *testing.T) { checkShared(t) }
