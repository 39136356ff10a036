package bpfmaps

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
)

// Judging a packet from the maps (npagent explain verdict): what the programs would
// decide for one packet, read back from the state the kernel holds now — the pod's
// state word and entry group, the entries the LPM tries return for the peer (the
// kernel does the longest-prefix match on each Lookup), the node set and the pod's
// addresses — in enforce's order, not recomputed from a policy. Only the
// attribution (which object and rule an id names) comes from user space: the record
// of the commit whose word the state holds, as for the verdict counters.

// Probe is a packet to judge: the first packet of a new flow (a TCP SYN, a UDP or
// SCTP datagram, an ICMP echo request) in one direction of the pod on Ifindex.
type Probe struct {
	Ifindex   int
	Direction Direction
	Src, Dst  netip.Addr
	// Proto is the packet's protocol: ProtocolTCP, ProtocolUDP, ProtocolSCTP,
	// ProtocolICMP or ProtocolICMPv6.
	Proto Protocol
	// SrcPort and Port are its ports; ignored for port-less protocols. SrcPort 0
	// stands for an ephemeral one (it only matters to DHCP, policy.c's dhcp_client).
	SrcPort, Port uint16
}

// PortMatch is the port rule of the entry that decided (port_rule in policy.c).
type PortMatch struct {
	Protocol Protocol // ProtocolAny: every protocol
	Port     uint16
	EndPort  uint16
	Action   Action
}

// Judgement is what the programs would decide for a Probe, and why.
type Judgement struct {
	// Managed: the interface holds state, so the programs judge its packets.
	// Unmanaged packets pass unjudged and unnamed (Reason 0).
	Managed bool
	// Gen is the state word's low 32 bits (its sequence number, set and flags): the
	// commit in force, as the verdict counters' keys name it.
	Gen uint32
	// The direction's flags in that word: isolated by a namespaced policy (or
	// strict mode, or a commit that failed), with namespaced entries, with admin or
	// baseline rules. None: the direction has no policy.
	Isolated, Namespaced, Admin, Baseline bool
	// Reason is what decided, as the counter the packet would move names it.
	Reason VerdictReason
	// PolicyReason is what the policy alone decided when something else let the
	// packet pass (Reason ReasonNode): ReasonDefaultDeny, ReasonAdminDeny or
	// ReasonBaselineDeny. Zero otherwise.
	PolicyReason VerdictReason
	// Rule is the admin or baseline rule that decided (VerdictCount.Rule); Sources
	// the direction's namespaced objects for ReasonAllow and ReasonDefaultDeny (and
	// for PolicyReason). Attributed is false when the commit in force is not known
	// to this process (adopted at start and not committed since).
	Rule       Origin
	Sources    []Origin
	Attributed bool
	// Match is the port rule of the entry that decided (an admin, baseline or
	// namespaced entry); nil when no entry matched.
	Match *PortMatch
	// Audited: the policy denies it and it passes (EBPFOptions.Audit).
	Audited bool
}

// Passes reports whether the packet reaches the other side of this direction's
// program.
func (j *Judgement) Passes() bool { return !j.Reason.Denied() || j.Audited }

// Judger judges packets from the dataplane's state.
type Judger interface {
	// Judge answers what the pod's program would decide for p now. Connection
	// state is not consulted: p is a new flow's first packet (a reply of a flow the
	// other direction allowed would pass as ReasonConntrackReply).
	Judge(p Probe) (Judgement, error)
}

// judgeMaps is what judge reads: the kernel's maps (EBPF) or their model (Memory).
// Called with core.mu held.
type judgeMaps interface {
	// state is the pod's state, false when the interface has none.
	state(ifindex uint32) (policyPodState, bool, error)
	// lookup is a longest-prefix-match lookup of peer in a direction's trie.
	lookup(d Direction, group, tag uint32, peer netip.Addr) (*policyRuleValue, bool, error)
	isNode(peer netip.Addr) (bool, error)
	// addr reports whether the pod's address map holds k (own_addr, checked).
	addr(k policyAddrKey) (bool, error)
	modes() (NodeEgress, bool, error) // the programs' node egress mode and audit mode
}

