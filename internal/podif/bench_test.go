package podif

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

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

// hostRouteLab is a network namespace with n dual-stack "pods": veths each with a /32
// and a /128 host route, as a node running n pods has. It returns a resolver on it
// and the pods' interfaces.
func hostRouteLab(b *testing.B, n int) (Resolver, []int) {
	if os.Geteuid() != 0 {
		skip.Unmet(b, "needs root: creates a network namespace, links and routes in it (CAP_NET_ADMIN)")
	}
	netlab.RequireIP(b, "build the node's network namespace")
	ns := fmt.Sprintf("npifb-%d", os.Getpid()%100000)
	netlab.AddNamespace(b, ns)
	var batch strings.Builder
	for i := range n {
		fmt.Fprintf(&batch, "link add vp%d type veth peer name vp%dp\nlink set vp%d up\n", i, i, i)
		fmt.Fprintf(&batch, "route add 10.248.%d.%d/32 dev vp%d\nroute add fd00:248::%x/128 dev vp%d\n", i/250, i%250+1, i, i+1, i)
	}
	f := filepath.Join(b.TempDir(), "batch")
	if err := os.WriteFile(f, []byte(batch.String()), 0o600); err != nil {
		b.Fatal(err)
	}
	netlab.Run(b, "ip", "-n", ns, "-batch", f)
	h, err := netns.GetFromName(ns)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = h.Close() })
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nl.Close)
	ifs := make([]int, n)
	for i := range n {
		l, err := nl.LinkByName(fmt.Sprintf("vp%d", i))
		if err != nil {
			b.Fatal(err)
		}
		ifs[i] = l.Attrs().Index
	}
	return NewRouteResolver(WithNetlinkHandle(nl)), ifs
}

// BenchmarkHostAddrs is what listing pods' own addresses costs a commit, inside the
// commit lock, on a node of 100 dual-stack pods: of one pod's two IPs (each IP's
// commit needs the pod's addresses), and of a round committing every pod's two IPs
// (a policy selecting them all). One dump serves a round (reconcile's podAddrs).
func BenchmarkHostAddrs(b *testing.B) {
	r, ifs := hostRouteLab(b, 100)
	l := r.(AddrLister)
	for _, bc := range []struct {
		name string
		pods []int
	}{{"pod", ifs[7:8]}, {"round", ifs}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				all, err := l.HostAddrsByInterface()
				if err != nil {
					b.Fatal(err)
				}
				for _, ifindex := range bc.pods {
					for range 2 {
						if a := all[ifindex]; len(a) != 2 {
							b.Fatal(a)
						}
					}
				}
			}
		})
	}
}
