package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/npagent/npagent/internal/bpfmaps"
)

func TestNodeSet(t *testing.T) {
	host := []netip.Addr{
		netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1"), // loopback: left out
		netip.MustParseAddr("10.0.0.5"),
		netip.MustParseAddr("10.251.3.1"),       // a host-side veth address
		netip.MustParseAddr("fe80::1%eth0"),     // link-local, zone dropped
		netip.MustParseAddr("::ffff:192.0.2.7"), // mapped: IPv4
		netip.MustParseAddr("2001:db8::5"),
	}
	got := nodeSet(host, netip.MustParseAddr("10.0.0.5"), []netip.Prefix{netip.MustParsePrefix("169.254.20.10/32"), netip.MustParsePrefix("fd00:10::7/64")})
	want := []netip.Prefix{
		netip.MustParsePrefix("10.0.0.5/32"),
		netip.MustParsePrefix("10.251.3.1/32"),
		netip.MustParsePrefix("169.254.20.10/32"),
		netip.MustParsePrefix("192.0.2.7/32"),
		netip.MustParsePrefix("2001:db8::5/128"),
		netip.MustParsePrefix("fd00:10::/64"),
		netip.MustParsePrefix("fe80::1/128"),
	}
	if !slices.Equal(got, want) {
		t.Errorf("node set\n got %v\nwant %v", got, want)
	}
	// The node IP is exempt even when no interface here holds it.
	if got := nodeSet(nil, netip.MustParseAddr("192.0.2.20"), nil); !slices.Equal(got, []netip.Prefix{netip.MustParsePrefix("192.0.2.20/32")}) {
		t.Errorf("node set without interfaces: %v, want the node IP", got)
	}
}

// TestListHostAddrs reads this namespace's addresses with netlink, as the agent does.
func TestListHostAddrs(t *testing.T) {
	addrs, err := listHostAddrs()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(addrs, netip.MustParseAddr("127.0.0.1")) {
		t.Errorf("addresses %v lack the loopback address every namespace's lo has", addrs)
	}
}

// TestWatchHostAddrs: adding an address in the namespace is signalled (as root: it
// adds one to a dummy interface of its own), and the channel closes once done is.
func TestWatchHostAddrs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (CAP_NET_ADMIN) to add an address")
	}
	done := make(chan struct{})
	changed, err := watchHostAddrs(done)
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
	list := func() ([]netip.Addr, error) {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(host), listErr
	}
	allowed := func(a string) bool {
		return dp.Verdict(7, bpfmaps.Ingress, netip.MustParseAddr(a), bpfmaps.ProtocolTCP, 8080) &&
			dp.Verdict(7, bpfmaps.Egress, netip.MustParseAddr(a), bpfmaps.ProtocolUDP, 53)
	}
	n := &nodeAddrs{dp: dp, nodeIP: netip.MustParseAddr("10.0.0.5"), extra: []netip.Prefix{netip.MustParsePrefix("169.254.20.0/24")},
		list: list, log: slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil))}
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
	stop, err := startNodeAddrs(context.Background(), n, time.Hour) // changes are noticed by the watch, not the interval
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
	n2 := &nodeAddrs{dp: dp, list: list, watch: n.watch, log: n.log}
	if _, err := startNodeAddrs(context.Background(), n2, time.Second); err == nil {
		t.Fatal("startNodeAddrs with a failing first read: no error")
	}
}