// judge is enforce's order for a new flow's first packet (parsed in full, not a
// fragment, not neighbour discovery): the pod's state; anti-spoofing from the pod;
// the policy (evaluate); for a denial, traffic between the pod and its node, then
// audit mode. Called with c.mu held.
func (c *core) judge(m judgeMaps, p Probe) (Judgement, error) {
	var j Judgement
	src, dst := p.Src.Unmap(), p.Dst.Unmap()
	if !src.IsValid() || !dst.IsValid() || src.Is4() != dst.Is4() {
		return j, fmt.Errorf("judge: source %v and destination %v: want two addresses of one family", p.Src, p.Dst)
	}
	ifindex := uint32(p.Ifindex)
	st, ok, err := m.state(ifindex)
	if err != nil {
		return j, err
	}
	d := p.Direction & 1
	word := st.Dir[d]
	if !ok || wordOwner(word) != ifindex {
		return j, nil // not a pod npagent manages: VERDICT_NEXT, uncounted
	}
	j.Managed = true
	j.Gen = uint32(word)
	f := wordFlags(word)
	j.Isolated, j.Namespaced, j.Admin, j.Baseline = f&flagIsolated != 0, f&flagNamespaced != 0, f&flagAdmin != 0, f&flagBaseline != 0
	nodeEgress, audit, err := m.modes()
	if err != nil {
		return j, err
	}
	if d == Egress {
		// own_source: the pod's own address, an exempt one, or addresses unknown.
		own, err := m.addr(addrKey(ifindex, src))
		if err != nil {
			return j, err
		}
		checked, err := m.addr(policyAddrKey{Ifindex: ifindex})
		if err != nil {
			return j, err
		}
		if !own && checked && !spoofExempt(src, dst, p.Proto, p.SrcPort, p.Port, 0) {
			j.Reason = ReasonSpoofed
			return j, nil
		}
	}
	peer := src
	if d == Egress {
		peer = dst
	}
	port := p.Port
	if !p.Proto.hasPorts() {
		port = 0
	}
	group := st.Group[d][wordSet(word)]
	allow, reason, rule, match, err := evaluate(m, d, group, word, peer, p.Proto, port)
	if err != nil {
		return j, err
	}
	j.Match = match
	if allow {
		if rule == 0 {
			reason = allowedReason(word) // count_allowed's reason
		}
		j.Reason = reason
		return j, c.attributeJudgement(&j, ifindex, d, reason, rule)
	}
	// Denied by the policy: node traffic passes (node_peer: toward the pod, sent by
	// the node itself, which a query cannot tell from a forged source and assumes;
	// from the pod, under node_egress_policy only DHCP).
	node, err := m.isNode(peer)
	if err != nil {
		return j, err
	}
	dhcp := p.Proto == ProtocolUDP && (src.Is4() && p.SrcPort == 68 && p.Port == 67 || src.Is6() && p.SrcPort == 546 && p.Port == 547)
	if node && (d == Ingress || nodeEgress == NodeEgressAllow || dhcp) {
		j.Reason, j.PolicyReason = ReasonNode, reason
		return j, c.attributeJudgement(&j, ifindex, d, reason, rule)
	}
	j.Reason, j.Audited = reason, audit
	return j, c.attributeJudgement(&j, ifindex, d, reason, rule)
}

// attributeJudgement names what decided, from the record of the commit whose word
// judged (resolve: as the counter's key would be credited).
func (c *core) attributeJudgement(j *Judgement, ifindex uint32, d Direction, reason VerdictReason, rule uint16) error {
	vc, known := c.resolve(&policyVerdictKey{Ifindex: ifindex, Gen: j.Gen, Rule: rule, Dir: uint8(d), Reason: uint8(reason)})
	if known {
		j.Rule, j.Sources, j.Attributed = vc.Rule, vc.Sources, vc.Attributed
	}
	return nil
}

// evaluate mirrors evaluate in policy.c: the admin tier's first matching rule
// (Accept, Deny; Pass goes on), then if isolated the namespaced entries (default
// deny without a match), else the baseline tier's (Accept, Deny), else allowed.
// It returns the verdict, its reason, the deciding rule id and the matching port
// rule.
func evaluate(m judgeMaps, d Direction, group uint32, word uint64, peer netip.Addr, proto Protocol, port uint16) (bool, VerdictReason, uint16, *PortMatch, error) {
	flags := wordFlags(word)
	if flags == 0 {
		return true, ReasonNoPolicy, 0, nil, nil
	}
	id, set := group>>1, group&1
	find := func(t tier) (*policyPortRule, error) {
		v, ok, err := m.lookup(d, id, entryTag(set, t), peer)
		if err != nil || !ok {
			return nil, err
		}
		for i, e := range v.entries() {
			if (e.Proto == uint8(ProtocolAny) || e.Proto == uint8(proto)) && port >= e.Port && port <= e.EndPort {
				return &v.entries()[i], nil
			}
		}
		return nil, nil
	}
	matchOf := func(r *policyPortRule) *PortMatch {
		return &PortMatch{Protocol: Protocol(r.Proto), Port: r.Port, EndPort: r.EndPort, Action: Action(r.Action)}
	}
	if flags&flagAdmin != 0 {
		r, err := find(tierAdmin)
		if err != nil {
			return false, 0, 0, nil, err
		}
		if r != nil && Action(r.Action) == ActionAccept {
			return true, ReasonAdminAccept, r.Rule, matchOf(r), nil
		}
		if r != nil && Action(r.Action) == ActionDeny {
			return false, ReasonAdminDeny, r.Rule, matchOf(r), nil
		}
	}
	if flags&flagIsolated != 0 {
		if flags&flagNamespaced == 0 {
			return false, ReasonDefaultDeny, 0, nil, nil
		}
		r, err := find(tierNamespaced)
		if err != nil {
			return false, 0, 0, nil, err
		}
		if r != nil {
			return true, ReasonAllow, r.Rule, matchOf(r), nil
		}
		return false, ReasonDefaultDeny, 0, nil, nil
	}
	if flags&flagBaseline != 0 {
		r, err := find(tierBaseline)
		if err != nil {
			return false, 0, 0, nil, err
		}
		if r != nil && Action(r.Action) == ActionDeny {
			return false, ReasonBaselineDeny, r.Rule, matchOf(r), nil
		}
		if r != nil && Action(r.Action) == ActionAccept {
			return true, ReasonBaselineAccept, r.Rule, matchOf(r), nil
		}
	}
	return true, ReasonDefaultAllow, 0, nil, nil
}

