package nodeaddrs

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
)

// Iface is one interface of the agent's network namespace (the host's: the agent
// runs with hostNetwork) and its addresses.
type Iface struct {
	Name     string
	Kind     string // netlink's link type: "device", "veth", "dummy", "bridge", ...
	Loopback bool
	Addrs    []netip.Addr
}

// ListIfaces lists the interfaces of the agent's network namespace with their
// addresses.
func ListIfaces() ([]Iface, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list the node's interfaces (netlink): %w", err)
	}
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("list the node's addresses (netlink): %w", err)
	}
	byIndex := make(map[int][]netip.Addr, len(links))
	for _, a := range addrs {
		if a.IPNet == nil {
			continue
		}
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			byIndex[a.LinkIndex] = append(byIndex[a.LinkIndex], ip.Unmap())
		}
	}
	out := make([]Iface, 0, len(links))
	for _, l := range links {
		attrs := l.Attrs()
		out = append(out, Iface{Name: attrs.Name, Kind: l.Type(), Loopback: attrs.Flags&net.FlagLoopback != 0,
			Addrs: byIndex[attrs.Index]})
	}
	return out, nil
}

// WatchAddrs signals (coalesced) every address added or removed in the agent's
// network namespace, until done is closed; the channel is closed when the
// subscription ends.
func WatchAddrs(done <-chan struct{}) (<-chan struct{}, error) {
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

// servicesIface is the dummy interface kube-proxy's IPVS mode puts every Service
// VIP on.
const servicesIface = "kube-ipvs0"

// carriesOnlyItsOwn reports whether an interface that holds a node address
// contributes only that address, not its others: loopback, dummy devices (a
// node-local DNS cache's VIP, kube-ipvs0's Service VIPs, a BGP speaker's anycast
// addresses) and kube-ipvs0 whatever its type. Their other addresses are Services
// and VIPs in front of pods and hosts elsewhere, not the node.
func carriesOnlyItsOwn(i Iface) bool {
	return i.Loopback || i.Kind == "dummy" || i.Name == servicesIface
}

// Sources is what the node set is made of besides the interfaces.
type Sources struct {
	NodeIP netip.Addr     // --node-ip
	Status []netip.Addr   // the Node object's status.addresses (InternalIP, ExternalIP); Keeper.SetStatus's
	Extra  []netip.Prefix // --node-cidrs
	Ifaces []string       // --node-address-interfaces: names; "name*" is a prefix
}

// matchIface reports whether name is one of patterns (a trailing * matches any
// rest).
func matchIface(patterns []string, name string) bool {
	for _, p := range patterns {
		if prefix, ok := strings.CutSuffix(p, "*"); ok && strings.HasPrefix(name, prefix) || p == name {
			return true
		}
	}
	return false
}

// nodeSet is the node set the dataplane exempts, the node's own addresses:
//
//  1. the node IP and the Node object's addresses;
//  2. the CIDRs of --node-cidrs;
//  3. every address of an interface that holds one of (1), except the interfaces
//     carriesOnlyItsOwn names (the node's uplink: its secondary and link-local
//     addresses are the node's too);
//  4. every address of the interfaces --node-address-interfaces names.
//
// Nothing else: not a pod's host-side veth (unless named), not kube-ipvs0's Service
// VIPs, not a dummy's DNS VIP, not an interface toward another network. Loopback,
// unspecified and multicast addresses are left out (they never cross a pod's
// interface). At most max prefixes of each family are kept, in the order above
// (within a tier, in address order): what does not fit is returned as left, so a
// node with too many addresses still exempts its own IP. set is sorted and without
// duplicates.
func nodeSet(ifaces []Iface, src Sources, max int) (set, left []netip.Prefix) {
	own := append([]netip.Addr{src.NodeIP}, src.Status...)
	var tiers [4][]netip.Prefix
	host := func(a netip.Addr) (netip.Prefix, bool) {
		a = a.Unmap().WithZone("")
		if !a.IsValid() || a.IsLoopback() || a.IsUnspecified() || a.IsMulticast() {
			return netip.Prefix{}, false
		}
		return netip.PrefixFrom(a, a.BitLen()), true
	}
	for _, a := range own {
		if p, ok := host(a); ok {
			tiers[0] = append(tiers[0], p)
		}
	}
	for _, p := range src.Extra {
		tiers[1] = append(tiers[1], p.Masked())
	}
	for _, i := range ifaces {
		tier := -1
		switch {
		case matchIface(src.Ifaces, i.Name):
			tier = 3
		case carriesOnlyItsOwn(i):
		case slices.ContainsFunc(i.Addrs, func(a netip.Addr) bool {
			return slices.ContainsFunc(own, func(o netip.Addr) bool { return o.IsValid() && o.Unmap() == a.Unmap().WithZone("") })
		}):
			tier = 2
		}
		if tier < 0 {
			continue
		}
		for _, a := range i.Addrs {
			if p, ok := host(a); ok {
				tiers[tier] = append(tiers[tier], p)
			}
		}
	}
	seen := map[netip.Prefix]bool{}
	n4, n6 := 0, 0
	for _, tier := range tiers {
		sortPrefixes(tier)
		for _, p := range tier {
			if seen[p] {
				continue
			}
			seen[p] = true
			n := &n6
			if p.Addr().Is4() {
				n = &n4
			}
			if *n >= max {
				left = append(left, p)
				continue
			}
			*n++
			set = append(set, p)
		}
	}
	sortPrefixes(set)
	return set, left
}

func sortPrefixes(ps []netip.Prefix) {
	slices.SortFunc(ps, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
}

// Exempter holds the node set: bpfmaps.NodeExemption (this package does not import
// the dataplane).
type Exempter interface {
	SetNodeAddrs(prefixes []netip.Prefix) error
}

// Config is a Keeper's: where the set goes and where its parts come from.
type Config struct {
	Dataplane Exempter
	Sources   Sources // Status is SetStatus's
	// Max is how many prefixes of each family the dataplane holds
	// (bpfmaps.MaxNodePrefixes); what does not fit is left out and reported.
	Max   int
	List  func() ([]Iface, error)                             // ListIfaces, or a test's
	Watch func(done <-chan struct{}) (<-chan struct{}, error) // WatchAddrs; nil: polling only
	Log   *slog.Logger
	// StatusNote is Health's note until SetStatus is first called: why the Node
	// object's addresses are not in the set yet.
	StatusNote string
}

// Keeper keeps the dataplane's node set current: set once before any pod is
// programmed (so a pod isolated at its first commit is reachable from its node at
// once), then computed again on every address change, every change of the Node
// object's addresses (SetStatus) and every refresh interval (in case a change
// notification was lost), and written when it changed.
type Keeper struct {
	dp    Exempter
	src   Sources // Status is SetStatus's
	max   int
	list  func() ([]Iface, error)
	watch func(done <-chan struct{}) (<-chan struct{}, error) // nil: polling only
	log   *slog.Logger
	cur   []netip.Prefix // the loop's own: the set in force

	statusChanged chan struct{} // poked by SetStatus; made by Start

	mu         sync.Mutex
	status     []netip.Addr
	statusRead bool   // the Node object was read at least once
	statusNote string // why the Node's addresses are not in the set; "" when they are
	left       int    // prefixes of the last computed set that did not fit
	leftErr    error  // why, for /readyz
}

// New returns a Keeper of cfg; Start sets the node set and keeps it.
func New(cfg Config) *Keeper {
	return &Keeper{dp: cfg.Dataplane, src: cfg.Sources, max: cfg.Max, list: cfg.List, watch: cfg.Watch, log: cfg.Log,
		statusNote: cfg.StatusNote}
}

// SetStatus records the Node object's addresses (or why there are none: note) and
// asks for a refresh. O(1) for an informer's handler: the set is computed by the
// loop.
func (n *Keeper) SetStatus(addrs []netip.Addr, note string) {
	n.mu.Lock()
	n.status, n.statusRead, n.statusNote = addrs, note == "", note
	n.mu.Unlock()
	select {
	case n.statusChanged <- struct{}{}:
	default: // a refresh is pending already
	}
}

// Health is what the node set means for /readyz: an error while some of the node's
// addresses do not fit the dataplane (traffic between pods and them is policed),
// a note while the Node object's addresses are not known.
func (n *Keeper) Health() (note string, err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.statusNote, n.leftErr
}

// LeftOut is how many of the node's addresses the dataplane's node set could not
// hold at the last refresh (a metric).
func (n *Keeper) LeftOut() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.left
}

// refresh reads the node's addresses and writes the node set if it changed. A set
// too large for the dataplane is cut (nodeSet's order: the node's own IPs first),
// logged and reported by health, never an error: the agent keeps running with the
// node's own addresses exempt.
func (n *Keeper) refresh() error {
	ifaces, err := n.list()
	if err != nil {
		return err
	}
	src := n.src
	n.mu.Lock()
	src.Status = n.status
	n.mu.Unlock()
	max := n.max
	set, left := nodeSet(ifaces, src, max)
	var leftErr error
	if len(left) > 0 {
		leftErr = fmt.Errorf("node addresses: %d do not fit the dataplane's node set (%d per family) and are not exempt from policy, e.g. %v (--node-cidrs can cover them with fewer prefixes)",
			len(left), max, left[0])
	}
	n.mu.Lock()
	wasLeft := n.left
	n.left, n.leftErr = len(left), leftErr
	n.mu.Unlock()
	if len(left) > 0 && len(left) != wasLeft {
		n.log.Error("the node has more addresses than the dataplane's node set holds; the node IP and the Node object's addresses are kept, the rest is policed like any peer",
			"capacity_per_family", max, "left_out", len(left), "first_left_out", left[0])
	}
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

// Start sets the node set, then refreshes it on every address change and
// every interval until the returned stop is called (stop waits for the goroutines).
// A failed first set is an error: without it node traffic to isolated pods would be
// dropped. A failed refresh keeps the set in force and is logged; without change
// notifications the interval alone refreshes.
func (n *Keeper) Start(ctx context.Context, interval time.Duration) (stop func(), err error) {
	if n.statusChanged == nil {
		n.statusChanged = make(chan struct{}, 1)
	}
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
			case <-n.statusChanged:
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
