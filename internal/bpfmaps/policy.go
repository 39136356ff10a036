package bpfmaps

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"
)

// ErrInvalidPolicy is wrapped by every error that rejects a policy because of its
// content: a bad prefix, port, protocol or action, or a rule set whose ports do not fit
// a map value. Retrying the same policy never helps.
var ErrInvalidPolicy = errors.New("invalid policy")

// ErrCapacity is wrapped when a commit would exceed a map's capacity (pods or trie
// entries). Nothing of that commit is visible. Retrying can succeed once other pods'
// state has been removed.
var ErrCapacity = errors.New("dataplane capacity exceeded")

// ErrNoBPFFS is wrapped by OpenEBPF when the pin path is below /sys/fs/bpf and no
// bpffs is mounted there. The host mounts it; the agent never does.
var ErrNoBPFFS = errors.New("bpffs is not mounted")

// ErrPinDirLocked is wrapped by OpenEBPF when another process (or another open
// dataplane of this one) holds the pin directory: two agents must never adopt and
// change the same pinned state.
var ErrPinDirLocked = errors.New("pin directory is locked by another process")

// ErrKernelFeature is wrapped by OpenEBPF when the running kernel lacks a feature the
// datapath needs; the error names the kernel release and the feature.
var ErrKernelFeature = errors.New("the kernel lacks a feature npagent needs")

// ErrIncompatiblePins is wrapped by OpenEBPF when the pinned maps hold state in a
// layout this build does not read (written by an unreleased build). Nothing is
// changed; the error names the pin directory to remove.
var ErrIncompatiblePins = errors.New("pinned eBPF state of an incompatible layout")

// Protocol is an IP protocol number as it appears in a rule.
type Protocol uint8

// Protocols a rule may name. ProtocolAny matches every protocol.
const (
	ProtocolAny  Protocol = 0
	ProtocolTCP  Protocol = 6
	ProtocolUDP  Protocol = 17
	ProtocolSCTP Protocol = 132
)

// Protocols a packet may carry without ports. They are packet protocols for Verdict,
// not rule protocols: a rule reaches them only with no Ports at all or with a
// PortRule{Protocol: ProtocolAny} for all ports.
const (
	ProtocolICMP   Protocol = 1
	ProtocolICMPv6 Protocol = 58
)

// hasPorts reports whether packets of p carry ports the datapath reads.
func (p Protocol) hasPorts() bool {
	return p == ProtocolTCP || p == ProtocolUDP || p == ProtocolSCTP
}

func (p Protocol) validInRule() bool {
	return p == ProtocolAny || p.hasPorts()
}

func (p Protocol) String() string {
	switch p {
	case ProtocolAny:
		return "any"
	case ProtocolTCP:
		return "TCP"
	case ProtocolUDP:
		return "UDP"
	case ProtocolSCTP:
		return "SCTP"
	case ProtocolICMP:
		return "ICMP"
	case ProtocolICMPv6:
		return "ICMPv6"
	}
	return fmt.Sprintf("protocol(%d)", uint8(p))
}

// PortRule selects destination ports of one protocol.
//
// Port==0 && EndPort==0: every port of Protocol, and for ProtocolAny every packet
// including those of port-less protocols such as ICMP. EndPort==0: the single Port.
// Otherwise the inclusive range [Port, EndPort]. Ports are int32 as in Kubernetes and
// are validated to 1..65535 with EndPort >= Port. A rule with a port never matches a
// port-less protocol, even with ProtocolAny.
type PortRule struct {
	Protocol Protocol
	Port     int32
	EndPort  int32
}

// Rule allows (or, in a tier, acts on) traffic to or from CIDR minus Except on Ports.
// No Ports means all traffic of every protocol.
type Rule struct {
	CIDR   netip.Prefix
	Except []netip.Prefix
	Ports  []PortRule
}

// Action is what a tier rule does with the traffic it matches.
type Action uint8

// Tier actions.
const (
	ActionAccept Action = iota + 1 // allow; later tiers are not consulted
	ActionDeny                     // drop; later tiers are not consulted
	ActionPass                     // skip the rest of this tier
)

func (a Action) String() string {
	switch a {
	case ActionAccept:
		return "Accept"
	case ActionDeny:
		return "Deny"
	case ActionPass:
		return "Pass"
	}
	return fmt.Sprintf("action(%d)", uint8(a))
}

// TierRule is one rule of a cluster-scoped policy (ClusterPolicyEndpoint).
type TierRule struct {
	Priority int32
	Action   Action
	Rule     Rule
	// Origin names the rule for verdict counters (VerdictCount.Rule); not part of
	// the content.
	Origin Origin
}

// DirectionPolicy is everything that applies to one pod in one direction.
type DirectionPolicy struct {
	Isolated bool   // some namespaced policy selects the pod in this direction
	Allow    []Rule // union of namespaced allow rules; consulted only if Isolated
	// AllowSets are more allow rules, validated beforehand (NewRuleSet), typically one
	// per object: their rules count as Allow's. A commit reads their hashes instead
	// of hashing their rules and, when only their host rules changed since the pod's
	// last commit, computes only those rules' entries again.
	AllowSets []*RuleSet
	Admin     []TierRule // admin tier: lower Priority first; Accept/Deny decide, Pass → namespaced
	Baseline  []TierRule // baseline tier: applies only when !Isolated
	// Sources name the namespaced objects whose rules Allow and AllowSets hold (and
	// that isolate the direction), for verdict counters (VerdictCount.Sources); not
	// part of the content.
	Sources []Origin
}

