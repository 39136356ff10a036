package bpfmaps

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
)

// Verdict counters: what the datapath decided, per pod and direction, and what
// decided it.
//
// The programs count every packet of a managed pod in a per-CPU hash keyed by the
// pod, the direction, the reason (VerdictReason), the deciding rule's id and the
// state word that judged it (its low 32 bits: sequence number, set, flags). The rule
// id is written into the entries (port_rule.rule): in the admin and baseline tiers
// the rule's position in its tier by priority, plus one, so it is part of the content
// that entry groups share; the namespaced tier's values merge every allowing rule's
// ports, and its verdicts are credited to the direction's objects instead
// (DirectionPolicy.Sources). User space keeps, per pod and direction, what each of
// its last commits named (genRecord): the word in the key says which commit judged
// the packet, so a count is never credited to a commit that did not judge it, even
// when ids mean other rules after a switch. Nothing is done per packet in user
// space: Verdicts reads the counters when asked (at collection).

// DefaultVerdictEntries is the verdict counters' default capacity (EBPFOptions).
const DefaultVerdictEntries = 16384

// maxRuleID is the largest rule id an entry carries; later rules of a tier share it
// (their counts are credited to the rule at maxRuleID - 1).
const maxRuleID = 1<<16 - 1

// maxGenRecords is how many commits per pod and direction keep their attribution
// once Verdicts has read the counters, besides those a per-CPU allowed counter still
// names: counts judged by an older one are reported with Attributed false.
// maxGenRecordsKept bounds them between reads.
const (
	maxGenRecords     = 4
	maxGenRecordsKept = 64
)

// VerdictReason is what decided a packet (REASON_* in policy.c). Below ReasonDenied
// the packet passed.
type VerdictReason uint8

// Reasons.
const (
	ReasonNoPolicy       VerdictReason = 1  // the direction has no policy
	ReasonAllow          VerdictReason = 2  // a namespaced allow rule (credited to the direction's objects)
	ReasonAdminAccept    VerdictReason = 3  // an admin Accept rule
	ReasonBaselineAccept VerdictReason = 4  // a baseline Accept rule
	ReasonDefaultAllow   VerdictReason = 5  // not isolated; no admin or baseline rule decided
	ReasonConntrackReply VerdictReason = 6  // a reply of a connection the other direction allowed
	ReasonNode           VerdictReason = 7  // traffic between the pod and its node
	ReasonICMPRelated    VerdictReason = 8  // an ICMP error quoting a tracked connection
	ReasonNDP            VerdictReason = 9  // neighbour discovery on the pod's link
	ReasonFragment       VerdictReason = 10 // a later fragment of a datagram whose first passed
	ReasonARP            VerdictReason = 11
	ReasonDenied         VerdictReason = 32 // the first denying reason
	ReasonDefaultDeny    VerdictReason = 32 // isolated, and no rule allowed it
	ReasonAdminDeny      VerdictReason = 33 // an admin Deny rule
	ReasonBaselineDeny   VerdictReason = 34 // a baseline Deny rule
	ReasonUnparseable    VerdictReason = 35 // headers that cannot be fully parsed
	ReasonSpoofed        VerdictReason = 36 // a source (or ARP sender) that is not the pod's
	ReasonNotIP          VerdictReason = 37 // an ethertype other than IPv4, IPv6 and ARP
	ReasonFragmentDenied VerdictReason = 38 // a later fragment whose first did not pass
	ReasonUnsettled      VerdictReason = 39 // the pod's policy kept changing while deciding
)

// reasonAudited marks, in a counter's key, a policy denial that passed in audit mode
// (REASON_AUDITED in policy.c).
const reasonAudited = 64

var reasonNames = map[VerdictReason]string{
	ReasonNoPolicy: "no_policy", ReasonAllow: "policy_allow", ReasonAdminAccept: "admin_accept",
	ReasonBaselineAccept: "baseline_accept", ReasonDefaultAllow: "default_allow",
	ReasonConntrackReply: "conntrack_reply", ReasonNode: "node", ReasonICMPRelated: "icmp_related",
	ReasonNDP: "ndp", ReasonFragment: "fragment", ReasonARP: "arp",
	ReasonDefaultDeny: "default_deny", ReasonAdminDeny: "admin_deny", ReasonBaselineDeny: "baseline_deny",
	ReasonUnparseable: "unparseable", ReasonSpoofed: "spoofed", ReasonNotIP: "not_ip",
	ReasonFragmentDenied: "fragment_denied", ReasonUnsettled: "unsettled",
}

