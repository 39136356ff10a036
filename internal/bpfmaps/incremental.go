package bpfmaps

import (
	"encoding/binary"
	"slices"
	"sort"
)

// Incremental compile. The shape the controller writes most is an isolated direction
// whose allow rules are many host rules (a /32 or /128 CIDR, no except: the pod
// peers), a few at a time added or removed, and few other ("broad") rules. flatten
// emits an entry for a prefix iff its value differs from its nearest enclosing
// prefix's, and a host prefix h contains no other prefix and is contained only in
// broad ones, so host rules decide h's entry and no other:
//
//   - value(h) is the union of the ports of the host rules at h and of the broad
//     rules matching address h, that is of the broad rules' value at the longest
//     broad prefix containing h (h itself included, if it is a broad prefix too);
//   - h's enclosing prefix is the longest broad prefix strictly containing h;
//   - with no host rule at h, h's entry is the broad rules' own entry at h, if any.
//
// Both broad values are one lookup in the broad rules' own compile (broadIndex): by
// flatten's argument, the longest of its entries containing an address carries the
// value of the longest broad prefix containing it. So a change to the host rules of a
// few prefixes recomputes those prefixes' entries (deriveDirection); anything else —
// broad rules, tiers, isolation, sets added, removed or reordered, many changes, a
// value over its size — compiles in full, which stays the reference.

// incState is what a compiled direction keeps to be compiled from incrementally.
type incState struct {
	rest  uint64   // hash of the direction but its AllowSets (directionHash)
	sets  []setRef // its AllowSets, in order
	broad *broadIndex
}

// setRef is what a compile remembers of a RuleSet: a later set built from it names
// its id; one built again with the same rules has its hash.
type setRef struct {
	id, hash uint64
}

// broadIndex is the namespaced entries of a direction's broad rules alone (its Allow
// and its sets' rules but the host rules), by prefix.
type broadIndex struct {
	vals map[prefixKey]policyRuleValue
	lens [2][]uint8 // prefix lengths of the entries, per family (0 IPv4), longest first
}

// newIncState builds the state of an isolated direction with AllowSets, whose Allow
// rules validated are allow (the first of the namespaced sources).
func newIncState(p *DirectionPolicy, allow []sourceRule, rest uint64) (*incState, error) {
	rules := slices.Clip(allow)
	for _, s := range p.AllowSets {
		for _, i := range s.broadIdx {
			rules = append(rules, s.src[i])
		}
	}
	b, err := newBroadIndex(rules)
	if err != nil {
		return nil, err
	}
	return newIncStateOf(p, rest, b), nil
}

func newIncStateOf(p *DirectionPolicy, rest uint64, b *broadIndex) *incState {
	st := &incState{rest: rest, broad: b}
	for _, s := range p.AllowSets {
		st.sets = append(st.sets, setRef{s.id, s.hash})
	}
	return st
}

// newBroadIndex compiles broad rules into a broadIndex.
func newBroadIndex(rules []sourceRule) (*broadIndex, error) {
	var e dirEntries
	in := interner{vals: &e.vals, last: -1}
	if err := flatten(&e, &in, tierNamespaced, rules); err != nil {
		return nil, err
	}
	b := &broadIndex{vals: make(map[prefixKey]policyRuleValue, e.len())}
	add := func(k prefixKey, v uint32) {
		b.vals[k] = e.vals[v]
		fam := 0
		if k.v6 {
			fam = 1
		}
		if !slices.Contains(b.lens[fam], k.bits) {
			b.lens[fam] = append(b.lens[fam], k.bits)
		}
	}
	for i, k := range e.k4 {
		add(keyOf4(&k), e.i4[i])
	}
	for i, k := range e.k6 {
		add(keyOf6(&k), e.i6[i])
	}
	for fam := range b.lens {
		slices.SortFunc(b.lens[fam], func(a, b uint8) int { return int(b) - int(a) })
	}
	return b, nil
}

// precompiled returns the compile of p built with its only set (RuleSet.pre) when p
// is that set alone: isolated, no Allow or tier rules (an isolated direction does not
// compile baseline rules, but they are validated: a bad one rejects the policy).
// nil otherwise.
func precompiled(p *DirectionPolicy) *precompile {
	if !p.Isolated || len(p.Allow)+len(p.Admin)+len(p.Baseline) > 0 || len(p.AllowSets) != 1 {
		return nil
	}
	return p.AllowSets[0].pre
}

