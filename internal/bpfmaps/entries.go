package bpfmaps

import (
	"bytes"
	"cmp"
	"slices"
	"unsafe"
)

// dirEntries is a direction's compiled entries as user space keeps them between
// commits: keys without their group and entry set (Group 0, Tag the tier only), so
// pods with the same direction policy share them; in compile order
// (compareKey4, compareKey6), and values interned: entry i's value is vals[i4[i]]. A
// direction's entries share few distinct values, so an entry costs its key and 4
// bytes (20 bytes for IPv4, 32 for IPv6) instead of key and 200-byte value.
type dirEntries struct {
	k4   []policyLpmKey4
	i4   []uint32
	k6   []policyLpmKey6
	i6   []uint32
	vals []policyRuleValue
}

func (e *dirEntries) len() int { return len(e.k4) + len(e.k6) }

// bytes is the memory e holds (its slices' capacity).
func (e *dirEntries) bytes() int {
	return cap(e.k4)*int(unsafe.Sizeof(policyLpmKey4{})) + cap(e.k6)*int(unsafe.Sizeof(policyLpmKey6{})) +
		4*(cap(e.i4)+cap(e.i6)) + cap(e.vals)*int(unsafe.Sizeof(policyRuleValue{}))
}

// tierRank orders tiers as compileDirection emits them: admin, then namespaced or
// baseline.
func tierRank(tag uint32) uint32 { return [4]uint32{1, 0, 2, 3}[tag&3] }

func compareKey4(a, b *policyLpmKey4) int {
	return cmp.Or(cmp.Compare(tierRank(a.Tag), tierRank(b.Tag)), bytes.Compare(a.Addr[:], b.Addr[:]), cmp.Compare(a.Prefixlen, b.Prefixlen))
}

func compareKey6(a, b *policyLpmKey6) int {
	return cmp.Or(cmp.Compare(tierRank(a.Tag), tierRank(b.Tag)), bytes.Compare(a.Addr[:], b.Addr[:]), cmp.Compare(a.Prefixlen, b.Prefixlen))
}

// interner assigns each distinct value an index in vals.
type interner struct {
	vals  *[]policyRuleValue
	index map[policyRuleValue]uint32
	last  int
}

func (in *interner) intern(v *policyRuleValue) uint32 {
	if in.last >= 0 && (*in.vals)[in.last] == *v { // neighbours mostly share a value
		return uint32(in.last)
	}
	i, ok := in.index[*v]
	if !ok {
		if in.index == nil {
			in.index = map[policyRuleValue]uint32{}
		}
		i = uint32(len(*in.vals))
		*in.vals = append(*in.vals, *v)
		in.index[*v] = i
	}
	in.last = int(i)
	return i
}

// entriesFromTrie keeps entries read back from a trie (tagged keys, any order).
func entriesFromTrie(k4 []policyLpmKey4, v4 []policyRuleValue, k6 []policyLpmKey6, v6 []policyRuleValue) dirEntries {
	var out dirEntries
	in := interner{vals: &out.vals, last: -1}
	order := func(n int, compare func(a, b int) int) []int {
		o := make([]int, n)
		for i := range o {
			o[i] = i
		}
		slices.SortFunc(o, compare)
		return o
	}
	for _, i := range order(len(k4), func(a, b int) int { return compareKey4(&k4[a], &k4[b]) }) {
		k := k4[i]
		k.Group, k.Tag = 0, uint32(tagTier(k.Tag))
		out.k4 = append(out.k4, k)
		out.i4 = append(out.i4, in.intern(&v4[i]))
	}
	for _, i := range order(len(k6), func(a, b int) int { return compareKey6(&k6[a], &k6[b]) }) {
		k := k6[i]
		k.Group, k.Tag = 0, uint32(tagTier(k.Tag))
		out.k6 = append(out.k6, k)
		out.i6 = append(out.i6, in.intern(&v6[i]))
	}
	return out
}

// entryDelta turns one entry set into another: puts (keys the old set lacks, or
// whose value changed: indices into next) and deletes (indices into old).
type entryDelta struct {
	old, next  *dirEntries
	put4, del4 []int32
	put6, del6 []int32
	add4, add6 int // puts of keys the old set lacks
}

