package bpfmaps

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
)

// maxPortRules is how many port rules one trie value holds (MAX_PORT_RULES in
// policy.c). A prefix whose covering rules need more is rejected, naming the rule.
const maxPortRules = 24

// Direction is a pod's policy direction. Ingress policy applies to packets the pod
// receives (peer = source), Egress policy to packets it sends (peer = destination).
// The values match DIR_* in policy.c.
type Direction uint8

// Directions.
const (
	Ingress Direction = 0
	Egress  Direction = 1
)

func (d Direction) String() string {
	if d == Ingress {
		return "ingress"
	}
	return "egress"
}

// tier is the low two bits of an entry's tag (TIER_* in policy.c).
type tier uint8

const (
	tierNamespaced tier = 0
	tierAdmin      tier = 1
	tierBaseline   tier = 2
)

// Flags of a direction's state (FLAG_* in policy.c): which lookups the datapath does.
const (
	flagIsolated    uint32 = 1 << 0
	flagAdmin       uint32 = 1 << 1
	flagBaseline    uint32 = 1 << 2
	flagNamespaced  uint32 = 1 << 3 // namespaced entries exist (only with flagIsolated)
	knownDirFlags          = flagIsolated | flagAdmin | flagBaseline | flagNamespaced
	maxGeneration   uint32 = 1<<(32-flagBits) - 1 // a gen (sequence number, entry set) and the flags share 32 bits of a state word
	allPortsEndPort uint16 = 65535
)

// Every flag must fit below a state word's gen (a compile error otherwise).
const _ uint32 = 1<<flagBits - 1 - knownDirFlags

// entries returns a trie value's port rules, in evaluation order. Port 0 only
// appears in an all-ports rule [0, 65535]; port-less packets are looked up with port
// 0, so only such rules match them. Count 0 is a deny entry (an except no other rule
// covers).
func (v *policyRuleValue) entries() []policyPortRule { return v.Rules[:v.Count] }

// compiledEntry is one trie entry before it is tagged with a pod and entry set.
type compiledEntry struct {
	Prefix netip.Prefix // masked
	Tier   tier
	Value  policyRuleValue
}

// compiledDirection is a direction's policy as the datapath consumes it.
type compiledDirection struct {
	Flags   uint32
	Entries []compiledEntry
}

// sourceRule is a validated rule of one tier, ready for flattening.
type sourceRule struct {
	label   ruleLabel
	cidr    netip.Prefix
	excepts []netip.Prefix
	ports   []policyPortRule // with Action set; no ports = one all-traffic entry
}

// ruleLabel names a rule in errors ("ingress admin rule 2"); formatted only on error.
type ruleLabel struct {
	dir   Direction
	tier  string // "" for namespaced rules
	index int
}

func (l ruleLabel) String() string {
	if l.tier == "" {
		return fmt.Sprintf("%s rule %d", l.dir, l.index)
	}
	return fmt.Sprintf("%s %s rule %d", l.dir, l.tier, l.index)
}

func invalidf(label ruleLabel, format string, args ...any) error {
	return fmt.Errorf("%s: %s: %w", label, fmt.Sprintf(format, args...), ErrInvalidPolicy)
}

// validateRule checks one rule and converts it for flattening; its port entries are
// appended to *arena (one allocation for a whole direction).
func validateRule(label ruleLabel, r *Rule, action Action, arena *[]policyPortRule) (sourceRule, error) {
	if !r.CIDR.IsValid() {
		return sourceRule{}, invalidf(label, "cidr %q: invalid prefix", r.CIDR.String())
	}
	if r.CIDR.Addr().Zone() != "" {
		return sourceRule{}, invalidf(label, "cidr %q: zones are not allowed", r.CIDR.String())
	}
	src := sourceRule{label: label, cidr: r.CIDR.Masked()}
	start := len(*arena)
	for i, e := range r.Except {
		if !e.IsValid() {
			return sourceRule{}, invalidf(label, "except %d %q: invalid prefix", i, e.String())
		}
		if e.Addr().Is4() != src.cidr.Addr().Is4() {
			return sourceRule{}, invalidf(label, "except %d %q: address family differs from cidr %q", i, e.String(), src.cidr.String())
		}
		src.excepts = append(src.excepts, e.Masked())
	}
	for i, p := range r.Ports {
		if !p.Protocol.validInRule() {
			return sourceRule{}, invalidf(label, "port %d: protocol %d: unknown protocol (want 0 any, 6 TCP, 17 UDP or 132 SCTP)", i, uint8(p.Protocol))
		}
		e := policyPortRule{Proto: uint8(p.Protocol), Action: uint8(action)}
		switch {
		case p.Port == 0 && p.EndPort == 0:
			e.Port, e.EndPort = 0, allPortsEndPort
		case p.Port < 1 || p.Port > 65535:
			return sourceRule{}, invalidf(label, "port %d: port %d: out of range 1..65535", i, p.Port)
		case p.EndPort == 0:
			e.Port, e.EndPort = uint16(p.Port), uint16(p.Port)
		case p.EndPort < p.Port || p.EndPort > 65535:
			return sourceRule{}, invalidf(label, "port %d: end port %d: want %d..65535", i, p.EndPort, p.Port)
		default:
			e.Port, e.EndPort = uint16(p.Port), uint16(p.EndPort)
		}
		*arena = append(*arena, e)
	}
	if len(r.Ports) == 0 {
		*arena = append(*arena, policyPortRule{Proto: uint8(ProtocolAny), Port: 0, EndPort: allPortsEndPort, Action: uint8(action)})
	}
	src.ports = (*arena)[start:len(*arena):len(*arena)]
	return src, nil
}

