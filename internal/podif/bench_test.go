package podif

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"testing"

	"github.com/npagent/npagent/internal/testenv/netlab"
	"github.com/npagent/npagent/internal/testenv/skip"
)

// BenchmarkRouteResolve is one Resolve of a pod behind a veth in the host's namespace,
// with the node IP given (the agent's configuration): what each pod of a commit pays,
// inside the commit lock.
func BenchmarkRouteResolve(b *testing.B) {
	if !skip.Root() {
		skip.Unmet(b, "needs root: creates a veth pair and a host route (CAP_NET_ADMIN)")
	}
	netlab.RequireIP(b, "build the pod's interface")
	id := os.Getpid() % 100000
	hostIf, podIP := fmt.Sprintf("npib%d", id), fmt.Sprintf("10.249.%d.2", id%250+1)
	netlab.Run(b, "ip", "link", "add", hostIf, "type", "veth", "peer", "name", hostIf+"p")
	b.Cleanup(func() { _ = exec.Command("ip", "link", "del", hostIf).Run() })
	netlab.Run(b, "ip", "link", "set", hostIf, "up")
	netlab.Run(b, "ip", "route", "add", podIP+"/32", "dev", hostIf, "scope", "link")
	r := NewRouteResolver(WithNodeIPs(netip.MustParseAddr("192.0.2.1")))
	pod := netip.MustParseAddr(podIP)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Resolve(pod); err != nil {
			b.Fatal(err)
		}
	}
}
