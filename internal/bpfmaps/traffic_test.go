package bpfmaps

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/npagent/npagent/internal/testenv/netlab"
)

// trafficLab is three network namespaces made for one test: "node" holds the pod's
// host-side interface (where the programs attach) and routes between "pod" and
// "peer". Addresses are 10.201/16 and fd00:201::/32, all inside these namespaces.
type trafficLab struct {
	node, pod, peer string
	hostIfindex     int
}

const (
	labPod4  = "10.201.1.2"
	labPeer4 = "10.201.2.2"
	labPod6  = "fd00:201:1::2"
	labPeer6 = "fd00:201:2::2"
)

func newTrafficLab(t *testing.T) *trafficLab {
	t.Helper()
	requireKernel(t)
	netlab.RequireIP(t, "build network namespaces")
	id := os.Getpid() % 100000
	l := &trafficLab{node: fmt.Sprintf("npt-node-%d", id), pod: fmt.Sprintf("npt-pod-%d", id), peer: fmt.Sprintf("npt-peer-%d", id)}
	for _, ns := range []string{l.node, l.pod, l.peer} {
		netlab.AddNamespace(t, ns)
	}
	for i, ns := range []string{l.pod, l.peer} {
		host := fmt.Sprintf("h%d", i+1)
		net4, net6 := fmt.Sprintf("10.201.%d", i+1), fmt.Sprintf("fd00:201:%d", i+1)
		netlab.Run(t, "ip", "-n", l.node, "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", ns)
		netlab.Run(t, "ip", "-n", l.node, "addr", "add", net4+".1/24", "dev", host)
		netlab.Run(t, "ip", "-n", l.node, "addr", "add", net6+"::1/64", "dev", host, "nodad")
		netlab.Run(t, "ip", "-n", l.node, "link", "set", host, "up")
		netlab.Run(t, "ip", "-n", ns, "addr", "add", net4+".2/24", "dev", "eth0")
		netlab.Run(t, "ip", "-n", ns, "addr", "add", net6+"::2/64", "dev", "eth0", "nodad")
		netlab.Run(t, "ip", "-n", ns, "link", "set", "eth0", "up")
		netlab.Run(t, "ip", "-n", ns, "route", "add", "default", "via", net4+".1")
		netlab.Run(t, "ip", "-n", ns, "-6", "route", "add", "default", "via", net6+"::1")
	}
	netlab.Run(t, "ip", "netns", "exec", l.node, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
	// IPv6 loses the first packets while link-local addresses are tentative.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		tentative := false
		for _, ns := range []string{l.node, l.pod, l.peer} {
			out, err := exec.Command("ip", "-n", ns, "-6", "addr", "show", "tentative").CombinedOutput()
			if err != nil || len(strings.TrimSpace(string(out))) > 0 {
				tentative = true
			}
		}
		if !tentative {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("IPv6 addresses still tentative after 5s")
		}
	}
	h, err := netns.GetFromName(l.node)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	link, err := nl.LinkByName("h1")
	if err != nil {
		t.Fatal(err)
	}
	l.hostIfindex = link.Attrs().Index
	return l
}

const trafficTimeout = 400 * time.Millisecond