// validateDirection checks every rule of d; the error names the first bad rule.
func validateDirection(dir Direction, d *DirectionPolicy) (ns, admin, baseline []sourceRule, err error) {
	ns = make([]sourceRule, 0, len(d.Allow))
	n := 0
	for i := range d.Allow {
		n += max(1, len(d.Allow[i].Ports))
	}
	for _, tr := range [][]TierRule{d.Admin, d.Baseline} {
		for i := range tr {
			n += max(1, len(tr[i].Rule.Ports))
		}
	}
	arena := make([]policyPortRule, 0, n)
	for i := range d.Allow {
		src, err := validateRule(ruleLabel{dir: dir, index: i}, &d.Allow[i], ActionAccept, &arena)
		if err != nil {
			return nil, nil, nil, err
		}
		ns = append(ns, src)
	}
	tierRules := func(name string, rules []TierRule) ([]sourceRule, error) {
		order := make([]int, len(rules))
		for i := range order {
			order[i] = i
		}
		// Stable by priority: ties keep slice order, as Verdict does.
		slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(rules[a].Priority, rules[b].Priority) })
		out := make([]sourceRule, 0, len(rules))
		for _, i := range order {
			label := ruleLabel{dir: dir, tier: name, index: i}
			a := rules[i].Action
			if a != ActionAccept && a != ActionDeny && a != ActionPass {
				return nil, invalidf(label, "action %d: unknown action (want 1 Accept, 2 Deny or 3 Pass)", uint8(a))
			}
			src, err := validateRule(label, &rules[i].Rule, a, &arena)
			if err != nil {
				return nil, err
			}
			out = append(out, src)
		}
		return out, nil
	}
	if admin, err = tierRules("admin", d.Admin); err != nil {
		return nil, nil, nil, err
	}
	if baseline, err = tierRules("baseline", d.Baseline); err != nil {
		return nil, nil, nil, err
	}
	return ns, admin, baseline, nil
}

// hashDirection returns a content hash of a direction policy: equal hashes mean the
// datapath would behave identically. Values are encoded as given (prefixes masked), so
// an invalid value never hashes like a valid one.
func hashDirection(d *DirectionPolicy) uint64 {
	h := sha256.New()
	buf := make([]byte, 0, 512)
	flush := func() {
		if len(buf) > 256 {
			h.Write(buf)
			buf = buf[:0]
		}
	}
	prefix := func(p netip.Prefix) {
		a := p.Masked().Addr().As16()
		buf = append(buf, a[:]...)
		buf = append(buf, byte(p.Bits()))
		if p.Addr().Is4() {
			buf = append(buf, 4)
		} else {
			buf = append(buf, 6)
		}
	}
	rule := func(r *Rule) {
		prefix(r.CIDR)
		buf = binary.AppendUvarint(buf, uint64(len(r.Except)))
		for _, e := range r.Except {
			prefix(e)
			flush()
		}
		buf = binary.AppendUvarint(buf, uint64(len(r.Ports)))
		for _, p := range r.Ports {
			buf = append(buf, byte(p.Protocol))
			buf = binary.BigEndian.AppendUint32(buf, uint32(p.Port))
			buf = binary.BigEndian.AppendUint32(buf, uint32(p.EndPort))
			flush()
		}
		flush()
	}
	buf = append(buf, 1) // encoding version
	if d.Isolated {
		buf = append(buf, 1)
	} else {
		buf = append(buf, 0)
	}
	buf = binary.AppendUvarint(buf, uint64(len(d.Allow)))
	for i := range d.Allow {
		rule(&d.Allow[i])
	}
	for _, tier := range [][]TierRule{d.Admin, d.Baseline} {
		buf = binary.AppendUvarint(buf, uint64(len(tier)))
		for i := range tier {
			buf = binary.BigEndian.AppendUint32(buf, uint32(tier[i].Priority))
			buf = append(buf, byte(tier[i].Action))
			rule(&tier[i].Rule)
		}
	}
	h.Write(buf)
	var sum [sha256.Size]byte
	return binary.LittleEndian.Uint64(h.Sum(sum[:0]))
}