// keyOf4 and keyOf6 are the prefix of a trie key (its tier aside).
func keyOf4(k *policyLpmKey4) prefixKey {
	return prefixKey{lo: uint64(binary.BigEndian.Uint32(k.Addr[:])), bits: uint8(k.Prefixlen - 64)}
}

func keyOf6(k *policyLpmKey6) prefixKey {
	return prefixKey{v6: true, hi: binary.BigEndian.Uint64(k.Addr[:8]), lo: binary.BigEndian.Uint64(k.Addr[8:]), bits: uint8(k.Prefixlen - 64)}
}

// lookup returns the value of the longest entry containing host prefix h (h itself
// only if exact), the empty value if none.
func (b *broadIndex) lookup(h prefixKey, exact bool) policyRuleValue {
	fam := 0
	if h.v6 {
		fam = 1
	}
	for _, bits := range b.lens[fam] {
		if bits == h.bits && !exact {
			continue
		}
		if v, ok := b.vals[h.masked(bits)]; ok {
			return v
		}
	}
	return emptyValue
}

// masked returns the prefix of k's address of length bits (≤ k.bits).
func (k prefixKey) masked(bits uint8) prefixKey {
	m := prefixKey{v6: k.v6, bits: bits, hi: k.hi, lo: k.lo}
	switch {
	case !k.v6:
		m.lo = k.lo >> (32 - bits) << (32 - bits)
	case bits <= 64:
		m.hi, m.lo = k.hi>>(64-bits)<<(64-bits), 0
		if bits == 0 {
			m.hi = 0
		}
	default:
		m.lo = k.lo >> (128 - bits) << (128 - bits)
	}
	return m
}

// keyChange is one entry a derived compile changes: at is where key is, or would be
// inserted, in the old entries.
type keyChange[K any] struct {
	key           K
	at            int
	present, keep bool // present: the old entries hold key; keep: the new ones do
	val           uint32
}

