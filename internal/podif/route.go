package podif

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Resolver maps a local pod IP to its host-side interface index.
type Resolver interface {
	// Resolve returns the ifindex of the pod's host-side interface, or an error wrapping
	// ErrInterfaceNotFound when it is not there (yet).
	Resolve(podIP netip.Addr) (ifindex int, err error)
}

// ErrInterfaceNotFound is wrapped when a pod's host-side interface cannot be found. The
// reconcile loop retries such a pod with backoff: the pod may be listed before its CNI has set up
// the interface.
var ErrInterfaceNotFound = errors.New("pod interface not found")

// ErrNotPodInterface is wrapped, together with ErrInterfaceNotFound, when the host
// route to a pod IP names an interface that cannot be a pod's (see NewRouteResolver):
// the pod is retried like one whose interface is not there yet, and nothing is
// attached to the node's own interfaces whatever an object claims.
var ErrNotPodInterface = errors.New("not a pod interface")

// Option configures NewRouteResolver.
type Option func(*routeResolver)

// WithNodeIPs names the node's own addresses (its Kubernetes node IPs): an interface
// holding one of them is the node's, never a pod's.
func WithNodeIPs(ips ...netip.Addr) Option {
	return func(r *routeResolver) {
		for _, ip := range ips {
			if ip.IsValid() {
				r.nodeIPs = append(r.nodeIPs, ip.Unmap())
			}
		}
	}
}

// WithInterfacePrefixes accepts only interfaces whose name starts with one of the
// prefixes: the host-side names the node's CNI gives pod interfaces ("eni" and
// "vlan" for the AWS VPC CNI, "cali" for Calico, "lxc" for Cilium, "veth" for the
// ptp plugin). None (the default): any name, the structural checks still apply.
func WithInterfacePrefixes(prefixes ...string) Option {
	return func(r *routeResolver) {
		for _, p := range prefixes {
			if p = strings.TrimSpace(p); p != "" {
				r.prefixes = append(r.prefixes, p)
			}
		}
	}
}

// WithNetlinkHandle looks up routes and links through h, a handle on another network
// namespace; the default is the agent's own (the host's: it runs with hostNetwork).
func WithNetlinkHandle(h *netlink.Handle) Option {
	return func(r *routeResolver) { r.nl = h }
}

// NewRouteResolver resolves by route lookup: the host route (/32 or /128) to the pod IP
// that most CNIs (AWS VPC CNI, Calico, the bridge-less ptp plugin) install in the main
// table, pointing at the pod's veth. Only an exact host route without gateway counts:
// a longest-prefix lookup would answer with the node's uplink for a pod whose route is
// not there yet, and policy for the pod would land on the node's own interface.
//
// The interface the route names must also be plausibly a pod's, because the pod IPs
// come from objects and a host route may exist for other reasons (an address routed to
// the uplink, a service IP on a dummy device): it is rejected, with ErrNotPodInterface,
// when it is loopback, carries a default route of either family (the uplink), holds a
// node IP (WithNodeIPs), or, with WithInterfacePrefixes, has a name outside them.
func NewRouteResolver(opts ...Option) Resolver {
	r := &routeResolver{nl: &netlink.Handle{}, now: time.Now}
	for _, o := range opts {
		o(r)
	}
	return r
}

type routeResolver struct {
	nl       *netlink.Handle // the zero Handle works on the calling thread's namespace
	nodeIPs  []netip.Addr
	prefixes []string
	now      func() time.Time

	mu        sync.Mutex
	plausible map[int]time.Time // ifindex → when notPodInterface last passed it
}

func (r *routeResolver) Resolve(podIP netip.Addr) (int, error) {
	podIP = podIP.Unmap()
	family, bits := netlink.FAMILY_V4, 32
	if podIP.Is6() {
		family, bits = netlink.FAMILY_V6, 128
	}
	filter := &netlink.Route{Dst: &net.IPNet{IP: podIP.AsSlice(), Mask: net.CIDRMask(bits, bits)}, Table: unix.RT_TABLE_MAIN}
	ifindex := 0
	err := r.nl.RouteListFilteredIter(family, filter, netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE, func(rt netlink.Route) bool {
		if rt.LinkIndex > 0 && rt.Gw == nil && len(rt.MultiPath) == 0 {
			ifindex = rt.LinkIndex
			return false
		}
		return true
	})
	if err != nil {
		return 0, fmt.Errorf("resolve pod %s: route lookup: %w", podIP, err)
	}
	if ifindex == 0 {
		return 0, fmt.Errorf("resolve pod %s: no host route to a local interface: %w", podIP, ErrInterfaceNotFound)
	}
	if r.recentlyPlausible(ifindex) {
		return ifindex, nil
	}
	if why, err := r.notPodInterface(ifindex); err != nil {
		return 0, fmt.Errorf("resolve pod %s: interface %d: %w", podIP, ifindex, err)
	} else if why != "" {
		return 0, fmt.Errorf("resolve pod %s: the host route names interface %d, %s: %w (%w)", podIP, ifindex, why, ErrNotPodInterface, ErrInterfaceNotFound)
	}
	r.markPlausible(ifindex)
	return ifindex, nil
}

