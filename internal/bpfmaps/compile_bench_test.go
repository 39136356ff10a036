package bpfmaps

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

// exceptAddr is the i-th of the distinct /32 excepts the compile benchmarks draw.
func exceptAddr(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 32)
}

// broadRule is 10.0.0.0/8 on TCP port, with the given excepts.
func broadRule(port int32, excepts ...netip.Prefix) Rule {
	return Rule{CIDR: netip.MustParsePrefix("10.0.0.0/8"), Except: excepts, Ports: []PortRule{{Protocol: ProtocolTCP, Port: port}}}
}

// exceptPolicies are the shapes of a broad CIDR with n distinct excepts:
//
//   - one-rule: one rule, n excepts (an ipBlock with a long except list);
//   - rule-each: n rules of the same broad CIDR, each with one except of its own (n
//     policies, or n ipBlocks, that allow the same range minus one address each):
//     every except prefix is covered by the n-1 other rules;
//   - admin-rule-each: rule-each as admin Deny rules (a first-match tier).
func exceptPolicies(n int) map[string]DirectionPolicy {
	one := broadRule(80)
	for i := range n {
		one.Except = append(one.Except, exceptAddr(i))
	}
	each := DirectionPolicy{Isolated: true, Allow: make([]Rule, n)}
	admin := DirectionPolicy{Admin: make([]TierRule, n)}
	for i := range n {
		each.Allow[i] = broadRule(80, exceptAddr(i))
		admin.Admin[i] = TierRule{Priority: int32(i), Action: ActionDeny, Rule: broadRule(80, exceptAddr(i))}
	}
	return map[string]DirectionPolicy{
		"one-rule":        {Isolated: true, Allow: []Rule{one}},
		"rule-each":       each,
		"admin-rule-each": admin,
	}
}

// overflowPolicy is n rules covering 10.0.0.0/8 whose union of ports needs more than
// a map value holds only at its end: n-maxPortRules rules on TCP 80, then
// maxPortRules rules on ports of their own. The compile fails naming the rule whose
// ports pushed the union over the limit.
func overflowPolicy(n int) DirectionPolicy {
	d := DirectionPolicy{Isolated: true, Allow: make([]Rule, n)}
	for i := range d.Allow {
		port := int32(80)
		if j := i - (n - maxPortRules); j >= 0 {
			port = int32(1000 + 2*j)
		}
		d.Allow[i] = broadRule(port)
	}
	return d
}

// compile runs what a commit does to one direction before writing: validate and
// flatten.
func compile(d *DirectionPolicy) (compiledDirection, error) {
	ns, admin, baseline, err := validateDirection(Ingress, d)
	if err != nil {
		return compiledDirection{}, err
	}
	return compileDirection(ns, admin, baseline, d.Isolated)
}

// BenchmarkCompileExcepts: the compile of a broad CIDR with n distinct excepts, in
// the shapes of exceptPolicies; entries/op is the number of trie entries it yields.
func BenchmarkCompileExcepts(b *testing.B) {
	for _, shape := range []string{"one-rule", "rule-each", "admin-rule-each"} {
		for _, n := range []int{100, 1000, 10000} {
			b.Run(fmt.Sprintf("%s/n=%d", shape, n), func(b *testing.B) {
				d := exceptPolicies(n)[shape]
				b.ReportAllocs()
				var entries int
				for b.Loop() {
					c, err := compile(&d)
					if err != nil {
						b.Fatal(err)
					}
					entries = c.Entries.len()
				}
				b.ReportMetric(float64(entries), "entries/op")
			})
		}
	}
}

// BenchmarkCompileOverflow: the compile of overflowPolicy(n), rejected with an error
// naming the rule that overflowed.
func BenchmarkCompileOverflow(b *testing.B) {
	for _, n := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			d := overflowPolicy(n)
			want := fmt.Sprintf("ingress rule %d: ports", n-1)
			b.ReportAllocs()
			for b.Loop() {
				_, err := compile(&d)
				if !errors.Is(err, ErrInvalidPolicy) || !strings.Contains(err.Error(), want) {
					b.Fatalf("error %v, want one naming %q", err, want)
				}
			}
		})
	}
}

// BenchmarkCompileWide: the common shape, n side-by-side /32 peers on one port
// (widePolicy), and one-rule from exceptPolicies, each compiled by compileDirection
// ("current") and by the reference compiler it replaced ("reference"), in one
// binary: the linear walk must not cost the shapes that were already linear.
func BenchmarkCompileWide(b *testing.B) {
	shapes := []struct {
		name string
		d    DirectionPolicy
	}{
		{"wide/n=10000", widePolicy(10000, 80).Ingress},
		{"one-rule/n=10000", exceptPolicies(10000)["one-rule"]},
	}
	impls := []struct {
		name    string
		compile func(ns, admin, baseline []sourceRule, isolated bool) (compiledDirection, error)
	}{{"current", compileDirection}, {"reference", compileDirectionRef}}
	for _, s := range shapes {
		for _, impl := range impls {
			b.Run(s.name+"/"+impl.name, func(b *testing.B) {
				ns, admin, baseline, err := validateDirection(Ingress, &s.d)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				for b.Loop() {
					if _, err := impl.compile(ns, admin, baseline, s.d.Isolated); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkCompileRebuilds: the case the walk leaves quadratic. n admin Deny rules of
// 10.0.0.0/8 on one port, each with a /32 except of its own, and rule 0 excepting
// all of them: at each except, rule 0 gave the value's port rule, so the value is
// rebuilt by a scan of the n-1 other rules.
func BenchmarkCompileRebuilds(b *testing.B) {
	for _, n := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			d := exceptPolicies(n)["admin-rule-each"]
			d.Admin = append([]TierRule(nil), d.Admin...)
			all := make([]netip.Prefix, n)
			for i := range all {
				all[i] = exceptAddr(i)
			}
			d.Admin[0].Rule = broadRule(80, all...)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := compile(&d); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
