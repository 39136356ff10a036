package podif

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

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

// NewRouteResolver resolves by route lookup: the host route (/32 or /128) to the pod IP
// that most CNIs (AWS VPC CNI, Calico, the bridge-less ptp plugin) install in the main
// table, pointing at the pod's veth. Only an exact host route without gateway counts:
// a longest-prefix lookup would answer with the node's uplink for a pod whose route is
// not there yet, and policy for the pod would land on the node's own interface.
func NewRouteResolver() Resolver { return routeResolver{} }

type routeResolver struct{}

func (routeResolver) Resolve(podIP netip.Addr) (int, error) {
	podIP = podIP.Unmap()
	family, bits := netlink.FAMILY_V4, 32
	if podIP.Is6() {
		family, bits = netlink.FAMILY_V6, 128
	}
	filter := &netlink.Route{Dst: &net.IPNet{IP: podIP.AsSlice(), Mask: net.CIDRMask(bits, bits)}, Table: unix.RT_TABLE_MAIN}
	ifindex := 0
	err := netlink.RouteListFilteredIter(family, filter, netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE, func(r netlink.Route) bool {
		if r.LinkIndex > 0 && r.Gw == nil && len(r.MultiPath) == 0 {
			ifindex = r.LinkIndex
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
	return ifindex, nil
}