// TestRealTraffic sends TCP and UDP, IPv4 and IPv6, between a pod and a peer through
// the node namespace where the programs are attached to the pod's host-side veth.
func TestRealTraffic(t *testing.T) {
	lab := newTrafficLab(t)
	for _, p := range []struct{ network, addr string }{
		{"tcp4", labPod4 + ":8080"}, {"tcp4", labPod4 + ":8081"}, {"tcp6", "[" + labPod6 + "]:8080"},
	} {
		netlab.ServeEcho(t, lab.pod, p.network, p.addr)
	}
	for _, p := range []struct{ network, addr string }{
		{"udp4", labPeer4 + ":5353"}, {"udp4", labPeer4 + ":5354"}, {"tcp4", labPeer4 + ":9000"}, {"udp6", "[" + labPeer6 + "]:5353"},
	} {
		netlab.ServeEcho(t, lab.peer, p.network, p.addr)
	}

	// Attaching resolves the ifindex in the caller's network namespace: commit from a
	// thread in the node namespace.
	lab.enterNode(t)

	e := openTestEBPF(t, EBPFOptions{})
	peerNet4, peerNet6 := netip.MustParsePrefix("10.201.2.0/24"), netip.MustParsePrefix("fd00:201:2::/64")
	tcp := func(port int32) []PortRule { return []PortRule{{Protocol: ProtocolTCP, Port: port}} }
	first := PodPolicy{
		Ingress: DirectionPolicy{Isolated: true, Allow: []Rule{{CIDR: peerNet4, Ports: tcp(8080)}, {CIDR: peerNet6, Ports: tcp(8080)}}},
		Egress: DirectionPolicy{Isolated: true, Allow: []Rule{
			{CIDR: peerNet4, Ports: []PortRule{{Protocol: ProtocolUDP, Port: 5353}}},
			{CIDR: peerNet6, Ports: []PortRule{{Protocol: ProtocolUDP, Port: 5353}}},
		}},
	}
	type flow struct {
		name, from, network, addr string
		want                      bool
	}
	pod4, pod6 := labPod4, "["+labPod6+"]"
	check := func(stage string, flows []flow) {
		t.Helper()
		for _, f := range flows {
			err := netlab.Exchange(f.from, f.network, f.addr, trafficTimeout)
			if (err == nil) != f.want {
				t.Errorf("%s: %s: exchange error %v, want allowed=%v", stage, f.name, err, f.want)
			}
		}
	}
	check("before any policy", []flow{
		{"peer → pod tcp 8081", lab.peer, "tcp4", pod4 + ":8081", true},
		{"peer → pod tcp6 8080", lab.peer, "tcp6", pod6 + ":8080", true},
		{"pod → peer tcp 9000", lab.pod, "tcp4", labPeer4 + ":9000", true},
	})
	if _, err := e.Commit(lab.hostIfindex, first); err != nil {
		t.Fatal(err)
	}
	check("first policy", []flow{
		{"peer → pod tcp 8080 (allowed in; replies pass the isolated egress)", lab.peer, "tcp4", pod4 + ":8080", true},
		{"peer → pod tcp6 8080", lab.peer, "tcp6", pod6 + ":8080", true},
		{"peer → pod tcp 8081 (not allowed in)", lab.peer, "tcp4", pod4 + ":8081", false},
		{"pod → peer udp 5353 (allowed out; replies pass the isolated ingress)", lab.pod, "udp4", labPeer4 + ":5353", true},
		{"pod → peer udp6 5353", lab.pod, "udp6", "[" + labPeer6 + "]:5353", true},
		{"pod → peer udp 5354 (not allowed out)", lab.pod, "udp4", labPeer4 + ":5354", false},
		{"pod → peer tcp 9000 (not allowed out)", lab.pod, "tcp4", labPeer4 + ":9000", false},
	})
	second := first
	second.Ingress = DirectionPolicy{Isolated: true, Allow: []Rule{{CIDR: peerNet4, Ports: tcp(8081)}}}
	if _, err := e.Commit(lab.hostIfindex, second); err != nil {
		t.Fatal(err)
	}
	check("second policy", []flow{
		{"peer → pod tcp 8080 (no longer allowed)", lab.peer, "tcp4", pod4 + ":8080", false},
		{"peer → pod tcp 8081 (now allowed)", lab.peer, "tcp4", pod4 + ":8081", true},
		{"peer → pod tcp6 8080 (no longer allowed)", lab.peer, "tcp6", pod6 + ":8080", false},
	})
	if _, err := e.Remove(lab.hostIfindex); err != nil {
		t.Fatal(err)
	}
	check("after Remove", []flow{
		{"peer → pod tcp 8080", lab.peer, "tcp4", pod4 + ":8080", true},
		{"pod → peer tcp 9000", lab.pod, "tcp4", labPeer4 + ":9000", true},
	})
}
