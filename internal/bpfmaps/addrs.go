package bpfmaps

import (
	"fmt"
	"net/netip"
	"slices"
)

// MaxPodAddrs is how many addresses one pod may have (PodPolicy.Addrs): a dual-stack
// pod has two, and a few more leave room for secondary addresses. The address map
// holds MaxPodAddrs+1 entries per pod (the addresses and a marker).
const MaxPodAddrs = 8

// normalizeAddrs returns a pod's addresses unmapped, sorted and without duplicates,
// or an ErrInvalidPolicy error for an address no pod can have as its source.
func normalizeAddrs(addrs []netip.Addr) ([]netip.Addr, error) {
	if len(addrs) == 0 {
		return nil, nil
	}
	out := make([]netip.Addr, 0, len(addrs))
	for i, a := range addrs {
		a = a.Unmap()
		if !a.IsValid() || a.IsUnspecified() || a.IsMulticast() || a.Zone() != "" {
			return nil, fmt.Errorf("addrs[%d]: %q is not a pod address: %w", i, a, ErrInvalidPolicy)
		}
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	out = slices.Compact(out)
	if len(out) > MaxPodAddrs {
		return nil, fmt.Errorf("addrs: %d addresses, at most %d: %w", len(out), MaxPodAddrs, ErrInvalidPolicy)
	}
	return out, nil
}

// addrKey is the address map's key of one of a pod's addresses; the zero address
// (family 0) is the pod's marker: its addresses are known and checked.
func addrKey(ifindex uint32, a netip.Addr) policyAddrKey {
	k := policyAddrKey{Ifindex: ifindex}
	switch {
	case a.Is4():
		k.Family = 4
		b := a.As4()
		copy(k.Addr[:], b[:])
	case a.Is6():
		k.Family = 6
		k.Addr = a.As16()
	}
	return k
}

// addrOf is the address of an address map key; the zero Addr for a marker.
func addrOf(k policyAddrKey) netip.Addr {
	switch k.Family {
	case 4:
		return netip.AddrFrom4([4]byte(k.Addr[:4]))
	case 6:
		return netip.AddrFrom16(k.Addr)
	}
	return netip.Addr{}
}

// addrKeys are the keys of addrs, with the marker when marker is set.
func addrKeys(ifindex uint32, addrs []netip.Addr, marker bool) []policyAddrKey {
	keys := make([]policyAddrKey, 0, len(addrs)+1)
	for _, a := range addrs {
		keys = append(keys, addrKey(ifindex, a))
	}
	if marker {
		keys = append(keys, policyAddrKey{Ifindex: ifindex})
	}
	return keys
}

// without returns the addresses of a that b does not hold (both sorted).
func without(a, b []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, x := range a {
		if _, found := slices.BinarySearchFunc(b, x, netip.Addr.Compare); !found {
			out = append(out, x)
		}
	}
	return out
}

// writeAddrs makes the address map hold next for the pod instead of old: the new
// addresses (and the marker, for a pod whose addresses were unknown) before the stale
// ones are deleted, so an address in both is never missing. undo reverses the
// insertions (a failed commit).
func (c *core) writeAddrs(idx uint32, old, next []netip.Addr) (undo func(), err error) {
	add := addrKeys(idx, without(next, old), len(old) == 0 && len(next) > 0)
	if err := c.store.putAddrs(add); err != nil {
		_ = c.store.deleteAddrs(add)
		return nil, fmt.Errorf("write pod addresses: %w", err)
	}
	return func() { _ = c.store.deleteAddrs(add) }, nil
}

// dropAddrs deletes what the address map holds for the pod beyond next.
func (c *core) dropAddrs(idx uint32, old, next []netip.Addr) error {
	if err := c.store.deleteAddrs(addrKeys(idx, without(old, next), len(old) > 0 && len(next) == 0)); err != nil {
		return fmt.Errorf("delete stale pod addresses: %w", err)
	}
	return nil
}

// keptAddrs deletes the pod's stale addresses and returns what the address map holds
// for it: next, or with the stale ones if their deletion failed (the next commit with
// next tries again).
func (c *core) keptAddrs(idx uint32, old, next []netip.Addr) []netip.Addr {
	if c.dropAddrs(idx, old, next) == nil {
		return next
	}
	kept := slices.Concat(next, without(old, next))
	slices.SortFunc(kept, netip.Addr.Compare)
	return kept
}

// sourceAllowed reports whether a packet from a pod with the given addresses may
// leave with source src toward dst, as policy.c's own_source decides: a pod without
// addresses is not checked; otherwise src is one of them, or IPv6 :: for neighbour
// discovery and multicast listener messages (icmpv6 is the ICMPv6 type, 0 for other
// packets), an IPv6 link-local source toward a link-local or ff02::/16 destination,
// or IPv4 0.0.0.0 for DHCP (UDP 68 → 67).
func sourceAllowed(addrs []netip.Addr, src, dst netip.Addr, proto Protocol, sport, dport uint16, icmpv6 uint8) bool {
	return len(addrs) == 0 || slices.Contains(addrs, src) || spoofExempt(src, dst, proto, sport, dport, icmpv6)
}

// spoofExempt reports whether a packet from the pod may carry src though it is not
// one of the pod's addresses (spoof_exempt in policy.c).
func spoofExempt(src, dst netip.Addr, proto Protocol, sport, dport uint16, icmpv6 uint8) bool {
	if src.Is6() {
		if src.IsLinkLocalUnicast() {
			return dst.IsLinkLocalUnicast() || (dst.Is6() && dst.As16()[0] == 0xff && dst.As16()[1] == 0x02)
		}
		ndp := (icmpv6 >= 130 && icmpv6 <= 137) || icmpv6 == 143
		return src.IsUnspecified() && proto == ProtocolICMPv6 && ndp
	}
	return src.IsUnspecified() && proto == ProtocolUDP && sport == 68 && dport == 67
}