// PodPolicy is a pod's policy in both directions. Ingress is about packets the pod
// receives (the peer is their source); Egress about packets it sends (the peer is
// their destination).
//
// Addrs are the pod's own addresses (at most MaxPodAddrs; the order does not matter):
// the only sources its packets may leave with (anti-spoofing, see Verdict), whatever
// its policy, and the sources that never make connection state toward it (a hairpin).
// A commit that changes only them writes only them. No addresses: the pod's sources
// are not checked.
type PodPolicy struct {
	Ingress, Egress DirectionPolicy
	Addrs           []netip.Addr
}

// Verdict evaluates the policy in Go; it is the reference semantics the dataplanes are
// tested against. For a packet to or from peer with protocol proto and destination port
// (ignored, taken as 0, for protocols without ports):
//
//  1. admin tier, rules by ascending Priority (ties in slice order): the first rule
//     matching decides — Accept allows, Deny drops, Pass skips to step 2;
//  2. if Isolated: allowed iff some Allow rule matches;
//  3. otherwise the baseline tier, first match by priority: Accept allows, Deny drops,
//     Pass makes no decision;
//  4. nothing decided: allowed.
//
// A rule matches when its CIDR contains peer, none of its Except prefixes does, and it
// has no Ports or one of its PortRules matches proto and port.
//
// Verdict judges one packet by the policy alone. The datapath passes some packets
// Verdict denies, and decides some it never asks Verdict about:
//
//   - Replies: a packet of a connection the other direction allowed (the connection
//     table) passes while the connection's entry lives: 5 minutes after its last
//     packet (EBPFOptions.ConntrackTimeout), 30 s while the peer has not answered or
//     a TCP handshake has not completed (ConntrackUnrepliedTimeout), 10 s after a TCP
//     FIN from each side, 2 s after a TCP RST within the receiver's window until the
//     connection's next other packet. Entries of connections the pod opened are
//     never evicted by connections peers open.
//   - ICMP errors (RELATED): an ICMPv4 destination unreachable (frag-needed
//     included), time exceeded or parameter problem, or an ICMPv6 destination
//     unreachable, packet too big, time exceeded or parameter problem, whose quoted
//     IP header and ports are those of a connection in the table — a packet the pod
//     sent on a connection either direction allowed — passes if it goes to the quoted
//     packet's source: toward the pod whatever its own source (a router: path-MTU
//     discovery), from the pod only from the quoted packet's destination. Any other
//     ICMP packet is judged as protocol ICMP or ICMPv6, port 0.
//   - Neighbour discovery (ICMPv6 133–137) with hop limit 255 passes when its peer
//     is link-local (fe80::/10) or link-scope multicast (ff02::/16), or the node is
//     at the other end (toward the pod: the node sent it; from the pod: the node
//     would not forward it). Other NDP is judged as ICMPv6, port 0.
//   - Node traffic: a packet whose peer is one of the node's addresses passes —
//     toward the pod only if the node sent it (not forwarded from another
//     interface).
//   - Anti-spoofing (PodPolicy.Addrs): a packet from a pod whose addresses are known
//     leaves only with one of them as source, whatever the policy; the exceptions
//     are IPv6 :: for NDP and MLD (duplicate address detection), an IPv6 link-local
//     source toward a link-local or ff02::/16 destination, IPv4 0.0.0.0 for DHCP (UDP
//     68 → 67). A packet to the pod from one of its addresses (a hairpin) makes no
//     connection entry.
//   - Not IP: ARP passes; any other ethertype (VLAN-tagged frames included) is
//     dropped in a direction with any policy, and from a pod whose addresses are
//     known always; without either it passes.
//   - Fragments: a first fragment is judged with its ports; a later one carries none
//     and is not judged by the policy: in a direction with any policy it passes only
//     if its datagram's first fragment (same addresses, protocol and IP ID) passed
//     within the last 10 s (EBPFOptions.ConntrackFragmentTimeout), and is dropped
//     otherwise (denied, reordered before its first, or too late); a direction
//     without any policy passes it.
//   - Packets whose headers cannot be fully parsed (an IP header that cannot be read,
//     an L4 header cut before its ports, an IPv6 extension-header chain truncated or
//     longer than 8 headers) are not judged: a Deny rule naming their protocol or
//     ports might be meant for them. They are dropped in a direction with any policy
//     (Isolated, or Admin or Baseline rules) unless their peer is a node address, and
//     pass in a direction without any, which would allow whatever they carry.
func (d DirectionPolicy) Verdict(peer netip.Addr, proto Protocol, port uint16) bool {
	if !proto.hasPorts() {
		port = 0
	}
	for _, r := range sortedTier(d.Admin) {
		if !r.Rule.matches(peer, proto, port) {
			continue
		}
		if r.Action == ActionAccept {
			return true
		}
		if r.Action == ActionDeny {
			return false
		}
		break // Pass
	}
	if d.Isolated {
		for i := range d.Allow {
			if d.Allow[i].matches(peer, proto, port) {
				return true
			}
		}
		for _, s := range d.AllowSets {
			for i := range s.rules {
				if s.rules[i].matches(peer, proto, port) {
					return true
				}
			}
		}
		return false
	}
	for _, r := range sortedTier(d.Baseline) {
		if r.Rule.matches(peer, proto, port) {
			return r.Action != ActionDeny
		}
	}
	return true
}

