package bpfmaps

import (
	"cmp"
	"encoding/binary"
	"slices"
	"sync/atomic"
)

// RuleSet is part of a direction's namespaced allow rules, typically one object's,
// validated and hashed once when built (outside the dataplane's lock) and immutable
// after: a commit reads its hash and validated rules instead of checking and hashing
// them again. Build it with NewRuleSet; put it in DirectionPolicy.AllowSets.
type RuleSet struct {
	id    uint64 // unique in this process: a later set's from names it
	rules []Rule // as given: Verdict reads them
	src   []sourceRule
	hash  uint64
	// hostKeys are the prefixes of the host rules (a /32 or /128 CIDR, no except: the
	// controller's pod peers), sorted; hosts their indices in src, in the same order,
	// ties by ports.
	hostKeys []prefixKey
	hosts    []int32
	broadIdx []int32 // the other rules' indices in src
	broad    uint64  // their hash, in order
	// from is the id of the set this one was built from (NewRuleSet's prev) when they
	// differ in few host rules and nothing else; changed then lists the prefixes of
	// those rules, sorted, once each. 0 otherwise.
	from    uint64
	changed []prefixKey
	// pre is the compile of an isolated direction whose allow rules are this set
	// alone, made when built unless from is set (the commit is then incremental):
	// the usual first commit of a new object then flattens nothing under the lock.
	// nil if not made, or if a value overflows (the commit's compile names the rule).
	pre *precompile
}

// precompile is a set's own compile (RuleSet.pre).
type precompile struct {
	comp  compiledDirection
	broad *broadIndex
}

var ruleSetIDs atomic.Uint64

// NewRuleSet validates rules, allow rules of direction dir, and hashes them. name
// names the set in errors ("ingress rule 3 of <name>: …", wrapping ErrInvalidPolicy).
// prev is the set these rules replace (the object's previous version), or nil: the
// difference in host rules is found here, so that a commit replacing prev by the new
// set computes only those rules' entries. rules must not be changed afterwards.
func NewRuleSet(name string, dir Direction, rules []Rule, prev *RuleSet) (*RuleSet, error) {
	s := &RuleSet{id: ruleSetIDs.Add(1), rules: rules, src: make([]sourceRule, 0, len(rules))}
	n := 0
	for i := range rules {
		n += max(1, len(rules[i].Ports))
	}
	arena := make([]policyPortRule, 0, n)
	var all, broad contentEncoder
	all.start()
	broad.start()
	all.buf = binary.AppendUvarint(append(all.buf, 3), uint64(len(rules))) // 3: a set's encoding
	for i := range rules {
		src, err := validateRule(ruleLabel{dir: dir, index: i, set: name}, &rules[i], ActionAccept, &arena)
		if err != nil {
			return nil, err
		}
		s.src = append(s.src, src)
		all.rule(&rules[i])
		if src.cidr.Bits() == src.cidr.Addr().BitLen() && len(src.excepts) == 0 {
			s.hosts = append(s.hosts, int32(i))
		} else {
			s.broadIdx = append(s.broadIdx, int32(i))
			broad.rule(&rules[i])
		}
	}
	s.hash, s.broad = all.sum(), broad.sum()
	keys := make([]prefixKey, len(rules))
	for _, i := range s.hosts {
		keys[i] = newPrefixUse(s.src[i].cidr, i, false).key
	}
	slices.SortFunc(s.hosts, func(a, b int32) int {
		return cmp.Or(compareKeys(keys[a], keys[b]), comparePorts(s.src[a].ports, s.src[b].ports))
	})
	s.hostKeys = make([]prefixKey, len(s.hosts))
	for j, i := range s.hosts {
		s.hostKeys[j] = keys[i]
	}
	if prev != nil && prev.broad == s.broad {
		s.from, s.changed = prev.id, s.hostChanges(prev)
		if s.changed == nil {
			s.from = 0
		}
	}
	if s.from == 0 {
		s.pre = s.precompile()
	}
	return s, nil
}

func (s *RuleSet) precompile() *precompile {
	comp, err := compileDirection(s.src, nil, nil, true)
	if err != nil {
		return nil
	}
	broad := make([]sourceRule, len(s.broadIdx))
	for j, i := range s.broadIdx {
		broad[j] = s.src[i]
	}
	b, err := newBroadIndex(broad)
	if err != nil {
		return nil
	}
	return &precompile{comp: comp, broad: b}
}

// maxSetChanges bounds the host rules one set's change may touch and still be
// committed incrementally: past it, a full compile costs about as much.
func maxSetChanges(hosts int) int { return 64 + hosts/16 }

// hostChanges returns the prefixes whose host rules differ between prev and s, or
// nil if there are more than maxSetChanges (or none: a set equal to prev hashes
// equal).
func (s *RuleSet) hostChanges(prev *RuleSet) []prefixKey {
	changed := []prefixKey{}
	limit := maxSetChanges(max(len(s.hosts), len(prev.hosts)))
	note := func(k prefixKey) {
		if n := len(changed); n == 0 || changed[n-1] != k {
			changed = append(changed, k)
		}
	}
	i, j := 0, 0
	for (i < len(prev.hosts) || j < len(s.hosts)) && len(changed) <= limit {
		var c int
		switch {
		case i == len(prev.hosts):
			c = 1
		case j == len(s.hosts):
			c = -1
		default:
			c = cmp.Or(compareKeys(prev.hostKeys[i], s.hostKeys[j]),
				comparePorts(prev.src[prev.hosts[i]].ports, s.src[s.hosts[j]].ports))
		}
		switch {
		case c < 0:
			note(prev.hostKeys[i])
			i++
		case c > 0:
			note(s.hostKeys[j])
			j++
		default:
			i++
			j++
		}
	}
	if len(changed) == 0 || len(changed) > limit {
		return nil
	}
	// A prefix removed and one added in its place come out of order: sort them.
	slices.SortFunc(changed, compareKeys)
	return slices.Compact(changed)
}

// hostPorts appends the port rules of the set's host rules with prefix k.
func (s *RuleSet) hostPorts(k prefixKey, out []policyPortRule) []policyPortRule {
	j, _ := slices.BinarySearchFunc(s.hostKeys, k, compareKeys)
	for ; j < len(s.hostKeys) && s.hostKeys[j] == k; j++ {
		out = append(out, s.src[s.hosts[j]].ports...)
	}
	return out
}

// compareKeys orders prefixes as flatten visits them.
func compareKeys(a, b prefixKey) int {
	if a.v6 != b.v6 {
		if b.v6 {
			return -1
		}
		return 1
	}
	return cmp.Or(cmp.Compare(a.hi, b.hi), cmp.Compare(a.lo, b.lo), cmp.Compare(a.bits, b.bits))
}

func comparePorts(a, b []policyPortRule) int {
	return slices.CompareFunc(a, b, func(x, y policyPortRule) int {
		return cmp.Or(cmp.Compare(x.Proto, y.Proto), cmp.Compare(x.Port, y.Port), cmp.Compare(x.EndPort, y.EndPort), cmp.Compare(x.Action, y.Action))
	})
}
