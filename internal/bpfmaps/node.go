package bpfmaps

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"
)

// MaxNodePrefixes is how many node prefixes of each family the dataplane holds.
const MaxNodePrefixes = 1024

// NodeExemption is part of Dataplane (both backends): traffic between a pod and its own
// node is always allowed — in every tier, admin Deny included, and in both directions
// unless NodeEgressPolicy makes the pod's egress policy judge its packets to the node
// (Kubernetes NetworkPolicy's rule for kubelet probes; the AWS agent's too). A packet
// whose peer (the source of a packet to the pod, the destination of one from it) is
// in the node set passes whatever the pod's policy says. Pods without state are open
// anyway.
type NodeExemption interface {
	// SetNodeAddrs replaces the node set: the node's own addresses (as /32 or /128)
	// and any extra CIDRs, both families; more than MaxNodePrefixes of a family is
	// ErrCapacity (the caller chooses what to leave out). Prefixes are masked and IPv4-mapped IPv6
	// prefixes taken as IPv4. The replacement writes the new set before deleting what
	// it no longer holds, so a prefix in both the old and the new set is never
	// missing in between. On error the set holds the old prefixes and possibly some
	// of the new ones.
	SetNodeAddrs(prefixes []netip.Prefix) error
}

var (
	_ NodeExemption = (*EBPF)(nil)
	_ NodeExemption = (*Memory)(nil)
)

// NodeEgress says what a pod's packets to its own node's addresses are
// (EBPFOptions.NodeEgress). The node's packets to the pod always pass.
type NodeEgress uint8

const (
	// NodeEgressAllow: they pass whatever the pod's egress policy says, as the node's
	// to the pod do (the AWS agent's behaviour). A pod whose egress is denied still
	// reaches its node's addresses: a NodePort or hostPort on its own node, a
	// node-local DNS cache on a node address, anything listening on the node.
	NodeEgressAllow NodeEgress = iota
	// NodeEgressPolicy: the pod's egress policy judges them as any peer's. Replies of
	// connections the node opened to the pod (kubelet probes) pass as replies: the
	// node's packets to the pod are tracked when the pod's egress has a policy. DHCP
	// client messages to the node (UDP 68 -> 67, 546 -> 547) and link-scope neighbour
	// discovery still pass.
	NodeEgressPolicy
)

// String is the mode's flag value: allow or policy.
func (n NodeEgress) String() string {
	if n == NodeEgressPolicy {
		return "policy"
	}
	return "allow"
}

// Set parses allow or policy (flag.Value).
func (n *NodeEgress) Set(s string) error {
	switch s {
	case "allow":
		*n = NodeEgressAllow
	case "policy":
		*n = NodeEgressPolicy
	default:
		return fmt.Errorf("%q is not allow or policy", s)
	}
	return nil
}

// setNodeEgressVariable loads the programs with the mode (node_egress_policy).
// setAuditVariable sets audit_mode (policy.c) for the programs about to be loaded.
func setAuditVariable(spec *ebpf.CollectionSpec, audit bool) error {
	v := uint32(0)
	if audit {
		v = 1
	}
	if err := spec.Variables[policyVarAuditMode].Set(v); err != nil {
		return fmt.Errorf("set %s: %w", policyVarAuditMode, err)
	}
	return nil
}

func setNodeEgressVariable(spec *ebpf.CollectionSpec, mode NodeEgress) error {
	v := uint32(0)
	if mode == NodeEgressPolicy {
		v = 1
	}
	if err := spec.Variables[policyVarNodeEgressPolicy].Set(v); err != nil {
		return fmt.Errorf("set %s: %w", policyVarNodeEgressPolicy, err)
	}
	return nil
}

// normalizeNodePrefixes validates, masks, unmaps and deduplicates prefixes, sorted.
func normalizeNodePrefixes(prefixes []netip.Prefix) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(prefixes))
	for _, p := range prefixes {
		if !p.IsValid() {
			return nil, fmt.Errorf("%w: node prefix %v is not valid", ErrInvalidPolicy, p)
		}
		a := p.Addr().WithZone("")
		bits := p.Bits()
		if a.Is4In6() {
			if bits < 96 {
				return nil, fmt.Errorf("%w: node prefix %v: an IPv4-mapped prefix needs at least 96 bits", ErrInvalidPolicy, p)
			}
			a, bits = a.Unmap(), bits-96
		}
		out = append(out, netip.PrefixFrom(a, bits).Masked())
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	out = slices.Compact(out)
	n4, n6 := 0, 0
	for _, p := range out {
		if p.Addr().Is4() {
			n4++
		} else {
			n6++
		}
	}
	if n4 > MaxNodePrefixes || n6 > MaxNodePrefixes {
		return nil, fmt.Errorf("%w: %d IPv4 and %d IPv6 node prefixes, at most %d each", ErrCapacity, n4, n6, MaxNodePrefixes)
	}
	return out, nil
}