// Judge implements Judger from the kernel's maps: each lookup is the program's own
// (the LPM tries match the longest prefix in the kernel). It holds the commit lock
// for its few lookups, so it reads one commit's state.
func (e *EBPF) Judge(p Probe) (Judgement, error) {
	if e.closed.Load() {
		return Judgement{}, errors.New("judge: dataplane closed")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.judge(kernelJudge{e}, p)
}

// kernelJudge reads the kernel's maps for judge.
type kernelJudge struct{ e *EBPF }

func (k kernelJudge) state(ifindex uint32) (policyPodState, bool, error) {
	var slot uint32
	if err := k.e.objs.NpaPodSlot.Lookup(ifindex, &slot); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return policyPodState{}, false, nil
		}
		return policyPodState{}, false, fmt.Errorf("judge: pod slot of interface %d: %w", ifindex, err)
	}
	if slot >= k.e.objs.NpaSlotState.MaxEntries() {
		return policyPodState{}, false, nil
	}
	// The slot's memory is the kernel's (npa_slot_state is mapped): the words the
	// program loads.
	return k.e.states.read(slot), true, nil
}

func (k kernelJudge) lookup(d Direction, group, tag uint32, peer netip.Addr) (*policyRuleValue, bool, error) {
	t4, t6 := k.e.objs.NpaInV4, k.e.objs.NpaInV6
	if d == Egress {
		t4, t6 = k.e.objs.NpaEgV4, k.e.objs.NpaEgV6
	}
	var v policyRuleValue
	var err error
	if peer.Is4() {
		err = t4.Lookup(&policyLpmKey4{Prefixlen: 64 + 32, Group: group, Tag: tag, Addr: peer.As4()}, &v)
	} else {
		err = t6.Lookup(&policyLpmKey6{Prefixlen: 64 + 128, Group: group, Tag: tag, Addr: peer.As16()}, &v)
	}
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("judge: %s trie lookup: %w", d, err)
	}
	return &v, true, nil
}

func (k kernelJudge) isNode(peer netip.Addr) (bool, error) {
	var v uint8
	var err error
	if peer.Is4() {
		err = k.e.objs.NpaNodeV4.Lookup(&policyNodeKey4{Prefixlen: 32, Addr: peer.As4()}, &v)
	} else {
		err = k.e.objs.NpaNodeV6.Lookup(&policyNodeKey6{Prefixlen: 128, Addr: peer.As16()}, &v)
	}
	return found(err, "node address trie")
}

func (k kernelJudge) addr(key policyAddrKey) (bool, error) {
	var v uint8
	return found(k.e.objs.NpaPodAddrs.Lookup(&key, &v), "pod address map")
}

func (k kernelJudge) modes() (NodeEgress, bool, error) {
	var ne, audit uint32
	if err := k.e.objs.NodeEgressPolicy.Get(&ne); err != nil {
		return 0, false, fmt.Errorf("judge: read the programs' node egress mode: %w", err)
	}
	if err := k.e.objs.AuditMode.Get(&audit); err != nil {
		return 0, false, fmt.Errorf("judge: read the programs' audit mode: %w", err)
	}
	mode := NodeEgressAllow
	if ne != 0 {
		mode = NodeEgressPolicy
	}
	return mode, audit != 0, nil
}

func found(err error, what string) (bool, error) {
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, ebpf.ErrKeyNotExist):
		return false, nil
	}
	return false, fmt.Errorf("judge: %s lookup: %w", what, err)
}

// Judge implements Judger from the in-memory model of the maps (no packets, no
// audit mode).
func (m *Memory) Judge(p Probe) (Judgement, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.judge(memoryJudge{m.maps}, p)
}

type memoryJudge struct{ m *memoryMaps }

func (j memoryJudge) state(ifindex uint32) (policyPodState, bool, error) {
	st, ok := j.m.pods[ifindex]
	return st, ok, nil
}

func (j memoryJudge) lookup(d Direction, group, tag uint32, peer netip.Addr) (*policyRuleValue, bool, error) {
	v, ok := j.m.lookupFunc(group, d, tagSet(tag), peer)(tier(tag & 3))
	return v, ok, nil
}

func (j memoryJudge) isNode(peer netip.Addr) (bool, error) { return nodeContains(j.m.node, peer), nil }

func (j memoryJudge) addr(k policyAddrKey) (bool, error) {
	_, ok := j.m.addrs[k]
	return ok, nil
}

func (j memoryJudge) modes() (NodeEgress, bool, error) { return j.m.nodeEgress, false, nil }

var (
	_ Judger = (*EBPF)(nil)
	_ Judger = (*Memory)(nil)
)