// String is the reason's name as telemetry reports it (snake case).
func (r VerdictReason) String() string {
	if n, ok := reasonNames[r]; ok {
		return n
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// Denied reports whether packets of this reason were dropped.
func (r VerdictReason) Denied() bool { return r >= ReasonDenied }

// Origin names where a rule came from, for verdict counters. The dataplane treats it
// as opaque: it is not part of a policy's content (pods whose rules are equal share
// entries whatever their origins), only kept per commit to credit counts.
type Origin struct {
	UID, Kind, Namespace, Name string
	Policy                     string // the policy the object is a chunk of, if named
	// Index is the rule's index in its object's direction; -1 names the object as a
	// whole (DirectionPolicy.Sources).
	Index int
}

// VerdictCount is how many packets of one pod and direction one cause decided.
type VerdictCount struct {
	Ifindex   int
	Direction Direction
	Reason    VerdictReason
	// Rule is the admin or baseline rule that decided (Reason ReasonAdminAccept,
	// ReasonAdminDeny, ReasonBaselineAccept, ReasonBaselineDeny), as its TierRule's
	// Origin; zero otherwise.
	Rule Origin
	// Sources are the direction's namespaced objects (DirectionPolicy.Sources) in the
	// commit that judged the packets, for ReasonAllow and ReasonDefaultDeny (none:
	// isolated by the caller without an object, e.g. strict mode); nil otherwise.
	Sources []Origin
	// Audited: the policy denied these packets and they passed (EBPFOptions.Audit):
	// would-be denials. Reason says what denied them.
	Audited bool
	// Attributed is false when the commit that judged the packets is no longer known
	// (more than a few commits ago, or state adopted from a previous process and not
	// committed since): Reason holds, Rule and Sources are empty.
	Attributed     bool
	Packets, Bytes uint64
}

// VerdictCounts are the verdict counters' totals since the dataplane was opened.
type VerdictCounts struct {
	// Counts, one per pod, direction, reason, rule and sources, sorted.
	Counts []VerdictCount
	// Lost counts packets whose counter did not fit (EBPFOptions.VerdictEntries).
	Lost uint64
}

// VerdictReader reads the datapath's verdict counters.
type VerdictReader interface {
	// Verdicts returns every counter's total since the dataplane was opened. A pod
	// removed is no longer reported.
	Verdicts() (VerdictCounts, error)
}

// attribution is what one commit of a direction credits counts to.
type attribution struct {
	sources         []Origin
	admin, baseline []Origin // by rule id - 1: the tier's rules by priority
}

// genRecord is a commit's attribution, by the low 32 bits of the word it stored.
type genRecord struct {
	gen  uint32
	attr *attribution
}

func newAttribution(d *DirectionPolicy) *attribution {
	a := &attribution{sources: slices.Clone(d.Sources)}
	for _, r := range sortedTier(d.Admin) {
		a.admin = append(a.admin, r.Origin)
	}
	for _, r := range sortedTier(d.Baseline) {
		a.baseline = append(a.baseline, r.Origin)
	}
	return a
}

// attribute records what the pod's current words credit counts to: a new record for
// a direction whose word changed, the current one replaced otherwise (same content,
// origins maybe renamed; or state adopted at start). Called with c.mu held.
func (c *core) attribute(rec *podRecord, pols [2]*DirectionPolicy) {
	for d := range pols {
		gen := uint32(rec.state.Dir[d])
		gs := rec.gens[d]
		if n := len(gs); n > 0 && gs[n-1].gen == gen {
			gs[n-1].attr = newAttribution(pols[d])
			continue
		}
		if len(gs) == maxGenRecordsKept {
			gs = append(gs[:0], gs[1:]...)
		}
		rec.gens[d] = append(gs, genRecord{gen: gen, attr: newAttribution(pols[d])})
	}
}

// allowedReason is the reason a per-CPU allowed counter counts for (allowed_reason
// in policy.c).
func allowedReason(w uint64) VerdictReason {
	switch f := wordFlags(w); {
	case f == 0:
		return ReasonNoPolicy
	case f&flagIsolated != 0:
		return ReasonAllow
	}
	return ReasonDefaultAllow
}

// pruneGens keeps a pod's last maxGenRecords commits per direction and those its
// per-CPU allowed counters still name (refs).
func (rec *podRecord) pruneGens(refs [2][]uint32) {
	for d := range rec.gens {
		gs := rec.gens[d]
		keep := gs[:0]
		for i, g := range gs {
			if i >= len(gs)-maxGenRecords || slices.Contains(refs[d], g.gen) {
				keep = append(keep, g)
			}
		}
		clear(gs[len(keep):])
		rec.gens[d] = keep
	}
}

// verdictFold is a count's identity once credited.
type verdictFold struct {
	ifindex    uint32
	dir        Direction
	reason     VerdictReason
	audited    bool
	rule       Origin
	sources    string
	attributed bool
}

// verdictTotals are the counts of commits no longer in force, folded (their keys
// deleted from the map, so it holds only the current commits' keys). Guarded by
// core.mu.
type verdictTotals map[verdictFold]*VerdictCount

// resolve credits a key's counts.
func (c *core) resolve(k *policyVerdictKey) (VerdictCount, bool) {
	out := VerdictCount{Ifindex: int(k.Ifindex), Direction: Direction(k.Dir & 1), Reason: VerdictReason(k.Reason &^ reasonAudited),
		Audited: k.Reason&reasonAudited != 0}
	rec := c.pods[k.Ifindex]
	if rec == nil {
		return out, false
	}
	for _, g := range rec.gens[out.Direction] {
		if g.gen != k.Gen {
			continue
		}
		out.Attributed = true
		switch out.Reason {
		case ReasonAllow, ReasonDefaultDeny:
			out.Sources = g.attr.sources
		case ReasonAdminAccept, ReasonAdminDeny:
			if i := int(k.Rule) - 1; i >= 0 && i < len(g.attr.admin) {
				out.Rule = g.attr.admin[i]
			}
		case ReasonBaselineAccept, ReasonBaselineDeny:
			if i := int(k.Rule) - 1; i >= 0 && i < len(g.attr.baseline) {
				out.Rule = g.attr.baseline[i]
			}
		}
	}
	return out, true
}

func foldOf(v *VerdictCount) verdictFold {
	var b []byte
	for _, s := range v.Sources {
		b = append(append(append(append(append(append(append(append(b, s.UID...), '/'), s.Kind...), '/'), s.Namespace...), '/'), s.Name...), '/')
		b = append(strconv.AppendInt(b, int64(s.Index), 10), ';')
	}
	return verdictFold{ifindex: uint32(v.Ifindex), dir: v.Direction, reason: v.Reason, audited: v.Audited, rule: v.Rule,
		sources: string(b), attributed: v.Attributed}
}

func (t verdictTotals) add(v VerdictCount) {
	f := foldOf(&v)
	if cur := t[f]; cur != nil {
		cur.Packets += v.Packets
		cur.Bytes += v.Bytes
		return
	}
	t[f] = &v
}

// Verdicts implements VerdictReader. The maps are read without the commit lock (a
// collection never delays a commit by its syscalls), then credited under it. A
// key of a commit no longer in force is folded into user-space totals and deleted
// from the map once it held still for a whole collection: a packet judged by the
// old word just before a switch may still count in it for a moment, and a delete
// then would lose it.
func (e *EBPF) Verdicts() (VerdictCounts, error) {
	var out VerdictCounts
	if e.closed.Load() {
		return out, errors.New("read verdict counters: dataplane closed")
	}
	type hashRead struct {
		k              policyVerdictKey
		packets, bytes uint64
	}
	var hash []hashRead
	var k policyVerdictKey
	var vals []policyVerdictValue
	it := e.objs.NpaVerdicts.Iterate()
	for it.Next(&k, &vals) {
		h := hashRead{k: k}
		for _, v := range vals {
			h.packets += v.Packets
			h.bytes += v.Bytes
		}
		hash = append(hash, h)
	}
	if err := it.Err(); err != nil {
		return out, fmt.Errorf("read verdict counters: %w", err)
	}
	// The allowed path's per-CPU slots, after the hash (policy.c: a move between the
	// two reads is missed once, never counted twice).
	e.mu.Lock()
	slots := maps.Clone(e.states.slots)
	e.mu.Unlock()
	type allowedRead struct {
		k              policyVerdictKey
		packets, bytes uint64
	}
	var allowed []allowedRead
	var ac []policyAllowedCount
	for ifindex, slot := range slots {
		for d := range uint32(2) {
			if err := e.objs.NpaAllowed.Lookup(slot*2+d, &ac); err != nil {
				return out, fmt.Errorf("read allowed counters of interface %d: %w", ifindex, err)
			}
			for _, a := range ac {
				if a.Packets == 0 || wordOwner(a.Word) != ifindex {
					continue // another pod's, moved to the hash once its next packet comes
				}
				allowed = append(allowed, allowedRead{k: policyVerdictKey{Ifindex: ifindex, Gen: uint32(a.Word), Dir: uint8(d),
					Reason: uint8(allowedReason(a.Word))}, packets: a.Packets, bytes: a.Bytes})
			}
		}
	}
	var lost []uint64
	if err := e.objs.NpaVerdictsLost.Lookup(uint32(0), &lost); err != nil {
		return out, fmt.Errorf("read lost verdict counter: %w", err)
	}
	for _, n := range lost {
		out.Lost += n
	}

	e.mu.Lock()
	defer e.mu.Unlock()
	if e.verdictTotals == nil {
		e.verdictTotals = verdictTotals{}
	}
	live := verdictTotals{}
	referenced := map[uint32][2][]uint32{} // by ifindex: per direction, the gens still counted
	refer := func(k *policyVerdictKey) {
		refs := referenced[k.Ifindex]
		refs[k.Dir&1] = append(refs[k.Dir&1], k.Gen)
		referenced[k.Ifindex] = refs
	}
	retired := map[policyVerdictKey]uint64{}
	var del []policyVerdictKey
	for _, h := range hash {
		vc, known := e.resolve(&h.k)
		vc.Packets, vc.Bytes = h.packets, h.bytes
		if !known {
			del = append(del, h.k) // a removed pod's late packets
			continue
		}
		if rec := e.pods[h.k.Ifindex]; uint32(rec.state.Dir[vc.Direction]) != h.k.Gen {
			if last, ok := e.retiredSeen[h.k]; ok && last == h.packets {
				e.verdictTotals.add(vc)
				del = append(del, h.k)
				continue
			}
			retired[h.k] = h.packets
			refer(&h.k)
		}
		live.add(vc)
	}
	e.retiredSeen = retired
	for i := range del {
		// A packet judged by a retired word that counts after this delete makes
		// its key again: a later read folds it.
		if err := e.objs.NpaVerdicts.Delete(&del[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return out, fmt.Errorf("delete retired verdict counter: %w", err)
		}
	}
	for _, a := range allowed {
		if e.pods[a.k.Ifindex] == nil {
			continue
		}
		vc, _ := e.resolve(&a.k)
		vc.Packets, vc.Bytes = a.packets, a.bytes
		live.add(vc)
		refer(&a.k)
	}
	for ifindex, rec := range e.pods {
		rec.pruneGens(referenced[ifindex])
	}
	for _, v := range e.verdictTotals {
		live.add(*v)
	}
	for _, v := range live {
		out.Counts = append(out.Counts, *v)
	}
	sortCounts(out.Counts)
	return out, nil
}

func sortCounts(cs []VerdictCount) {
	// Each count's fold and rule key are computed once, not per comparison: with
	// objects named in Sources they are most of a collection's cost.
	type keyed struct {
		f    verdictFold
		rule string
		i    int
	}
	ks := make([]keyed, len(cs))
	for i := range cs {
		f := foldOf(&cs[i])
		ks[i] = keyed{f: f, rule: fmt.Sprint(f.rule), i: i}
	}
	slices.SortFunc(ks, func(ka, kb keyed) int {
		a, b := &cs[ka.i], &cs[kb.i]
		fa, fb := &ka.f, &kb.f
		switch {
		case a.Ifindex != b.Ifindex:
			return a.Ifindex - b.Ifindex
		case a.Direction != b.Direction:
			return int(a.Direction) - int(b.Direction)
		case a.Reason != b.Reason:
			return int(a.Reason) - int(b.Reason)
		case fa.rule != fb.rule:
			return strings.Compare(ka.rule, kb.rule)
		case fa.audited != fb.audited:
			if fa.audited {
				return 1
			}
			return -1
		case fa.attributed != fb.attributed:
			if fa.attributed {
				return 1
			}
			return -1
		}
		return strings.Compare(fa.sources, fb.sources)
	})
	sorted := make([]VerdictCount, len(cs))
	for j, k := range ks {
		sorted[j] = cs[k.i]
	}
	copy(cs, sorted)
}

// forgetVerdicts drops a removed pod's counters (keys, folded totals, and the
// allowed counters of the slot it held, ok), so a later pod on its ifindex starts
// from zero. Called with c.mu held.
func (e *EBPF) forgetVerdicts(ifindex, slot uint32, ok bool) error {
	if ok {
		zero := make([]policyAllowedCount, ebpf.MustPossibleCPU())
		for d := range uint32(2) {
			if err := e.objs.NpaAllowed.Update(slot*2+d, zero, ebpf.UpdateAny); err != nil {
				return fmt.Errorf("clear allowed counters: %w", err)
			}
		}
	}
	for f := range e.verdictTotals {
		if f.ifindex == ifindex {
			delete(e.verdictTotals, f)
		}
	}
	var k policyVerdictKey
	var vals []policyVerdictValue
	var mine []policyVerdictKey
	it := e.objs.NpaVerdicts.Iterate()
	for it.Next(&k, &vals) {
		if k.Ifindex == ifindex {
			mine = append(mine, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read verdict counters: %w", err)
	}
	for i := range mine {
		if err := e.objs.NpaVerdicts.Delete(&mine[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete verdict counter: %w", err)
		}
	}
	return nil
}

// Verdicts implements VerdictReader: the in-memory backend polices no packet, so it
// counts none.
func (m *Memory) Verdicts() (VerdictCounts, error) { return VerdictCounts{}, nil }