// deriveDirection compiles p, whose hashes are rest and full (directionHash), from s,
// the compile a pod holds, when only host rules of p's sets changed since s; the
// result's fromDelta turns s's entries into its own. nil: compile p in full.
func deriveDirection(s *sharedDirection, p *DirectionPolicy, rest, full uint64) *sharedDirection {
	inc := s.inc
	if inc == nil || inc.rest != rest || len(p.AllowSets) != len(inc.sets) {
		return nil
	}
	old := &s.comp.Entries
	var changed []prefixKey
	for i, set := range p.AllowSets {
		if set.id == inc.sets[i].id || set.hash == inc.sets[i].hash {
			continue
		}
		if set.from != inc.sets[i].id {
			return nil
		}
		changed = append(changed, set.changed...)
	}
	// Many changes cost a full compile's work anyway; many values (each derive adds
	// its new ones without compacting) are compacted by one.
	if len(changed) > maxSetChanges(old.len()) || len(old.vals) > 2*old.len()+64 {
		return nil
	}
	slices.SortFunc(changed, compareKeys)
	changed = slices.Compact(changed)

	next := &sharedDirection{hash: full, comp: compiledDirection{Flags: s.comp.Flags}}
	n := &next.comp.Entries
	n.vals = slices.Clip(old.vals) // appending copies: s's values stay as they are
	intern := func(v *policyRuleValue) uint32 {
		if len(n.vals) <= 64 {
			if i := slices.Index(n.vals, *v); i >= 0 {
				return uint32(i)
			}
		}
		n.vals = append(n.vals, *v)
		return uint32(len(n.vals) - 1)
	}
	var ch4 []keyChange[policyLpmKey4]
	var ch6 []keyChange[policyLpmKey6]
	var ports []policyPortRule
	for _, h := range changed {
		ports = ports[:0]
		for _, set := range p.AllowSets {
			ports = set.hostPorts(h, ports)
		}
		var v policyRuleValue
		keep := false
		if len(ports) == 0 {
			v, keep = inc.broad.vals[h]
		} else {
			whole := inc.broad.lookup(h, true)
			merged := mergeRanges(append(ports, whole.entries()...))
			if len(merged) > maxPortRules {
				return nil // the full compile names the rule
			}
			v.Count = uint32(copy(v.Rules[:], merged))
			keep = v != inc.broad.lookup(h, false)
		}
		if !h.v6 {
			k := policyLpmKey4{Prefixlen: 64 + uint32(h.bits), Tag: uint32(tierNamespaced), Addr: h.addr4()}
			at, present := slices.BinarySearchFunc(old.k4, k, func(a, b policyLpmKey4) int { return compareKey4(&a, &b) })
			if present && keep && old.vals[old.i4[at]] == v || !present && !keep {
				continue
			}
			c := keyChange[policyLpmKey4]{key: k, at: at, present: present, keep: keep}
			if keep {
				c.val = intern(&v)
			}
			ch4 = append(ch4, c)
			continue
		}
		k := policyLpmKey6{Prefixlen: 64 + uint32(h.bits), Tag: uint32(tierNamespaced), Addr: h.addr6()}
		at, present := slices.BinarySearchFunc(old.k6, k, func(a, b policyLpmKey6) int { return compareKey6(&a, &b) })
		if present && keep && old.vals[old.i6[at]] == v || !present && !keep {
			continue
		}
		c := keyChange[policyLpmKey6]{key: k, at: at, present: present, keep: keep}
		if keep {
			c.val = intern(&v)
		}
		ch6 = append(ch6, c)
	}
	// The compile s was derived from, if no pod holds it any more, is held by s
	// alone (for pods moving from it, and none will): its arrays take the new
	// entries, which saves allocating and clearing them.
	var buf dirEntries
	if f := s.from; f != nil && f.refs == 0 && !f.borrowed {
		buf = f.comp.Entries
		f.comp.Entries = dirEntries{}
		s.from, s.fromDelta = nil, nil
	}
	d := entryDelta{old: old, next: n}
	n.k4, n.i4, d.put4, d.del4, d.add4 = applyChanges(old.k4, old.i4, ch4, buf.k4, buf.i4)
	n.k6, n.i6, d.put6, d.del6, d.add6 = applyChanges(old.k6, old.i6, ch6, buf.k6, buf.i6)
	// Isolated: the namespaced entries are the last (no baseline entries).
	ns := len(n.k4) - sort.Search(len(n.k4), func(i int) bool { return tierRank(n.k4[i].Tag) >= tierRank(uint32(tierNamespaced)) }) +
		len(n.k6) - sort.Search(len(n.k6), func(i int) bool { return tierRank(n.k6[i].Tag) >= tierRank(uint32(tierNamespaced)) })
	if next.comp.Flags &^= flagNamespaced; ns > 0 {
		next.comp.Flags |= flagNamespaced
	}
	next.inc = &incState{rest: rest, broad: inc.broad}
	for _, set := range p.AllowSets {
		next.inc.sets = append(next.inc.sets, setRef{set.id, set.hash})
	}
	next.from, next.fromDelta = s, &d
	return next
}

// applyChanges returns the entries keys and values with the changes (sorted by key)
// applied, in bufK and bufV if they are large enough, and the delta's puts (into the
// result) and deletes (into keys), and how many puts are of new keys. Copying the
// unchanged runs is the only work that grows with the entries.
func applyChanges[K any](keys []K, vals []uint32, ch []keyChange[K], bufK []K, bufV []uint32) (nk []K, nv []uint32, put, del []int32, adds int) {
	if len(keys) == 0 && len(ch) == 0 {
		return nil, nil, nil, nil, 0
	}
	// An unchanged family is copied too: no two compiles share arrays, so a dead
	// one's can be reused (deriveDirection).
	if size := len(keys) + len(ch); cap(bufK) >= size && cap(bufV) >= size {
		nk, nv = bufK[:0], bufV[:0]
	} else {
		nk, nv = make([]K, 0, size+size/64), make([]uint32, 0, size+size/64)
	}
	pos := 0
	for _, c := range ch {
		nk, nv = append(nk, keys[pos:c.at]...), append(nv, vals[pos:c.at]...)
		pos = c.at
		if c.present {
			pos++
			if !c.keep {
				del = append(del, int32(c.at))
				continue
			}
		} else {
			adds++
		}
		put = append(put, int32(len(nk)))
		nk, nv = append(nk, c.key), append(nv, c.val)
	}
	return append(nk, keys[pos:]...), append(nv, vals[pos:]...), put, del, adds
}
