package podif

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/npagent/npagent/internal/testenv/netlab"
	"github.com/npagent/npagent/internal/testenv/skip"
)

// TestRouteResolver: a pod's veth is found by its exact host route; an address of
// the same subnet with no host route (only the connected /24 covers it) is not, so a
// pod's policy never lands on an interface that merely routes its subnet.
func TestRouteResolver(t *testing.T) {
	if !skip.Root() {
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

// TestRouteResolverRejectsNodeInterfaces: a host route to a pod IP is not enough; the
// interface it names must be plausibly a pod's. In a network namespace of its own
// (through a netlink handle on it), host routes point at a veth (accepted), at the
// IPv4 and at the IPv6 uplink (each carries its family's default route), at a device
// holding the node IP, and at loopback (all rejected, as ErrNotPodInterface and as not
// found, so the pod is retried like one whose interface is not up yet); a prefix list
// accepts or rejects the veth by name.
func TestRouteResolverRejectsNodeInterfaces(t *testing.T) {
	if !skip.Root() {
		skip.Unmet(t, "needs root: creates a network namespace, links and routes in it (CAP_NET_ADMIN)")
	}
	netlab.RequireIP(t, "build the node's network namespace")
	ns := fmt.Sprintf("npifn-%d", os.Getpid()%100000)
	netlab.AddNamespace(t, ns)
	ip := func(args ...string) { netlab.Run(t, append([]string{"ip", "-n", ns}, args...)...) }
	ip("link", "set", "lo", "up")
	ip("link", "add", "vethpod0", "type", "veth", "peer", "name", "eth0p")
	// veths stand in for the uplinks too: what matters is what they carry (kernels
	// without the dummy module exist).
	for _, dev := range []string{"up4", "up6", "nodeif"} {
		ip("link", "add", dev, "type", "veth", "peer", "name", dev+"p")
	}
	for _, dev := range []string{"vethpod0", "eth0p", "up4", "up4p", "up6", "up6p", "nodeif", "nodeifp"} {
		ip("link", "set", dev, "up")
	}
	ip("addr", "add", "192.0.2.10/24", "dev", "up4")
	ip("route", "add", "default", "via", "192.0.2.1", "dev", "up4")
	ip("-6", "route", "add", "default", "dev", "up6")
	ip("addr", "add", "198.51.100.7/32", "dev", "nodeif")
	routes := map[string]string{ // pod IP → device its host route names
		"10.249.7.2": "vethpod0", "fd00:249::2": "vethpod0",
		"10.249.7.3": "up4", "fd00:249::3": "up6", "10.249.7.4": "nodeif", "10.249.7.5": "lo",
	}
	for podIP, dev := range routes {
		ip("route", "add", podIP, "dev", dev)
	}

	h, err := netns.GetFromName(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nl.Close)
	veth, err := nl.LinkByName("vethpod0")
	if err != nil {
		t.Fatal(err)
	}

	nodeIP := netip.MustParseAddr("198.51.100.7")
	for _, tc := range []struct {
		name     string
		prefixes []string
		accept   map[string]bool // pod IP → accepted
	}{
		{"structural checks", nil, map[string]bool{"10.249.7.2": true, "fd00:249::2": true}},
		{"prefix matches", []string{"cali", "veth"}, map[string]bool{"10.249.7.2": true, "fd00:249::2": true}},
		{"prefix does not match", []string{"eni"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := NewRouteResolver(WithNetlinkHandle(nl), WithNodeIPs(nodeIP), WithInterfacePrefixes(tc.prefixes...))
			for podIP, dev := range routes {
				got, err := r.Resolve(netip.MustParseAddr(podIP))
				if tc.accept[podIP] {
					if err != nil || got != veth.Attrs().Index {
						t.Errorf("Resolve(%s) via %s = %d, %v; want %d", podIP, dev, got, err, veth.Attrs().Index)
					}
					continue
				}
				if !errors.Is(err, ErrNotPodInterface) || !errors.Is(err, ErrInterfaceNotFound) {
					t.Errorf("Resolve(%s) via %s = %d, %v; want ErrNotPodInterface and ErrInterfaceNotFound", podIP, dev, got, err)
				}
			}
		})
	}
}

// TestHostAddrs: a pod's own addresses are the host routes (both families, no
// gateway) that name its interface; a subnet route on it, a host route through a
// gateway, another interface's host routes and the kernel's routes for the host's own
// addresses on the interface (an IPv6 /128 address gets one in the main table) are not.
func TestHostAddrs(t *testing.T) {
	if !skip.Root() {
		skip.Unmet(t, "needs root: creates a network namespace, links and routes in it (CAP_NET_ADMIN)")
	}
	netlab.RequireIP(t, "build the node's network namespace")
	ns := fmt.Sprintf("npifa-%d", os.Getpid()%100000)
	netlab.AddNamespace(t, ns)
	ip := func(args ...string) { netlab.Run(t, append([]string{"ip", "-n", ns}, args...)...) }
	for _, dev := range []string{"vethpod0", "vethpod1"} {
		ip("link", "add", dev, "type", "veth", "peer", "name", dev+"p")
		ip("link", "set", dev, "up")
		ip("link", "set", dev+"p", "up")
	}
	ip("addr", "add", "10.249.8.1/24", "dev", "vethpod0")
	ip("route", "add", "10.249.7.2", "dev", "vethpod0")
	ip("route", "add", "fd00:249::2", "dev", "vethpod0")
	ip("route", "add", "10.249.9.0/24", "dev", "vethpod0")
	ip("route", "add", "10.249.7.9", "via", "10.249.8.2", "dev", "vethpod0")
	ip("route", "add", "10.249.7.3", "dev", "vethpod1")
	ip("addr", "add", "fd00:249::3/128", "dev", "vethpod0", "nodad")
	ip("addr", "add", "10.249.7.4/32", "dev", "vethpod0")

	h, err := netns.GetFromName(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nl.Close)
	veth, err := nl.LinkByName("vethpod0")
	if err != nil {
		t.Fatal(err)
	}
	veth1, err := nl.LinkByName("vethpod1")
	if err != nil {
		t.Fatal(err)
	}
	r := NewRouteResolver(WithNetlinkHandle(nl))
	all, err := r.(AddrLister).HostAddrsByInterface()
	if err != nil {
		t.Fatal(err)
	}
	got := all[veth.Attrs().Index]
	want := []netip.Addr{netip.MustParseAddr("10.249.7.2"), netip.MustParseAddr("fd00:249::2")}
	if !slices.Equal(got, want) {
		t.Errorf("HostAddrsByInterface()[vethpod0] = %v; want %v", got, want)
	}
	if got, want := all[veth1.Attrs().Index], []netip.Addr{netip.MustParseAddr("10.249.7.3")}; !slices.Equal(got, want) {
		t.Errorf("HostAddrsByInterface()[vethpod1] = %v; want %v", got, want)
	}
}
