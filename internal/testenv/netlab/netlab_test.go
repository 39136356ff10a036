package netlab

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/npagent/npagent/internal/testenv/skip"
)

// A server started in a namespace answers clients in that namespace, over TCP and
// UDP, and is out of reach from the caller's namespace; the namespace is gone
// after the test.
func TestEchoStaysInItsNamespace(t *testing.T) {
	if testing.Short() {
		t.Skip("creates a network namespace")
	}
	if !skip.Root() {
		skip.Unmet(t, "needs root to create a network namespace (CAP_SYS_ADMIN, CAP_NET_ADMIN)")
	}
	RequireIP(t, "create a network namespace")
	ns := fmt.Sprintf("npl-test-%d", os.Getpid()%100000)
	t.Run("lab", func(t *testing.T) {
		AddNamespace(t, ns)
		ServeEcho(t, ns, "tcp4", "127.0.0.1:7007")
		ServeEcho(t, ns, "udp4", "127.0.0.1:7007")
		for _, network := range []string{"tcp4", "udp4"} {
			if err := Exchange(ns, network, "127.0.0.1:7007", time.Second); err != nil {
				t.Errorf("%s echo inside %s: %v", network, ns, err)
			}
		}
		if err := Exchange("", "tcp4", "127.0.0.1:7007", 200*time.Millisecond); err == nil {
			t.Errorf("the namespace's server answered from the caller's namespace")
		}
	})
	if out, err := exec.Command("ip", "netns", "list").CombinedOutput(); err != nil {
		t.Fatalf("ip netns list: %v", err)
	} else if containsWord(string(out), ns) {
		t.Errorf("namespace %s still exists after its test ended:\n%s", ns, out)
	}
}

func containsWord(s, w string) bool { return slices.Contains(strings.Fields(s), w) }