// sortedTier returns the rules by ascending priority, ties in their given order.
func sortedTier(rules []TierRule) []TierRule {
	if slices.IsSortedFunc(rules, compareTierRules) {
		return rules
	}
	sorted := slices.Clone(rules)
	slices.SortStableFunc(sorted, compareTierRules)
	return sorted
}

func compareTierRules(a, b TierRule) int { return cmp.Compare(a.Priority, b.Priority) }

func (r *Rule) matches(peer netip.Addr, proto Protocol, port uint16) bool {
	if !r.CIDR.Contains(peer) {
		return false
	}
	for _, e := range r.Except {
		if e.Contains(peer) {
			return false
		}
	}
	if len(r.Ports) == 0 {
		return true
	}
	for _, p := range r.Ports {
		if p.matches(proto, port) {
			return true
		}
	}
	return false
}

// matches assumes port is 0 for port-less protocols; validated rules have ports ≥ 1,
// so only an all-ports rule matches a port-less packet.
func (p PortRule) matches(proto Protocol, port uint16) bool {
	if p.Protocol != ProtocolAny && p.Protocol != proto {
		return false
	}
	if p.Port == 0 && p.EndPort == 0 {
		return true
	}
	end := p.EndPort
	if end == 0 {
		end = p.Port
	}
	return int32(port) >= p.Port && int32(port) <= end
}

// CommitResult describes what one Commit or Remove did.
type CommitResult struct {
	Skipped bool // content hash unchanged: nothing written
	// Shared: every changed direction's entries were in the tries already, held for
	// another pod with the same rules (groups.go): no entry was written for it.
	Shared bool
	// Delta: no direction was written in full: only the changed entries, into the
	// entry group's set no pod named (then the other set was brought level), or none
	// (Shared). Otherwise a set was written in full or the old one deleted (a first
	// commit, a new group, a change of more than half the entries, or no room for
	// two sets).
	Delta bool
	// Incremental: every changed direction was compiled from the pod's previous
	// compile, computing again only the entries of the host rules that changed (or
	// took another pod's such compile of the same change); its entries' difference
	// came with it. Otherwise a direction was compiled in full (or taken from the
	// shared compiles) and its entries, where written, compared with what the set
	// held.
	Incremental    bool
	EntriesWritten int // entries inserted or replaced, both sets together
	EntriesDeleted int
	// Per phase, for telemetry: Compile (validate, hash, flatten, difference), Attach
	// (programs attached to a new pod's interface), Write (the inactive entry set
	// brought to the new entries), Switch (the one store that makes it active),
	// Cleanup (the other set brought level, or deleted).
	Compile, Attach, Write, Switch, Cleanup time.Duration
	// Switched is when the switch returned: from then on the datapath decides by the
	// new policy (or, for Remove, no longer by any). Cleanup comes after it and
	// changes no verdict. Zero when nothing was switched (Skipped, or an error).
	Switched time.Time
}

// Dataplane is what the reconcile loop drives. ifindex is the pod's host-side interface.
// Both backends (EBPF, Memory) implement all of it, so callers never type-assert for
// the node exemption, map use or entry counts.
type Dataplane interface {
	// Commit makes p the pod's policy. Atomic per pod and direction: a packet is
	// decided by its direction's old policy or its new one, never by a mix of their
	// entries. The directions are not switched together: EBPF stores ingress's word,
	// then egress's (podstate.go), so between the two stores a packet may meet the
	// new ingress policy and the old egress one (Memory switches both at once). On
	// error nothing of this commit is visible.
	Commit(ifindex int, p PodPolicy) (CommitResult, error)
	// Remove deletes the pod's state and detaches its programs. Unknown pods are no-ops.
	Remove(ifindex int) (CommitResult, error)
	// Pods returns the ifindexes with committed state, ascending.
	Pods() []int
	// Ready returns nil once the dataplane is usable.
	Ready() error
	// Close drops this process's handles. Pinned state (and enforcement) stays.
	Close() error
	// NodeExemption: the node's own addresses, whose traffic with a pod always passes.
	NodeExemption
	// UsageReporter: each map's use against its capacity, for gauges.
	UsageReporter
	// EntryCounter: what a policy would hold before it is committed (namespace shares).
	EntryCounter
	// VerdictReader: the datapath's verdict counters (none for Memory).
	VerdictReader
	// Judger: what the datapath would decide for a packet, read from its state.
	Judger
}

var _ Dataplane = (*Memory)(nil)