// compileDirection flattens a validated Direction into trie entries.
func compileDirection(ns, admin, baseline []sourceRule, isolated bool) (compiledDirection, error) {
	var out compiledDirection
	if isolated {
		out.Flags |= flagIsolated
	}
	add := func(t tier, rules []sourceRule, flag uint32) error {
		n := len(out.Entries)
		var err error
		if out.Entries, err = flatten(out.Entries, t, rules); err != nil {
			return err
		}
		if len(out.Entries) > n {
			out.Flags |= flag
		}
		return nil
	}
	if err := add(tierAdmin, admin, flagAdmin); err != nil {
		return compiledDirection{}, err
	}
	if isolated {
		if err := add(tierNamespaced, ns, flagNamespaced); err != nil {
			return compiledDirection{}, err
		}
	} else if err := add(tierBaseline, baseline, flagBaseline); err != nil {
		return compiledDirection{}, err
	}
	return out, nil
}

// prefixNode gathers the rules whose CIDR or except is one prefix.
type prefixNode struct {
	prefix netip.Prefix
	cidrOf []int32 // rules whose CIDR is this prefix
	except []int32 // rules that except this prefix
}

// stackNode is a prefix on the chain of enclosing prefixes, with its value.
type stackNode struct {
	node    *prefixNode
	visible policyRuleValue
}

// flatten appends to out one entry per prefix of the tier whose value differs from the
// value of its nearest enclosing prefix (no enclosing prefix = empty value, which the
// datapath treats like a miss).
//
// Why a single longest-prefix lookup is then exact: let P be all CIDRs and excepts of
// the tier and p the longest prefix of P containing an address a. Prefixes that contain
// a are nested, so a prefix q of P contains a iff q ⊇ p. Hence rule r matches a iff
// r.CIDR ⊇ p and no except of r ⊇ p: p's value is exactly the rules matching a.
// Prefixes are visited in pre-order (sorted by address, then length), keeping the
// chain of enclosing prefixes on a stack.
func flatten(out []compiledEntry, t tier, rules []sourceRule) ([]compiledEntry, error) {
	if len(rules) == 0 {
		return out, nil
	}
	count := len(rules)
	for i := range rules {
		count += len(rules[i].excepts)
	}
	// First pass: a node per prefix, and per CIDR and except its node's index.
	nodes := make(map[netip.Prefix]int32, count)
	pool := make([]prefixNode, 0, count) // one allocation for all nodes
	at := make([]int32, 0, count)        // per rule its CIDR's node, then its excepts'
	uses := make([][2]int32, 0, count)   // per node: CIDRs, excepts
	node := func(p netip.Prefix) int32 {
		i, ok := nodes[p]
		if !ok {
			i = int32(len(pool))
			pool = append(pool, prefixNode{prefix: p})
			uses = append(uses, [2]int32{})
			nodes[p] = i
		}
		return i
	}
	for i := range rules {
		n := node(rules[i].cidr)
		uses[n][0]++
		at = append(at, n)
		for _, e := range rules[i].excepts {
			n := node(e)
			uses[n][1]++
			at = append(at, n)
		}
	}
	// Second pass: the rule lists, carved from one array.
	arena := make([]int32, count)
	off := 0
	for i := range pool {
		c, e := int(uses[i][0]), int(uses[i][1])
		pool[i].cidrOf = arena[off : off : off+c]
		pool[i].except = arena[off+c : off+c : off+c+e]
		off += c + e
	}
	k := 0
	for i := range rules {
		n := &pool[at[k]]
		n.cidrOf = append(n.cidrOf, int32(i))
		k++
		for range rules[i].excepts {
			n := &pool[at[k]]
			if len(n.except) == 0 || n.except[len(n.except)-1] != int32(i) {
				n.except = append(n.except, int32(i))
			}
			k++
		}
	}
	sorted := make([]*prefixNode, len(pool))
	for i := range pool {
		sorted[i] = &pool[i]
	}
	slices.SortFunc(sorted, func(a, b *prefixNode) int {
		if a.prefix.Addr().Is4() != b.prefix.Addr().Is4() {
			if a.prefix.Addr().Is4() {
				return -1
			}
			return 1
		}
		if c := a.prefix.Addr().Compare(b.prefix.Addr()); c != 0 {
			return c
		}
		return cmp.Compare(a.prefix.Bits(), b.prefix.Bits())
	})

	out = slices.Grow(out, len(sorted))
	excepted := make([]int32, len(rules)) // per rule: excepts of it on the stack
	var stack []stackNode
	var included []int
	var scratch []policyPortRule
	for _, n := range sorted {
		for len(stack) > 0 {
			top := stack[len(stack)-1].node
			if top.prefix.Bits() <= n.prefix.Bits() && top.prefix.Contains(n.prefix.Addr()) {
				break
			}
			for _, r := range top.except {
				excepted[r]--
			}
			stack = stack[:len(stack)-1]
		}
		for _, r := range n.except {
			excepted[r]++
		}
		stack = append(stack, stackNode{node: n})
		top := &stack[len(stack)-1]

		included = included[:0]
		for i := range stack {
			for _, r := range stack[i].node.cidrOf {
				if excepted[r] == 0 {
					included = append(included, int(r))
				}
			}
		}
		var err error
		if t == tierNamespaced {
			scratch, err = unionValue(&top.visible, rules, included, n.prefix, scratch)
		} else {
			slices.Sort(included) // rules are in priority order
			err = orderedValue(&top.visible, rules, included, n.prefix)
		}
		if err != nil {
			return nil, err
		}
		parent := &emptyValue
		if len(stack) > 1 {
			parent = &stack[len(stack)-2].visible
		}
		if top.visible != *parent {
			out = append(out, compiledEntry{Prefix: n.prefix, Tier: t, Value: top.visible})
		}
	}
	return out, nil
}