// nodeContains reports whether a sorted, normalized node set contains addr.
func nodeContains(set []netip.Prefix, addr netip.Addr) bool {
	addr = addr.Unmap()
	for _, p := range set {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

func nodeKey4(p netip.Prefix) policyNodeKey4 {
	return policyNodeKey4{Prefixlen: uint32(p.Bits()), Addr: p.Addr().As4()}
}

func nodeKey6(p netip.Prefix) policyNodeKey6 {
	return policyNodeKey6{Prefixlen: uint32(p.Bits()), Addr: p.Addr().As16()}
}

// SetNodeAddrs implements NodeExemption on the kernel's node tries: the new prefixes
// are written (a prefix already there is rewritten in place, an LPM trie replaces the
// value of an existing key without removing it), then the stale ones deleted.
func (e *EBPF) SetNodeAddrs(prefixes []netip.Prefix) error {
	if e.closed.Load() {
		return errors.New("set node addresses: dataplane closed")
	}
	set, err := normalizeNodePrefixes(prefixes)
	if err != nil {
		return fmt.Errorf("set node addresses: %w", err)
	}
	e.nodeMu.Lock()
	defer e.nodeMu.Unlock()
	want4, want6 := map[policyNodeKey4]bool{}, map[policyNodeKey6]bool{}
	one := uint8(1)
	for _, p := range set {
		if p.Addr().Is4() {
			k := nodeKey4(p)
			want4[k] = true
			err = e.objs.NpaNodeV4.Update(&k, &one, ebpf.UpdateAny)
		} else {
			k := nodeKey6(p)
			want6[k] = true
			err = e.objs.NpaNodeV6.Update(&k, &one, ebpf.UpdateAny)
		}
		if err != nil {
			return fmt.Errorf("set node addresses: write %v: %w", p, capacityErr(err))
		}
	}
	stale4, err := staleKeys(e.objs.NpaNodeV4, want4)
	if err != nil {
		return fmt.Errorf("set node addresses: IPv4: %w", err)
	}
	stale6, err := staleKeys(e.objs.NpaNodeV6, want6)
	if err != nil {
		return fmt.Errorf("set node addresses: IPv6: %w", err)
	}
	for _, k := range stale4 {
		if err := e.objs.NpaNodeV4.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("set node addresses: delete stale IPv4 prefix: %w", err)
		}
	}
	for _, k := range stale6 {
		if err := e.objs.NpaNodeV6.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("set node addresses: delete stale IPv6 prefix: %w", err)
		}
	}
	return nil
}

// staleKeys lists the keys of m that want does not hold. The keys are collected
// before any is deleted: deleting while iterating a trie can restart the walk.
func staleKeys[K comparable](m *ebpf.Map, want map[K]bool) ([]K, error) {
	var (
		k     K
		v     uint8
		stale []K
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		if !want[k] {
			stale = append(stale, k)
		}
	}
	return stale, it.Err()
}

// NodeAddrs returns the node set the kernel holds, sorted.
func (e *EBPF) NodeAddrs() ([]netip.Prefix, error) {
	e.nodeMu.Lock()
	defer e.nodeMu.Unlock()
	var out []netip.Prefix
	var v uint8
	var k4 policyNodeKey4
	it := e.objs.NpaNodeV4.Iterate()
	for it.Next(&k4, &v) {
		out = append(out, netip.PrefixFrom(netip.AddrFrom4(k4.Addr), int(k4.Prefixlen)))
	}
	if err := it.Err(); err != nil {
		return nil, err
	}
	var k6 policyNodeKey6
	it = e.objs.NpaNodeV6.Iterate()
	for it.Next(&k6, &v) {
		out = append(out, netip.PrefixFrom(netip.AddrFrom16(k6.Addr), int(k6.Prefixlen)))
	}
	if err := it.Err(); err != nil {
		return nil, err
	}
	return normalizeNodePrefixes(out)
}

// SetNodeEgress sets the mode Verdict models (NodeEgressAllow until then), as
// EBPFOptions.NodeEgress sets the kernel's.
func (m *Memory) SetNodeEgress(mode NodeEgress) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.maps.nodeEgress = mode
}

// SetNodeAddrs implements NodeExemption in memory: the in-memory backend's Verdict
// consults the set; no packet meets it (this backend enforces nothing).
func (m *Memory) SetNodeAddrs(prefixes []netip.Prefix) error {
	set, err := normalizeNodePrefixes(prefixes)
	if err != nil {
		return fmt.Errorf("set node addresses: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.maps.node = set
	return nil
}
