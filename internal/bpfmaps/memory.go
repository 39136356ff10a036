package bpfmaps

import (
	"net/netip"
)

// Memory is the in-memory backend: no kernel, no enforcement. It runs the same
// validation, hashing, compilation, capacity accounting and commit protocol as EBPF,
// keeps the compiled entries in Go maps shaped like the kernel's (same keys, same
// entry groups of two sets) and evaluates verdicts on them in Go. It exists for unprivileged runs
// and tests; choosing it means no packet is policed.
type Memory struct {
	*core
	maps *memoryMaps
}

// NewMemory returns the in-memory backend with default Limits.
func NewMemory() *Memory { return NewMemoryWithLimits(Limits{}) }

// NewMemoryWithLimits returns the in-memory backend with the given capacities.
func NewMemoryWithLimits(l Limits) *Memory {
	maps := &memoryMaps{pods: map[uint32]policyPodState{}, addrs: map[policyAddrKey]struct{}{}}
	for d := range maps.v4 {
		maps.v4[d] = map[policyLpmKey4]policyRuleValue{}
		maps.v6[d] = map[policyLpmKey6]policyRuleValue{}
	}
	return &Memory{core: newCore(l, maps), maps: maps}
}

// Commit implements Dataplane.
func (m *Memory) Commit(ifindex int, p PodPolicy) (CommitResult, error) {
	return m.commit(ifindex, p, nil)
}

// Remove implements Dataplane.
func (m *Memory) Remove(ifindex int) (CommitResult, error) { return m.remove(ifindex, nil) }

// Pods implements Dataplane.
func (m *Memory) Pods() []int { return m.podList() }

// Ready implements Dataplane; the in-memory backend is always ready.
func (m *Memory) Ready() error { return nil }

// Close implements Dataplane; it keeps the state, as pinned maps would.
func (m *Memory) Close() error { return nil }

// Verdict evaluates a packet against the pod's committed entries the way the eBPF
// program does (policy and the node set, no connection tracking). A pod without state
// allows all; a peer in the node set (SetNodeAddrs) is allowed whatever the policy
// (from the pod, only under NodeEgressAllow: SetNodeEgress).
func (m *Memory) Verdict(ifindex int, d Direction, peer netip.Addr, proto Protocol, port uint16) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	st, ok := m.maps.pods[uint32(ifindex)]
	if !ok {
		return true
	}
	if nodeContains(m.maps.node, peer) && (d == Ingress || m.maps.nodeEgress == NodeEgressAllow) {
		return true // traffic between the pod and its own node (NodeEgress)
	}
	slot := st.Group[d][wordSet(st.Dir[d])]
	return evalDirection(st.Dir[d], m.maps.lookupFunc(slot>>1, d, slot&1, peer), proto, port)
}

// SourceAllowed reports whether a packet the pod sends with source src to dst passes
// the anti-spoofing check as the eBPF program decides it (PodPolicy.Addrs): src is one
// of the pod's addresses, or an exempt link-scope source (icmpv6 is the ICMPv6 type,
// 0 for other packets). A pod without state, or committed without addresses, is not
// checked.
func (m *Memory) SourceAllowed(ifindex int, src, dst netip.Addr, proto Protocol, sport, dport uint16, icmpv6 uint8) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	idx := uint32(ifindex)
	if _, ok := m.maps.addrs[policyAddrKey{Ifindex: idx}]; !ok {
		return true
	}
	var own []netip.Addr
	for k := range m.maps.addrs {
		if a := addrOf(k); k.Ifindex == idx && a.IsValid() {
			own = append(own, a)
		}
	}
	return sourceAllowed(own, src.Unmap(), dst.Unmap(), proto, sport, dport, icmpv6)
}

// entryCount returns how many trie entries the maps hold for a direction.
func (m *Memory) entryCount(d Direction) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.maps.v4[d]) + len(m.maps.v6[d])
}

// memoryMaps models the kernel maps; guarded by core.mu.
type memoryMaps struct {
	v4         [2]map[policyLpmKey4]policyRuleValue
	v6         [2]map[policyLpmKey6]policyRuleValue
	pods       map[uint32]policyPodState
	node       []netip.Prefix // normalized (SetNodeAddrs)
	nodeEgress NodeEgress     // SetNodeEgress
	addrs      map[policyAddrKey]struct{}
}

// lookupFunc models a longest-prefix-match lookup in a BPF LPM trie.
func (s *memoryMaps) lookupFunc(group uint32, d Direction, set uint32, peer netip.Addr) func(tier) (*policyRuleValue, bool) {
	return func(t tier) (*policyRuleValue, bool) {
		tag := entryTag(set, t)
		if peer.Is4() {
			for bits := 32; bits >= 0; bits-- {
				p, _ := peer.Prefix(bits)
				if v, ok := s.v4[d][policyLpmKey4{Prefixlen: 64 + uint32(bits), Group: group, Tag: tag, Addr: p.Addr().As4()}]; ok {
					return &v, true
				}
			}
			return nil, false
		}
		for bits := 128; bits >= 0; bits-- {
			p, _ := peer.Prefix(bits)
			if v, ok := s.v6[d][policyLpmKey6{Prefixlen: 64 + uint32(bits), Group: group, Tag: tag, Addr: p.Addr().As16()}]; ok {
				return &v, true
			}
		}
		return nil, false
	}
}

func (s *memoryMaps) writeEntries(d Direction, k4 []policyLpmKey4, v4 []policyRuleValue, k6 []policyLpmKey6, v6 []policyRuleValue) error {
	for i, k := range k4 {
		s.v4[d][k] = v4[i]
	}
	for i, k := range k6 {
		s.v6[d][k] = v6[i]
	}
	return nil
}

func (s *memoryMaps) deleteEntries(d Direction, k4 []policyLpmKey4, k6 []policyLpmKey6) error {
	for _, k := range k4 {
		delete(s.v4[d], k)
	}
	for _, k := range k6 {
		delete(s.v6[d], k)
	}
	return nil
}

func (s *memoryMaps) putPod(ifindex uint32, st *policyPodState) error {
	s.pods[ifindex] = *st
	return nil
}

func (s *memoryMaps) deletePod(ifindex uint32) error {
	delete(s.pods, ifindex)
	return nil
}

func (s *memoryMaps) putAddrs(keys []policyAddrKey) error {
	for _, k := range keys {
		s.addrs[k] = struct{}{}
	}
	return nil
}

func (s *memoryMaps) deleteAddrs(keys []policyAddrKey) error {
	for _, k := range keys {
		delete(s.addrs, k)
	}
	return nil
}
