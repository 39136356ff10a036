package nodeaddrs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/testenv/netlab"
	"github.com/npagent/npagent/internal/testenv/skip"
)

func TestNodeSet(t *testing.T) {
	a := netip.MustParseAddr
	ifaces := []Iface{
		{Name: "lo", Kind: "device", Loopback: true, Addrs: []netip.Addr{a("127.0.0.1"), a("::1"), a("10.0.0.99")}},
		{Name: "eth0", Kind: "device", Addrs: []netip.Addr{a("10.0.0.5"), a("10.0.0.50"), a("fe80::1%eth0"), a("2001:db8::5")}},
		{Name: "eth1", Kind: "device", Addrs: []netip.Addr{a("192.0.2.7"), a("192.0.2.8")}}, // holds the ExternalIP
		{Name: "kube-ipvs0", Kind: "dummy", Addrs: []netip.Addr{a("10.96.0.1"), a("10.96.0.10")}},
		{Name: "nodelocaldns", Kind: "dummy", Addrs: []netip.Addr{a("169.254.20.10")}},
		{Name: "bgp0", Kind: "dummy", Addrs: []netip.Addr{a("2001:db8::9"), a("2001:db8::100")}}, // a status address and an anycast VIP
		{Name: "eni1a2b", Kind: "veth", Addrs: []netip.Addr{a("10.251.3.1")}},                    // a pod's host side
		{Name: "tun0", Kind: "tun", Addrs: []netip.Addr{a("172.16.0.1")}},                        // another network
		{Name: "cilium_host", Kind: "veth", Addrs: []netip.Addr{a("10.0.1.1")}},
	}
	src := Sources{NodeIP: a("10.0.0.5"), Status: []netip.Addr{a("::ffff:192.0.2.7"), a("10.0.0.99"), a("2001:db8::9")},
		Extra: []netip.Prefix{netip.MustParsePrefix("169.254.20.10/32"), netip.MustParsePrefix("fd00:10::7/64")}}
	got, left := nodeSet(ifaces, src, 1024)
	want := []netip.Prefix{
		netip.MustParsePrefix("10.0.0.5/32"),
		netip.MustParsePrefix("10.0.0.50/32"), // eth0 holds the node IP: all its addresses
		netip.MustParsePrefix("10.0.0.99/32"), // a status address on lo: itself only
		netip.MustParsePrefix("169.254.20.10/32"),
		netip.MustParsePrefix("192.0.2.7/32"),
		netip.MustParsePrefix("192.0.2.8/32"),
		netip.MustParsePrefix("2001:db8::5/128"),
		netip.MustParsePrefix("2001:db8::9/128"), // on a dummy: itself only, not the VIP beside it
		netip.MustParsePrefix("fd00:10::/64"),
		netip.MustParsePrefix("fe80::1/128"),
	}
	if !slices.Equal(got, want) || len(left) != 0 {
		t.Errorf("node set\n got %v (left %v)\nwant %v", got, left, want)
	}
	// Named interfaces join; a trailing * is a prefix.
	src.Ifaces = []string{"cilium_host", "eni*"}
	got, _ = nodeSet(ifaces, src, 1024)
	for _, p := range []string{"10.0.1.1/32", "10.251.3.1/32"} {
		if !slices.Contains(got, netip.MustParsePrefix(p)) {
			t.Errorf("--node-address-interfaces=cilium_host,eni*: %s missing from %v", p, got)
		}
	}
	// The node IP is exempt even when no interface here holds it.
	if got, _ := nodeSet(nil, Sources{NodeIP: a("192.0.2.20")}, 1024); !slices.Equal(got, []netip.Prefix{netip.MustParsePrefix("192.0.2.20/32")}) {
		t.Errorf("node set without interfaces: %v, want the node IP", got)
	}
	// Beyond capacity the node's own IPs are kept first, then --node-cidrs.
	var many []netip.Addr
	for i := range 10 {
		many = append(many, netip.AddrFrom4([4]byte{10, 0, 0, byte(200 + i)}))
	}
	ifaces[1].Addrs = append(ifaces[1].Addrs, many...)
	got, left = nodeSet(ifaces, Sources{NodeIP: a("10.0.0.5"), Status: []netip.Addr{a("192.0.2.7")}, Extra: []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")}}, 4)
	if n4 := len(slices.DeleteFunc(slices.Clone(got), func(p netip.Prefix) bool { return !p.Addr().Is4() })); n4 != 4 {
		t.Errorf("capacity 4: %d IPv4 prefixes kept (%v)", n4, got)
	}
	for _, p := range []string{"10.0.0.5/32", "192.0.2.7/32", "10.9.0.0/16"} {
		if !slices.Contains(got, netip.MustParsePrefix(p)) {
			t.Errorf("capacity 4: %s, the node's own or configured, was left out: %v", p, got)
		}
	}
	if len(left) != 11 { // 10.0.0.50 (kept), the ten, 192.0.2.8
		t.Errorf("capacity 4: left %d (%v), want 11", len(left), left)
	}
}

// TestListIfaces reads this namespace's interfaces with netlink, as the agent does.
func TestListIfaces(t *testing.T) {
	ifaces, err := ListIfaces()
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(ifaces, func(i Iface) bool { return i.Loopback })
	if i < 0 || !slices.Contains(ifaces[i].Addrs, netip.MustParseAddr("127.0.0.1")) {
		t.Errorf("interfaces %v lack the loopback with the address every namespace's lo has", ifaces)
	}
}

// TestWatchAddrs: adding an address in the namespace is signalled (as root: it
// adds one to a dummy interface of its own), and the channel closes once done is.
func TestWatchAddrs(t *testing.T) {
	if !skip.Root() {
		t.Skip("needs root (CAP_NET_ADMIN) to add an address")
	}
	done := make(chan struct{})
	changed, err := WatchAddrs(done)
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("npw%d", os.Getpid()%100000)
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
		t.Fatal(err)
	}
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = netlink.LinkDel(l) }()
	addr, _ := netlink.ParseAddr("192.0.2.201/32")
	if err := netlink.AddrAdd(l, addr); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	case <-time.After(5 * time.Second):
		t.Fatal("no change signalled for an added address")
	}
	close(done)
	timeout := time.After(5 * time.Second)
	for {
		select {
		case _, ok := <-changed:
			if !ok {
				return
			}
		case <-timeout:
			t.Fatal("the change channel stayed open after done")
		}
	}
}

