package bpfmaps

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash"
	"math/bits"
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
	set   string // the RuleSet's name, for its rules
}

func (l ruleLabel) String() string {
	if l.set != "" {
		return fmt.Sprintf("%s rule %d of %s", l.dir, l.index, l.set)
	}
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

// validateDirection checks every rule of d; the error names the first bad rule. The
// rules of d's AllowSets were checked when the sets were built: they follow Allow's.
func validateDirection(dir Direction, d *DirectionPolicy) (ns, admin, baseline []sourceRule, err error) {
	nsLen := len(d.Allow)
	for _, s := range d.AllowSets {
		nsLen += len(s.src)
	}
	ns = make([]sourceRule, 0, nsLen)
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
	for _, s := range d.AllowSets {
		ns = append(ns, s.src...)
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

// hashDirection returns a content hash of a direction policy but its AllowSets
// (directionHash adds them): equal hashes mean the datapath would behave identically.
// Values are encoded as given (prefixes masked), so an invalid value never hashes like
// a valid one.
func hashDirection(d *DirectionPolicy) uint64 {
	var e contentEncoder
	e.start()
	e.buf = append(e.buf, 1) // encoding version
	if d.Isolated {
		e.buf = append(e.buf, 1)
	} else {
		e.buf = append(e.buf, 0)
	}
	e.buf = binary.AppendUvarint(e.buf, uint64(len(d.Allow)))
	for i := range d.Allow {
		e.rule(&d.Allow[i])
	}
	for _, tier := range [][]TierRule{d.Admin, d.Baseline} {
		e.buf = binary.AppendUvarint(e.buf, uint64(len(tier)))
		for i := range tier {
			e.buf = binary.BigEndian.AppendUint32(e.buf, uint32(tier[i].Priority))
			e.buf = append(e.buf, byte(tier[i].Action))
			e.rule(&tier[i].Rule)
		}
	}
	return e.sum()
}

// directionHash returns the hash of d without its AllowSets (rest) and with them
// (full): the sets count by their hashes, so it costs their number, not their rules.
// Without sets both are hashDirection's.
func directionHash(d *DirectionPolicy) (rest, full uint64) {
	rest = hashDirection(d)
	if len(d.AllowSets) == 0 {
		return rest, rest
	}
	var e contentEncoder
	e.start()
	e.buf = append(e.buf, 2) // a distinct encoding: rest's hash, then the sets'
	e.buf = binary.BigEndian.AppendUint64(e.buf, rest)
	e.buf = binary.AppendUvarint(e.buf, uint64(len(d.AllowSets)))
	for _, s := range d.AllowSets {
		e.buf = binary.BigEndian.AppendUint64(e.buf, s.hash)
		e.flush()
	}
	return rest, e.sum()
}

// contentEncoder hashes policy content (SHA-256, the first 8 bytes), buffered.
type contentEncoder struct {
	h   hash.Hash
	buf []byte
}

func (e *contentEncoder) start() {
	e.h = sha256.New()
	e.buf = make([]byte, 0, 512)
}

func (e *contentEncoder) flush() {
	if len(e.buf) > 256 {
		e.h.Write(e.buf)
		e.buf = e.buf[:0]
	}
}

func (e *contentEncoder) prefix(p netip.Prefix) {
	a := p.Masked().Addr().As16()
	e.buf = append(e.buf, a[:]...)
	e.buf = append(e.buf, byte(p.Bits()))
	if p.Addr().Is4() {
		e.buf = append(e.buf, 4)
	} else {
		e.buf = append(e.buf, 6)
	}
}

func (e *contentEncoder) rule(r *Rule) {
	e.prefix(r.CIDR)
	e.buf = binary.AppendUvarint(e.buf, uint64(len(r.Except)))
	for _, x := range r.Except {
		e.prefix(x)
		e.flush()
	}
	e.buf = binary.AppendUvarint(e.buf, uint64(len(r.Ports)))
	for _, p := range r.Ports {
		e.buf = append(e.buf, byte(p.Protocol))
		e.buf = binary.BigEndian.AppendUint32(e.buf, uint32(p.Port))
		e.buf = binary.BigEndian.AppendUint32(e.buf, uint32(p.EndPort))
		e.flush()
	}
	e.flush()
}

func (e *contentEncoder) sum() uint64 {
	e.h.Write(e.buf)
	var sum [sha256.Size]byte
	return binary.LittleEndian.Uint64(e.h.Sum(sum[:0]))
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
//
// The rules covering the visited prefix (CIDR on the stack, no except of theirs on
// it) are kept as a set, changed as prefixes are pushed and popped: each CIDR and
// except changes it once each way, so keeping it is linear in the CIDRs and excepts
// (times their port rules). A prefix's value is built again only when the set's
// change may change it (see unionCover and orderedCover), otherwise it is its
// parent's: a broad CIDR that many rules share, with an except of each, costs
// O(rules), not O(rules²) (BenchmarkCompileExcepts). Building a value costs the
// distinct port rules of the set (namespaced) or a scan of the set in priority order
// up to the all-traffic entry (first-match tiers); prefixes whose change forces many
// such builds over a large set remain the costly case.
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
	onStack := make([]bool, len(rules))   // per rule: its CIDR is on the stack
	var cov cover = newOrderedCover(rules)
	if t == tierNamespaced {
		cov = newUnionCover(rules)
	}
	// covering lists the rules covering the top of the stack in stack order, CIDRs
	// by rule: the order an overflow error's rule is chosen in. Only errors need it.
	covering := func(stack []stackNode) []int {
		var included []int
		for i := range stack {
			s := stack[i].node
			for _, r := range ruleOf[s.cidr:s.except] {
				if excepted[r] == 0 {
					included = append(included, int(r))
				}
			}
		}
		return included
	}
	var root stackNode // the parent of a top-level prefix: the empty value
	var stack []stackNode
	for ni := range pool {
		n := &pool[ni]
		for len(stack) > 0 {
			top := stack[len(stack)-1].node
			if top.key.contains(n.key) {
				break
			}
			// Undo top's changes, in reverse: the set becomes its parent's again.
			for _, r := range ruleOf[top.except:top.end] {
				if excepted[r]--; excepted[r] == 0 && onStack[r] {
					cov.include(r, nil)
				}
			}
			for _, r := range ruleOf[top.cidr:top.except] {
				if onStack[r] = false; excepted[r] == 0 {
					cov.exclude(r, nil)
				}
			}
			stack = stack[:len(stack)-1]
		}
		parent := &root
		if len(stack) > 0 {
			parent = &stack[len(stack)-1]
		}
		cov.clean()
		for _, r := range ruleOf[n.cidr:n.except] {
			if onStack[r] = true; excepted[r] == 0 {
				cov.include(r, parent)
			}
		}
		for _, r := range ruleOf[n.except:n.end] {
			if excepted[r]++; excepted[r] == 1 && onStack[r] {
				cov.exclude(r, parent)
			}
		}
		if !cov.dirty() {
			stack = append(stack, *parent) // the same value: no entry
			stack[len(stack)-1].node = n
			continue
		}
		stack = append(stack, stackNode{node: n})
		top := &stack[len(stack)-1]
		if need, err := cov.value(top, n.key); err != nil {
			return err
		} else if need > 0 {
			return unionOverflowErr(rules, covering(stack), n.key, need)
		}
		parentValue := &emptyValue
		if len(stack) > 1 {
			parentValue = &stack[len(stack)-2].visible
		}
		if top.visible == *parentValue {
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

// stackNode is a prefix on the chain of enclosing prefixes, with its value and, in a
// first-match tier, the rule each of the value's port rules comes from.
type stackNode struct {
	node    *prefixNode
	visible policyRuleValue
	from    [maxPortRules]int32
}

// cover is the set of rules covering the visited prefix, and how it builds that
// prefix's value.
type cover interface {
	// include and exclude add rule r to the set and remove it. With parent (the
	// enclosing prefix, whose value is the set's value before this prefix's
	// changes), they note whether the change may change the value; without, they
	// undo a change.
	include(r int32, parent *stackNode)
	exclude(r int32, parent *stackNode)
	// clean forgets the changes noted; dirty reports whether one was.
	clean()
	dirty() bool
	// value builds the set's value into top, a zero stackNode but for its
	// prefix. need > 0: the value would need that many port rules, more than it
	// holds, and the caller names the rule.
	value(top *stackNode, p prefixKey) (need int, err error)
}

func isAllTraffic(e policyPortRule) bool { return e.Proto == uint8(ProtocolAny) && e.Port == 0 }

// unionCover is the namespaced tier's set: the union of the included rules' ports is
// all a value depends on, so it keeps how many included port rules allow all traffic
// and, per distinct (protocol, port, end port), how many included port rules have
// it. A change that makes no count reach or leave zero leaves the value as it is.
type unionCover struct {
	rules   []sourceRule
	items   []unionItem // the distinct port rules included, ascending
	all     int32
	changed bool
}

// unionItem is a distinct port rule (portItem) and how many included port rules
// have it.
type unionItem struct {
	key   uint64
	count int32
}

func newUnionCover(rules []sourceRule) *unionCover { return &unionCover{rules: rules} }

// portItem orders port rules by protocol, port, end port, as mergeRanges sorts them.
func portItem(e policyPortRule) uint64 {
	return uint64(e.Proto)<<32 | uint64(e.Port)<<16 | uint64(e.EndPort)
}

// find returns where k is in u.items or would be inserted.
func (u *unionCover) find(k uint64) (int, bool) {
	lo, hi := 0, len(u.items)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if u.items[m].key < k {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo, lo < len(u.items) && u.items[lo].key == k
}

func (u *unionCover) include(r int32, _ *stackNode) {
	for _, e := range u.rules[r].ports {
		if isAllTraffic(e) {
			if u.all++; u.all == 1 {
				u.changed = true
			}
			continue
		}
		k := portItem(e)
		i, found := u.find(k)
		if found {
			u.items[i].count++
			continue
		}
		u.items = slices.Insert(u.items, i, unionItem{key: k, count: 1})
		u.changed = true
	}
}

func (u *unionCover) exclude(r int32, _ *stackNode) {
	for _, e := range u.rules[r].ports {
		if isAllTraffic(e) {
			if u.all--; u.all == 0 {
				u.changed = true
			}
			continue
		}
		i, _ := u.find(portItem(e)) // included, so found
		if u.items[i].count--; u.items[i].count == 0 {
			u.items = append(u.items[:i], u.items[i+1:]...)
			u.changed = true
		}
	}
}

func (u *unionCover) clean()      { u.changed = false }
func (u *unionCover) dirty() bool { return u.changed }

// value: the union of the included rules' port rules, ranges of one protocol merged,
// sorted by protocol and port (as mergeRanges makes it).
func (u *unionCover) value(top *stackNode, _ prefixKey) (int, error) {
	v := &top.visible
	if u.all > 0 {
		v.Rules[0] = policyPortRule{Proto: uint8(ProtocolAny), EndPort: allPortsEndPort, Action: uint8(ActionAccept)}
		v.Count = 1
		return 0, nil
	}
	// items are sorted as mergeRanges sorts: merge them in one pass, counting the
	// ranges past the value's size.
	n := 0
	var last policyPortRule
	for _, it := range u.items {
		k := it.key
		e := policyPortRule{Proto: uint8(k >> 32), Port: uint16(k >> 16), EndPort: uint16(k), Action: uint8(ActionAccept)}
		if n > 0 && last.Proto == e.Proto && uint32(e.Port) <= uint32(last.EndPort)+1 {
			last.EndPort = max(last.EndPort, e.EndPort)
			continue
		}
		if n > 0 && n <= maxPortRules {
			v.Rules[n-1] = last
		}
		last = e
		n++
	}
	if n > maxPortRules {
		*v = policyRuleValue{}
		return n, nil
	}
	if n > 0 {
		v.Rules[n-1] = last
	}
	v.Count = uint32(n)
	return 0, nil
}

// unionOverflowErr names the rule whose ports pushed the union of the included
// rules' ports (in their order) over a value's limit, at prefix p, where the union
// needs need port rules: the union of the rules so far, merged again with each
// rule's ports, stays at most maxPortRules until then. Linear in the rules' ports.
func unionOverflowErr(rules []sourceRule, included []int, p prefixKey, need int) error {
	var acc []policyPortRule
	for _, ri := range included {
		acc = mergeRanges(append(acc, rules[ri].ports...))
		if len(acc) > maxPortRules {
			return overflowErr(&rules[ri], p, need)
		}
	}
	return overflowErr(&rules[included[len(included)-1]], p, need)
}

// mergeRanges returns the union of port entries as few accept entries: one
// all-traffic entry if any allows all traffic, else ranges of one protocol merged
// where they overlap or touch, sorted by protocol and port. It works in all's array.
// The union of unions is the union of all: merging the merged entries of some rules
// with another rule's entries gives the merged entries of them all.
func mergeRanges(all []policyPortRule) []policyPortRule {
	for i := range all {
		if isAllTraffic(all[i]) {
			return append(all[:0], policyPortRule{Proto: uint8(ProtocolAny), EndPort: allPortsEndPort, Action: uint8(ActionAccept)})
		}
		all[i].Action = uint8(ActionAccept)
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

// orderedCover is a first-match tier's set, the included rules as a bitset over
// their priority order. A value is every port rule of the included rules in
// priority order, exact duplicates of an earlier one (same protocol and ports) and
// everything after an all-traffic one dropped: the datapath takes the first match.
// Each of the value's port rules comes from one rule (stackNode.from). So excluding
// a rule changes the value only if some port rule of it comes from that rule, and
// including one only if it is before the all-traffic entry and has a port rule
// that no rule before it gave.
type orderedCover struct {
	rules   []sourceRule
	in      []uint64
	changed bool
}

func newOrderedCover(rules []sourceRule) *orderedCover {
	return &orderedCover{rules: rules, in: make([]uint64, (len(rules)+63)/64)}
}

func (o *orderedCover) include(r int32, parent *stackNode) {
	o.in[r>>6] |= 1 << (r & 63)
	if parent != nil && !o.changed && !o.redundant(r, parent) {
		o.changed = true
	}
}

func (o *orderedCover) exclude(r int32, parent *stackNode) {
	o.in[r>>6] &^= 1 << (r & 63)
	if parent != nil && !o.changed && slices.Contains(parent.from[:parent.visible.Count], r) {
		o.changed = true
	}
}

// redundant reports whether including rule r leaves parent's value as it is.
func (o *orderedCover) redundant(r int32, parent *stackNode) bool {
	v := &parent.visible
	if n := v.Count; n > 0 && isAllTraffic(v.Rules[n-1]) && parent.from[n-1] < r {
		return true // r comes after the all-traffic entry
	}
	for _, e := range o.rules[r].ports {
		found := false
		for i, x := range v.entries() {
			if x.Proto == e.Proto && x.Port == e.Port && x.EndPort == e.EndPort && parent.from[i] < r {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func (o *orderedCover) clean()      { o.changed = false }
func (o *orderedCover) dirty() bool { return o.changed }

func (o *orderedCover) value(top *stackNode, p prefixKey) (int, error) {
	v := &top.visible
	for w, word := range o.in {
		for ; word != 0; word &= word - 1 {
			ri := w*64 + bits.TrailingZeros64(word)
			for _, e := range o.rules[ri].ports {
				if slices.ContainsFunc(v.entries(), func(x policyPortRule) bool {
					return x.Proto == e.Proto && x.Port == e.Port && x.EndPort == e.EndPort
				}) {
					continue
				}
				if v.Count == maxPortRules {
					return 0, overflowErr(&o.rules[ri], p, maxPortRules+1)
				}
				e.Rule = uint16(min(ri+1, maxRuleID))
				v.Rules[v.Count] = e
				top.from[v.Count] = int32(ri)
				v.Count++
				if isAllTraffic(e) {
					return 0, nil
				}
			}
		}
	}
	return 0, nil
}
