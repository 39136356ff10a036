package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/npagent/npagent/internal/bpfmaps"
)

// nodeAddrsRefresh is how often the node's addresses are read again besides on
// netlink's change notifications.
const nodeAddrsRefresh = 30 * time.Second

// listHostAddrs lists every address of every interface in the agent's network
// namespace, the host's (the agent runs with hostNetwork).
func listHostAddrs() ([]netip.Addr, error) {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("list the node's addresses (netlink): %w", err)
	}
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if a.IPNet == nil {
			continue
		}
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}

// watchHostAddrs signals (coalesced) every address added or removed in the agent's
// network namespace, until done is closed; the channel is closed when the
// subscription ends.
func watchHostAddrs(done <-chan struct{}) (<-chan struct{}, error) {
	updates := make(chan netlink.AddrUpdate, 64)
	if err := netlink.AddrSubscribeWithOptions(updates, done, netlink.AddrSubscribeOptions{}); err != nil {
		return nil, fmt.Errorf("subscribe to the node's address changes (netlink): %w", err)
	}
	changed := make(chan struct{}, 1)
	go func() {
		defer close(changed)
		for range updates { // closed by netlink once done is closed or the socket fails
			select {
			case changed <- struct{}{}:
			default: // a refresh is pending already
			}
		}
	}()
	return changed, nil
}

// nodeSet is the node set the dataplane exempts: every address of the host's
// interfaces (the node IP, other interfaces' addresses, the host-side veth
// addresses, link-local ones included: pods reach the node, and the kubelet reaches
// pods, from any of them) except loopback ones, which never cross a pod's interface;
// the node IP always, even if no interface holds it here; and the extra CIDRs
// (--node-cidrs). Sorted and without duplicates.
func nodeSet(host []netip.Addr, nodeIP netip.Addr, extra []netip.Prefix) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(host)+1+len(extra))
	for _, a := range append(slices.Clone(host), nodeIP) {
		a = a.Unmap().WithZone("")
		if !a.IsValid() || a.IsLoopback() || a.IsUnspecified() || a.IsMulticast() {
			continue
		}
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	for _, p := range extra {
		out = append(out, p.Masked())
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return slices.Compact(out)
}

// nodeAddrs keeps the dataplane's node set current: set once before any pod is
// programmed (so a pod isolated at its first commit is reachable from its node at
// once), then read again on every address change and every nodeAddrsRefresh (in case
// a change notification was lost), and written when it changed.
type nodeAddrs struct {
	dp     bpfmaps.NodeExemption
	nodeIP netip.Addr
	extra  []netip.Prefix
	list   func() ([]netip.Addr, error)
	watch  func(done <-chan struct{}) (<-chan struct{}, error) // nil: polling only
	log    *slog.Logger
	cur    []netip.Prefix
}

// refresh reads the node's addresses and writes the node set if it changed.
func (n *nodeAddrs) refresh() error {
	host, err := n.list()
	if err != nil {
		return err
	}
	set := nodeSet(host, n.nodeIP, n.extra)
	if n.cur != nil && slices.Equal(set, n.cur) {
		return nil
	}
	if err := n.dp.SetNodeAddrs(set); err != nil {
		return fmt.Errorf("set the node's addresses in the dataplane: %w", err)
	}
	n.log.Info("node addresses exempt from policy", "prefixes", set)
	n.cur = set
	return nil
}

// startNodeAddrs sets the node set, then refreshes it on every address change and
// every interval until the returned stop is called (stop waits for the goroutines).
// A failed first set is an error: without it node traffic to isolated pods would be
// dropped. A failed refresh keeps the set in force and is logged; without change
// notifications the interval alone refreshes.
func startNodeAddrs(ctx context.Context, n *nodeAddrs, interval time.Duration) (stop func(), err error) {
	ctx, cancel := context.WithCancel(ctx)
	var changed <-chan struct{}
	if n.watch != nil { // subscribed before the first read: no change is missed
		if changed, err = n.watch(ctx.Done()); err != nil {
			n.log.Warn("no notification of address changes; refreshing every interval only", "interval", interval, "err", err)
		}
	}
	if err := n.refresh(); err != nil {
		cancel()
		drain(changed)
		return nil, err
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		defer func() { drain(changed) }() // changed, as it is when the loop ends
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			case _, ok := <-changed:
				if !ok {
					if ctx.Err() != nil {
						return
					}
					n.log.Warn("notification of address changes ended; refreshing every interval only", "interval", interval)
					changed = nil
					continue
				}
			}
			if err := n.refresh(); err != nil {
				n.log.Warn("refresh node addresses; the previous set stays in force", "err", err)
			}
		}
	})
	return func() { cancel(); wg.Wait() }, nil
}

// drain waits for a change channel to be closed (the subscription ended); nil: none.
func drain(ch <-chan struct{}) {
	if ch == nil {
		return
	}
	for range ch {
	}
}