// TestNodeAddrsRefresh: the set is written at start and again when a change is
// signalled; the dataplane's verdicts follow; a failed refresh keeps the set; stop
// and a failed start end the watch.
func TestNodeAddrsRefresh(t *testing.T) {
	dp := bpfmaps.NewMemory()
	isolated := bpfmaps.DirectionPolicy{Isolated: true}
	if _, err := dp.Commit(7, bpfmaps.PodPolicy{Ingress: isolated, Egress: isolated}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	host, listErr := []netip.Addr{netip.MustParseAddr("10.0.0.5")}, error(nil)
	list := func() ([]Iface, error) {
		mu.Lock()
		defer mu.Unlock()
		return []Iface{{Name: "eth0", Kind: "device", Addrs: slices.Clone(host)}}, listErr
	}
	allowed := func(a string) bool {
		return dp.Verdict(7, bpfmaps.Ingress, netip.MustParseAddr(a), bpfmaps.ProtocolTCP, 8080) &&
			dp.Verdict(7, bpfmaps.Egress, netip.MustParseAddr(a), bpfmaps.ProtocolUDP, 53)
	}
	n := New(Config{Dataplane: dp, Sources: Sources{NodeIP: netip.MustParseAddr("10.0.0.5"), Extra: []netip.Prefix{netip.MustParsePrefix("169.254.20.0/24")}},
		Max: bpfmaps.MaxNodePrefixes, List: list, Log: slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil))})
	notify := make(chan struct{}, 1) // the address changes netlink would signal
	n.watch = func(done <-chan struct{}) (<-chan struct{}, error) {
		ch := make(chan struct{})
		go func() {
			defer close(ch)
			for {
				select {
				case <-done:
					return
				case <-notify:
					ch <- struct{}{}
				}
			}
		}()
		return ch, nil
	}
	stop, err := n.Start(context.Background(), time.Hour) // changes are noticed by the watch, not the interval
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if !allowed("10.0.0.5") || !allowed("169.254.20.10") || allowed("10.0.0.6") {
		t.Fatal("after start: the node IP and the extra CIDR must pass, another peer not")
	}
	mu.Lock()
	host = append(host, netip.MustParseAddr("10.0.0.6"))
	mu.Unlock()
	notify <- struct{}{}
	deadline := time.Now().Add(5 * time.Second)
	for !allowed("10.0.0.6") {
		if time.Now().After(deadline) {
			t.Fatal("a new node address was not picked up by the refresh")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The Node object's addresses join at once.
	n.SetStatus([]netip.Addr{netip.MustParseAddr("10.0.0.7")}, "")
	for !allowed("10.0.0.7") {
		if time.Now().After(deadline) {
			t.Fatal("the Node's address was not picked up")
		}
		time.Sleep(5 * time.Millisecond)
	}
	mu.Lock()
	listErr = errors.New("netlink unavailable")
	mu.Unlock()
	notify <- struct{}{}
	time.Sleep(50 * time.Millisecond)
	if !allowed("10.0.0.6") || !allowed("10.0.0.5") {
		t.Fatal("a failed refresh dropped the node set")
	}
	stop()
	// A first read that fails is an error: the agent does not start without the set.
	n2 := New(Config{Dataplane: dp, Max: bpfmaps.MaxNodePrefixes, List: list, Watch: n.watch, Log: n.log})
	if _, err := n2.Start(context.Background(), time.Second); err == nil {
		t.Fatal("Start with a failing first read: no error")
	}
}

// TestNodeSetFromANamespace reads a node's interfaces with netlink in a network
// namespace of its own, as the agent does on the host, both families: the uplink
// holding the node IP gives all its addresses; a node-local DNS cache's dummy,
// kube-ipvs0 holding Service VIPs and an interface toward another network give
// none. Then 1100 addresses on the uplink: the set is cut to what the dataplane
// holds, the node IP kept, and the agent goes on, not ready, saying why.
func TestNodeSetFromANamespace(t *testing.T) {
	if !skip.Root() {
		skip.Unmet(t, "needs root: builds a network namespace with interfaces")
	}
	netlab.RequireIP(t, "build the node's interfaces")
	ns := fmt.Sprintf("npna-%d", os.Getpid()%100000)
	netlab.AddNamespace(t, ns)
	ip := func(args ...string) { netlab.Run(t, append([]string{"ip", "-n", ns}, args...)...) }
	ip("link", "add", "up0", "type", "veth", "peer", "name", "up1")
	ip("link", "add", "oth0", "type", "veth", "peer", "name", "oth1")
	for _, dev := range []string{"nodelocaldns", "kube-ipvs0"} {
		// As on a node, a dummy device; a veth where the kernel has no dummy driver
		// (neither holds a node address, so either is left out).
		if exec.Command("ip", "-n", ns, "link", "add", dev, "type", "dummy").Run() != nil {
			ip("link", "add", dev, "type", "veth", "peer", "name", dev+"p")
		}
	}
	for dev, addrs := range map[string][]string{
		"up0":          {"10.214.0.2/24", "10.214.0.3/24", "2001:db8:214::2/64"},
		"oth0":         {"10.215.0.1/24", "2001:db8:215::1/64"},
		"nodelocaldns": {"169.254.20.10/32", "fd00:20::a/128"},
		"kube-ipvs0":   {"10.96.0.10/32", "10.96.0.1/32", "fd00:96::a/128"},
	} {
		for _, a := range addrs {
			ip("addr", "add", a, "dev", dev, "nodad")
		}
		ip("link", "set", dev, "up")
	}
	list := func() ([]Iface, error) { return netlab.In(ns, ListIfaces) }
	ifaces, err := list()
	if err != nil {
		t.Fatal(err)
	}
	src := Sources{NodeIP: netip.MustParseAddr("10.214.0.2"), Status: []netip.Addr{netip.MustParseAddr("10.214.0.2")}}
	set, left := nodeSet(ifaces, src, bpfmaps.MaxNodePrefixes)
	for _, want := range []string{"10.214.0.2/32", "10.214.0.3/32", "2001:db8:214::2/128"} {
		if !slices.Contains(set, netip.MustParsePrefix(want)) {
			t.Errorf("node set %v lacks %s, an address of the node IP's interface", set, want)
		}
	}
	for _, not := range []string{"10.215.0.1/32", "2001:db8:215::1/128", "169.254.20.10/32", "fd00:20::a/128", "10.96.0.10/32", "10.96.0.1/32", "fd00:96::a/128"} {
		if slices.Contains(set, netip.MustParsePrefix(not)) {
			t.Errorf("node set %v holds %s, which is not the node's own", set, not)
		}
	}
	if len(left) != 0 {
		t.Errorf("left out %v", left)
	}

	// 1100 more addresses on the uplink: more than the dataplane holds.
	var batch strings.Builder
	for i := range 1100 {
		fmt.Fprintf(&batch, "addr add 10.216.%d.%d/32 dev up0\n", i/250, 1+i%250)
	}
	cmd := exec.Command("ip", "-n", ns, "-batch", "-")
	cmd.Stdin = strings.NewReader(batch.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("ip -batch: %v\n%s", err, out)
	}
	dp := bpfmaps.NewMemory()
	var logs bytes.Buffer
	n := New(Config{Dataplane: dp, Sources: src, Max: bpfmaps.MaxNodePrefixes, List: list, Log: slog.New(slog.NewTextHandler(&logs, nil))})
	stop, err := n.Start(context.Background(), time.Hour)
	if err != nil {
		t.Fatalf("start with 1100 node addresses: %v; want the agent to go on with what fits", err)
	}
	defer stop()
	isolated := bpfmaps.DirectionPolicy{Isolated: true}
	if _, err := dp.Commit(7, bpfmaps.PodPolicy{Ingress: isolated, Egress: isolated}); err != nil {
		t.Fatal(err)
	}
	if !dp.Verdict(7, bpfmaps.Egress, netip.MustParseAddr("10.214.0.2"), bpfmaps.ProtocolTCP, 443) {
		t.Error("the node IP is not exempt once the set is cut")
	}
	if _, err := n.Health(); err == nil || !strings.Contains(err.Error(), "do not fit") {
		t.Errorf("health with 1100 addresses = %v, want an error saying they do not fit", err)
	}
	if got := n.LeftOut(); got != 1102-bpfmaps.MaxNodePrefixes+0 {
		t.Errorf("left out %d, want %d", got, 1102-bpfmaps.MaxNodePrefixes)
	}
	if !strings.Contains(logs.String(), "more addresses than the dataplane") {
		t.Errorf("the cut is not logged:\n%s", logs.String())
	}
}