var emptyValue policyRuleValue

func overflowErr(r *sourceRule, p netip.Prefix, need int) error {
	return invalidf(r.label, "ports: %s needs %d port rules together with the other rules covering it, a map value holds %d", p, need, maxPortRules)
}

// orderedValue builds a tier value: every port rule of the included rules in priority
// order; the datapath takes the first match. Exact duplicates of an earlier entry and
// everything after an all-traffic entry can never match first and are dropped.
func orderedValue(v *policyRuleValue, rules []sourceRule, included []int, p netip.Prefix) error {
	*v = policyRuleValue{}
	for _, ri := range included {
		for _, e := range rules[ri].ports {
			if slices.ContainsFunc(v.entries(), func(x policyPortRule) bool {
				return x.Proto == e.Proto && x.Port == e.Port && x.EndPort == e.EndPort
			}) {
				continue
			}
			if v.Count == maxPortRules {
				return overflowErr(&rules[ri], p, maxPortRules+1)
			}
			v.Rules[v.Count] = e
			v.Count++
			if e.Proto == uint8(ProtocolAny) && e.Port == 0 {
				return nil
			}
		}
	}
	return nil
}

// unionValue builds a namespaced value: the union of the included rules' port rules,
// ranges of one protocol merged, sorted by protocol and port. buf is scratch space,
// returned for reuse.
func unionValue(v *policyRuleValue, rules []sourceRule, included []int, p netip.Prefix, buf []policyPortRule) ([]policyPortRule, error) {
	*v = policyRuleValue{}
	merged := mergePorts(rules, included, buf[:0])
	if len(merged) > maxPortRules {
		// Name the rule whose ports pushed the union over the limit.
		for i := range included {
			if len(mergePorts(rules, included[:i+1], nil)) > maxPortRules {
				return merged, overflowErr(&rules[included[i]], p, len(merged))
			}
		}
		return merged, overflowErr(&rules[included[len(included)-1]], p, len(merged))
	}
	copy(v.Rules[:], merged)
	v.Count = uint32(len(merged))
	return merged, nil
}

// mergePorts returns the union of the rules' port entries as few accept entries: one
// all-traffic entry if any rule allows all traffic, else ranges of one protocol merged
// where they overlap or touch. The result is built in buf's array.
func mergePorts(rules []sourceRule, included []int, buf []policyPortRule) []policyPortRule {
	all := buf[:0]
	for _, ri := range included {
		for _, e := range rules[ri].ports {
			if e.Proto == uint8(ProtocolAny) && e.Port == 0 {
				return append(all[:0], policyPortRule{Proto: uint8(ProtocolAny), EndPort: allPortsEndPort, Action: uint8(ActionAccept)})
			}
			e.Action = uint8(ActionAccept)
			all = append(all, e)
		}
	}
	slices.SortFunc(all, func(a, b policyPortRule) int {
		return cmp.Or(cmp.Compare(a.Proto, b.Proto), cmp.Compare(a.Port, b.Port), cmp.Compare(a.EndPort, b.EndPort))
	})
	merged := all[:0]
	for _, e := range all {
		if n := len(merged); n > 0 && merged[n-1].Proto == e.Proto && uint32(e.Port) <= uint32(merged[n-1].EndPort)+1 {
			merged[n-1].EndPort = max(merged[n-1].EndPort, e.EndPort)
			continue
		}
		merged = append(merged, e)
	}
	return merged
}