// AddrLister is implemented by resolvers that can list the pods' own addresses from
// their interfaces (NewRouteResolver's does).
type AddrLister interface {
	// HostAddrsByInterface returns, per interface, the addresses whose host route (/32
	// or /128, main table, no gateway, not the kernel's own) names it, both families,
	// ascending: every address of a dual-stack pod, where the pod IPs an object names
	// may be only one of them. One route dump serves every interface and both
	// families, so a commit of many pods (and of a dual-stack pod's two IPs) lists
	// once, not once per pod IP.
	HostAddrsByInterface() (map[int][]netip.Addr, error)
}

// HostAddrsByInterface implements AddrLister by the same host routes Resolve
// follows, so an address that resolves to an interface is one of its addresses.
func (r *routeResolver) HostAddrsByInterface() (map[int][]netip.Addr, error) {
	addrs := map[int][]netip.Addr{}
	filter := &netlink.Route{Table: unix.RT_TABLE_MAIN}
	err := r.nl.RouteListFilteredIter(netlink.FAMILY_ALL, filter, netlink.RT_FILTER_TABLE, func(rt netlink.Route) bool {
		// The kernel's own routes (proto kernel) are the host's addresses on the
		// interface, not the pod's: an IPv6 address added as /128 gets one in the
		// main table, and counting it as the pod's would make the host's own traffic
		// from it look like the pod's hairpin.
		if dst := routeDst(rt); rt.LinkIndex > 0 && rt.Gw == nil && len(rt.MultiPath) == 0 && dst.IsSingleIP() &&
			rt.Protocol != unix.RTPROT_KERNEL {
			addrs[rt.LinkIndex] = append(addrs[rt.LinkIndex], dst.Addr())
		}
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("list host routes: %w", err)
	}
	for i, a := range addrs {
		slices.SortFunc(a, netip.Addr.Compare)
		addrs[i] = slices.Compact(a)
	}
	return addrs, nil
}

// plausibleFor is how long an interface found plausible stays so without another
// check. Resolve runs for every pod of every commit, inside the node-wide commit lock,
// and the check costs two route dumps and a link lookup (about 4× the route lookup
// itself); what it looks at (default routes, node IPs) changes with the node's
// configuration, not with pods, and an ifindex is not reused soon.
const plausibleFor = 30 * time.Second

// maxPlausible bounds the cache: pods come and go, their ifindexes are not reused.
const maxPlausible = 4096

func (r *routeResolver) recentlyPlausible(ifindex int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	at, ok := r.plausible[ifindex]
	return ok && r.now().Sub(at) < plausibleFor
}

func (r *routeResolver) markPlausible(ifindex int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.plausible == nil || len(r.plausible) >= maxPlausible {
		r.plausible = map[int]time.Time{}
	}
	r.plausible[ifindex] = r.now()
}

// notPodInterface says why ifindex cannot be a pod's interface, or "" when it can be.
func (r *routeResolver) notPodInterface(ifindex int) (string, error) {
	// Default routes of both families in the main table: the interfaces they leave
	// by are the uplinks.
	uplink := false
	err := r.nl.RouteListFilteredIter(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE, func(rt netlink.Route) bool {
		if dst := routeDst(rt); dst.IsValid() && dst.Bits() == 0 {
			uplink = rt.LinkIndex == ifindex || slices.ContainsFunc(rt.MultiPath, func(nh *netlink.NexthopInfo) bool { return nh.LinkIndex == ifindex })
		}
		return !uplink
	})
	if err != nil {
		return "", fmt.Errorf("list default routes: %w", err)
	}
	if uplink {
		return "which carries a default route (the node's uplink)", nil
	}
	link, err := r.nl.LinkByIndex(ifindex)
	if err != nil {
		return "", err
	}
	attrs := link.Attrs()
	if attrs.Flags&net.FlagLoopback != 0 {
		return fmt.Sprintf("%q, the loopback device", attrs.Name), nil
	}
	if len(r.prefixes) > 0 && !slices.ContainsFunc(r.prefixes, func(p string) bool { return strings.HasPrefix(attrs.Name, p) }) {
		return fmt.Sprintf("%q, whose name has none of the pod interface prefixes %q", attrs.Name, r.prefixes), nil
	}
	if len(r.nodeIPs) > 0 {
		// The local table holds one route per address of each interface.
		var holds netip.Addr
		err := r.nl.RouteListFilteredIter(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_LOCAL, LinkIndex: ifindex},
			netlink.RT_FILTER_TABLE|netlink.RT_FILTER_OIF, func(rt netlink.Route) bool {
				if dst := routeDst(rt); dst.IsSingleIP() && slices.Contains(r.nodeIPs, dst.Addr()) {
					holds = dst.Addr()
					return false
				}
				return true
			})
		if err != nil {
			return "", fmt.Errorf("list its addresses: %w", err)
		}
		if holds.IsValid() {
			return fmt.Sprintf("%q, which holds the node IP %s", attrs.Name, holds), nil
		}
	}
	return "", nil
}

// routeDst is a route's destination as a prefix; a default route's may be absent.
func routeDst(rt netlink.Route) netip.Prefix {
	if rt.Dst == nil {
		if rt.Family == netlink.FAMILY_V6 {
			return netip.PrefixFrom(netip.IPv6Unspecified(), 0)
		}
		return netip.PrefixFrom(netip.IPv4Unspecified(), 0)
	}
	ip, ok := netip.AddrFromSlice(rt.Dst.IP)
	if !ok {
		return netip.Prefix{}
	}
	ones, _ := rt.Dst.Mask.Size()
	return netip.PrefixFrom(ip.Unmap(), ones)
}
