package bpfmaps

import (
	"cmp"
	"slices"
	"sort"
)

// The compiler as it was before issue 12 made it linear, kept as the reference the
// new one must agree with entry for entry and error for error
// (TestCompileMatchesReference). It recomputes every prefix's value from all the
// rules covering it: O(prefixes × covering rules), and naming the rule of an overflow
// is O(covering rules²).

func compileDirectionRef(ns, admin, baseline []sourceRule, isolated bool) (compiledDirection, error) {
	var out compiledDirection
	if isolated {
		out.Flags |= flagIsolated
	}
	in := interner{vals: &out.Entries.vals, last: -1}
	add := func(t tier, rules []sourceRule, flag uint32) error {
		n := out.Entries.len()
		if err := flattenRef(&out.Entries, &in, t, rules); err != nil {
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

func flattenRef(out *dirEntries, in *interner, t tier, rules []sourceRule) error {
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
			scratch, err = unionValueRef(&top.visible, rules, included, n.key, scratch)
		} else {
			slices.Sort(included) // rules are in priority order
			err = orderedValueRef(&top.visible, rules, included, n.key)
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

func orderedValueRef(v *policyRuleValue, rules []sourceRule, included []int, p prefixKey) error {
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
			e.Rule = uint16(min(ri+1, maxRuleID)) // the rule's id: its position by priority, plus one
			v.Rules[v.Count] = e
			v.Count++
			if e.Proto == uint8(ProtocolAny) && e.Port == 0 {
				return nil
			}
		}
	}
	return nil
}

func unionValueRef(v *policyRuleValue, rules []sourceRule, included []int, p prefixKey, buf []policyPortRule) ([]policyPortRule, error) {
	*v = policyRuleValue{}
	merged := mergePortsRef(rules, included, buf[:0])
	if len(merged) > maxPortRules {
		// Name the rule whose ports pushed the union over the limit.
		for i := range included {
			if len(mergePortsRef(rules, included[:i+1], nil)) > maxPortRules {
				return merged, overflowErr(&rules[included[i]], p, len(merged))
			}
		}
		return merged, overflowErr(&rules[included[len(included)-1]], p, len(merged))
	}
	copy(v.Rules[:], merged)
	v.Count = uint32(len(merged))
	return merged, nil
}

func mergePortsRef(rules []sourceRule, included []int, buf []policyPortRule) []policyPortRule {
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