func (d *entryDelta) size() int { return len(d.put4) + len(d.del4) + len(d.put6) + len(d.del6) }

// growth is how many entries applying d adds to a set, per family (0 IPv4, 1 IPv6).
func (d *entryDelta) growth(fam int) int {
	if fam == 0 {
		return d.add4 - len(d.del4)
	}
	return d.add6 - len(d.del6)
}

// fullDelta writes every entry of next into an empty set.
func fullDelta(next *dirEntries) entryDelta {
	d := entryDelta{old: &dirEntries{}, next: next, put4: make([]int32, len(next.k4)), put6: make([]int32, len(next.k6))}
	for i := range d.put4 {
		d.put4[i] = int32(i)
	}
	for i := range d.put6 {
		d.put6[i] = int32(i)
	}
	d.add4, d.add6 = len(d.put4), len(d.put6)
	return d
}

// diffEntries returns the delta from old to next: one merge of the sorted keys.
func diffEntries(old, next *dirEntries) entryDelta {
	// same[j] is the index in old.vals of next.vals[j], or -1.
	same := make([]int, len(next.vals))
	var oldIndex map[policyRuleValue]int
	if len(old.vals)*len(next.vals) > 256 {
		oldIndex = make(map[policyRuleValue]int, len(old.vals))
		for i := range old.vals {
			oldIndex[old.vals[i]] = i
		}
	}
	for j := range next.vals {
		same[j] = -1
		if oldIndex != nil {
			if i, ok := oldIndex[next.vals[j]]; ok {
				same[j] = i
			}
			continue
		}
		for i := range old.vals {
			if old.vals[i] == next.vals[j] {
				same[j] = i
				break
			}
		}
	}
	d := entryDelta{old: old, next: next}
	d.put4, d.del4, d.add4 = diffFamily(old.k4, old.i4, next.k4, next.i4, same, compareKey4)
	d.put6, d.del6, d.add6 = diffFamily(old.k6, old.i6, next.k6, next.i6, same, compareKey6)
	return d
}

func diffFamily[K any](oldK []K, oldI []uint32, newK []K, newI []uint32, same []int,
	compare func(a, b *K) int) (put, del []int32, adds int) {
	i, j := 0, 0
	for i < len(oldK) || j < len(newK) {
		var c int
		switch {
		case i == len(oldK):
			c = 1
		case j == len(newK):
			c = -1
		default:
			c = compare(&oldK[i], &newK[j])
		}
		switch {
		case c < 0:
			del = append(del, int32(i))
			i++
		case c > 0:
			put = append(put, int32(j))
			adds++
			j++
		default:
			if same[newI[j]] != int(oldI[i]) {
				put = append(put, int32(j))
			}
			i++
			j++
		}
	}
	return put, del, adds
}

// tagKey4 returns a key of a group's entry set.
func tagKey4(k policyLpmKey4, group, set uint32) policyLpmKey4 {
	k.Group, k.Tag = group, entryTag(set, tagTier(k.Tag))
	return k
}

func tagKey6(k policyLpmKey6, group, set uint32) policyLpmKey6 {
	k.Group, k.Tag = group, entryTag(set, tagTier(k.Tag))
	return k
}

// tagKeys4 returns the keys of pod ifindex's entry set.
func tagKeys4(keys []policyLpmKey4, group, set uint32) []policyLpmKey4 {
	out := make([]policyLpmKey4, len(keys))
	for i, k := range keys {
		out[i] = tagKey4(k, group, set)
	}
	return out
}

func tagKeys6(keys []policyLpmKey6, group, set uint32) []policyLpmKey6 {
	out := make([]policyLpmKey6, len(keys))
	for i, k := range keys {
		out[i] = tagKey6(k, group, set)
	}
	return out
}

// equal reports whether e and o hold the same entries.
func (e *dirEntries) equal(o *dirEntries) bool {
	if !slices.Equal(e.k4, o.k4) || !slices.Equal(e.k6, o.k6) {
		return false
	}
	for i := range e.i4 {
		if e.vals[e.i4[i]] != o.vals[o.i4[i]] {
			return false
		}
	}
	for i := range e.i6 {
		if e.vals[e.i6[i]] != o.vals[o.i6[i]] {
			return false
		}
	}
	return true
}
