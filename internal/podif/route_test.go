package podif

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"testing"

	"github.com/npagent/npagent/internal/testenv/netlab"
	"github.com/npagent/npagent/internal/testenv/skip"
)

// TestRouteResolver: a pod's veth is found by its exact host route; an address of
// the same subnet with no host route (only the connected /24 covers it) is not, so a
// pod's policy never lands on an interface that merely routes its subnet.
func TestRouteResolver(t *testing.T) {
	if os.Geteuid() != 0 {
		skip.Unmet(t, "needs root: creates a network namespace, a veth pair and a host route (CAP_NET_ADMIN)")
	}
	netlab.RequireIP(t, "build the pod's network namespace")
	id := os.Getpid() % 100000
	subnet := fmt.Sprintf("10.249.%d", id%250+1)
	ns, hostIf := fmt.Sprintf("npif-%d", id), fmt.Sprintf("npif%d", id)
	podIP, strayIP := subnet+".2", subnet+".3"
	netlab.AddNamespace(t, ns)
	netlab.Run(t, "ip", "link", "add", hostIf, "type", "veth", "peer", "name", "eth0", "netns", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", hostIf).Run() })
	netlab.Run(t, "ip", "addr", "add", subnet+".1/24", "dev", hostIf)
	netlab.Run(t, "ip", "link", "set", hostIf, "up")
	netlab.Run(t, "ip", "route", "add", podIP+"/32", "dev", hostIf, "scope", "link")
	link, err := net.InterfaceByName(hostIf)
	if err != nil {
		t.Fatal(err)
	}

	r := NewRouteResolver()
	if got, err := r.Resolve(netip.MustParseAddr(podIP)); err != nil || got != link.Index {
		t.Errorf("Resolve(%s) = %d, %v; want %d (%s)", podIP, got, err, link.Index, hostIf)
	}
	if got, err := r.Resolve(netip.MustParseAddr("::ffff:" + podIP)); err != nil || got != link.Index {
		t.Errorf("Resolve of the IPv4-mapped form = %d, %v; want %d", got, err, link.Index)
	}
	if got, err := r.Resolve(netip.MustParseAddr(strayIP)); !errors.Is(err, ErrInterfaceNotFound) {
		t.Errorf("Resolve(%s) = %d, %v; want ErrInterfaceNotFound", strayIP, got, err)
	}
}
