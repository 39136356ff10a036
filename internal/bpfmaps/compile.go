package bpfmaps

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"sort"
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

// compiledDirection is a direction's policy as the datapath consumes it.
type compiledDirection struct {
	Flags   uint32
	Entries dirEntries
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

// compileDirection flattens a validated Direction into trie entries (of no pod yet:
// keys carry Ifindex 0).
func compileDirection(ns, admin, baseline []sourceRule, isolated bool) (compiledDirection, error) {
	var out compiledDirection
	if isolated {
		out.Flags |= flagIsolated
	}
	in := interner{vals: &out.Entries.vals, last: -1}
	add := func(t tier, rules []sourceRule, flag uint32) error {
		n := out.Entries.len()
		if err := flatten(&out.Entries, &in, t, rules); err != nil {
			return err
		}
		if out.Entries.len() > n {
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

// prefixNode gathers the rules whose CIDR or except is one prefix: runs of flatten's
// ruleOf, [cidr, except) and [except, end).
type prefixNode struct {
	key               prefixKey
	cidr, except, end int32
}

// prefixKey orders prefixes as flatten visits them: IPv4 first, then by address,
// then by length.
type prefixKey struct {
	v6     bool
	hi, lo uint64
	bits   uint8
}

// prefixUse is one CIDR or except of a rule.
type prefixUse struct {
	key    prefixKey
	rule   int32
	except bool
}

func newPrefixUse(p netip.Prefix, rule int32, except bool) prefixUse {
	a := p.Addr()
	u := prefixUse{rule: rule, except: except, key: prefixKey{v6: !a.Is4(), bits: uint8(p.Bits())}}
	if a.Is4() {
		b := a.As4()
		u.key.lo = uint64(binary.BigEndian.Uint32(b[:]))
	} else {
		b := a.As16()
		u.key.hi, u.key.lo = binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])
	}
	return u
}

func (k prefixKey) prefix() netip.Prefix {
	if !k.v6 {
		return netip.PrefixFrom(netip.AddrFrom4(k.addr4()), int(k.bits))
	}
	return netip.PrefixFrom(netip.AddrFrom16(k.addr6()), int(k.bits))
}

func (k prefixKey) addr4() (b [4]byte) {
	binary.BigEndian.PutUint32(b[:], uint32(k.lo))
	return b
}

func (k prefixKey) addr6() (b [16]byte) {
	binary.BigEndian.PutUint64(b[:8], k.hi)
	binary.BigEndian.PutUint64(b[8:], k.lo)
	return b
}

// contains reports whether prefix k contains prefix n.
func (k prefixKey) contains(n prefixKey) bool {
	if k.v6 != n.v6 || k.bits > n.bits {
		return false
	}
	if !k.v6 {
		return n.lo>>(32-k.bits) == k.lo>>(32-k.bits)
	}
	if k.bits <= 64 {
		return n.hi>>(64-k.bits) == k.hi>>(64-k.bits)
	}
	return n.hi == k.hi && n.lo>>(128-k.bits) == k.lo>>(128-k.bits)
}

func comparePrefixUse(a, b prefixUse) int {
	if a.key.v6 != b.key.v6 {
		if b.key.v6 {
			return -1
		}
		return 1
	}
	if c := cmp.Or(cmp.Compare(a.key.hi, b.key.hi), cmp.Compare(a.key.lo, b.key.lo), cmp.Compare(a.key.bits, b.key.bits)); c != 0 {
		return c
	}
	if a.except != b.except {
		if b.except {
			return -1
		}
		return 1
	}
	return cmp.Compare(a.rule, b.rule)
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
func flatten(out *dirEntries, in *interner, t tier, rules []sourceRule) error {
	if len(rules) == 0 {
		return nil
	}
	// Every CIDR and except, sorted by prefix (IPv4 first, then address, then
	// length: pre-order) and, per prefix, CIDRs before excepts, by rule. A node is a
	// run of one prefix; its rule lists are runs of ruleOf.
	count := len(rules)
	for i := range rules {
		count += len(rules[i].excepts)
	}
	uses := make([]prefixUse, 0, count)
	for i := range rules {
		uses = append(uses, newPrefixUse(rules[i].cidr, int32(i), false))
		for _, e := range rules[i].excepts {
			uses = append(uses, newPrefixUse(e, int32(i), true))
		}
	}
	slices.SortFunc(uses, comparePrefixUse)
	ruleOf := make([]int32, len(uses))
	pool := make([]prefixNode, 0, len(uses))
	for i := 0; i < len(uses); {
		n := prefixNode{key: uses[i].key, cidr: int32(i)}
		j := i
		for ; j < len(uses) && uses[j].key == n.key && !uses[j].except; j++ {
			ruleOf[j] = uses[j].rule
		}
		n.except, n.end = int32(j), int32(j)
		for ; j < len(uses) && uses[j].key == n.key; j++ {
			// A rule may except one prefix twice: keep it once.
			if r := uses[j].rule; n.end == n.except || ruleOf[n.end-1] != r {
				ruleOf[n.end] = r
				n.end++
			}
		}
		pool = append(pool, n)
		i = j
	}

	n6 := len(pool) - sort.Search(len(pool), func(i int) bool { return pool[i].key.v6 })
	out.k4, out.i4 = slices.Grow(out.k4, len(pool)-n6), slices.Grow(out.i4, len(pool)-n6)
	out.k6, out.i6 = slices.Grow(out.k6, n6), slices.Grow(out.i6, n6)
	excepted := make([]int32, len(rules)) // per rule: excepts of it on the stack
	var stack []stackNode
	var included []int
	var scratch []policyPortRule
	for ni := range pool {
		n := &pool[ni]
		for len(stack) > 0 {
			top := stack[len(stack)-1].node
			if top.key.contains(n.key) {
				break
			}
			for _, r := range ruleOf[top.except:top.end] {
				excepted[r]--
			}
			stack = stack[:len(stack)-1]
		}
		for _, r := range ruleOf[n.except:n.end] {
			excepted[r]++
		}
		stack = append(stack, stackNode{node: n})
		top := &stack[len(stack)-1]

		included = included[:0]
		for i := range stack {
			s := stack[i].node
			for _, r := range ruleOf[s.cidr:s.except] {
				if excepted[r] == 0 {
					included = append(included, int(r))
				}
			}
		}
		var err error
		if t == tierNamespaced {
			scratch, err = unionValue(&top.visible, rules, included, n.key, scratch)
		} else {
			slices.Sort(included) // rules are in priority order
			err = orderedValue(&top.visible, rules, included, n.key)
		}
		if err != nil {
			return err
		}
		parent := &emptyValue
		if len(stack) > 1 {
			parent = &stack[len(stack)-2].visible
		}
		if top.visible == *parent {
			continue
		}
		vi := in.intern(&top.visible)
		if !n.key.v6 {
			out.k4 = append(out.k4, policyLpmKey4{Prefixlen: 64 + uint32(n.key.bits), Tag: uint32(t), Addr: n.key.addr4()})
			out.i4 = append(out.i4, vi)
		} else {
			out.k6 = append(out.k6, policyLpmKey6{Prefixlen: 64 + uint32(n.key.bits), Tag: uint32(t), Addr: n.key.addr6()})
			out.i6 = append(out.i6, vi)
		}
	}
	return nil
}

var emptyValue policyRuleValue

func overflowErr(r *sourceRule, p prefixKey, need int) error {
	return invalidf(r.label, "ports: %s needs %d port rules together with the other rules covering it, a map value holds %d", p.prefix(), need, maxPortRules)
}

// orderedValue builds a tier value: every port rule of the included rules in priority
// order; the datapath takes the first match. Exact duplicates of an earlier entry and
// everything after an all-traffic entry can never match first and are dropped.
func orderedValue(v *policyRuleValue, rules []sourceRule, included []int, p prefixKey) error {
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
func unionValue(v *policyRuleValue, rules []sourceRule, included []int, p prefixKey, buf []policyPortRule) ([]policyPortRule, error) {
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
