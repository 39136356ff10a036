package bpfmaps

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"testing"
)

// compareWithReference compiles d with compileDirection and with the reference
// compiler and returns how many entries both yield (-1: both rejected d with the
// same error), or what differs.
func compareWithReference(d DirectionPolicy) (int, error) {
	ns, admin, baseline, err := validateDirection(Ingress, &d)
	if err != nil {
		return 0, err
	}
	got, gotErr := compileDirection(ns, admin, baseline, d.Isolated)
	want, wantErr := compileDirectionRef(ns, admin, baseline, d.Isolated)
	if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
		return 0, fmt.Errorf("error %v, reference %v\npolicy: %+v", gotErr, wantErr, d)
	}
	if gotErr != nil {
		return -1, nil
	}
	if !reflect.DeepEqual(got, want) {
		return 0, fmt.Errorf("compiled\n%+v\nreference\n%+v\npolicy: %+v", got, want, d)
	}
	return got.Entries.len(), nil
}

// sharedDirection draws a direction whose rules share a few CIDRs (so many rules
// cover one prefix, as in a broad CIDR allowed by many policies), each with excepts
// inside it and ports from a wide pool (so unions of ports overflow a value now and
// then): the shapes the incremental compile treats differently from the reference.
func (g *policyGen) sharedDirection() DirectionPolicy {
	v6 := g.family()
	cidrs := make([]netip.Prefix, 1+g.rnd.IntN(4))
	for i := range cidrs {
		cidrs[i] = g.prefix(v6)
	}
	rule := func() Rule {
		r := Rule{CIDR: cidrs[g.rnd.IntN(len(cidrs))]}
		for range g.rnd.IntN(4) {
			r.Except = append(r.Except, g.within(r.CIDR))
		}
		if g.rnd.IntN(3) == 0 {
			r.Ports = g.ports()
			return r
		}
		for range g.rnd.IntN(9) {
			pr := PortRule{Protocol: []Protocol{ProtocolTCP, ProtocolUDP, ProtocolAny}[g.rnd.IntN(3)], Port: int32(2 + 2*g.rnd.IntN(50))}
			if g.rnd.IntN(4) == 0 {
				pr.EndPort = pr.Port + int32(g.rnd.IntN(3))
			}
			r.Ports = append(r.Ports, pr)
		}
		return r
	}
	n := 1 + g.rnd.IntN(30)
	d := DirectionPolicy{Isolated: g.rnd.IntN(2) == 0}
	for range n {
		switch g.rnd.IntN(3) {
		case 0:
			d.Allow = append(d.Allow, rule())
		case 1:
			d.Admin = append(d.Admin, TierRule{Priority: int32(g.rnd.IntN(4)), Action: Action(1 + g.rnd.IntN(3)), Rule: rule()})
		default:
			d.Baseline = append(d.Baseline, TierRule{Priority: int32(g.rnd.IntN(4)), Action: Action(1 + g.rnd.IntN(3)), Rule: rule()})
		}
	}
	return d
}

// TestCompileMatchesReference: on random directions of every shape the generators
// draw, compileDirection yields exactly what the reference compiler (the quadratic
// one it replaced) yields: the same flags, entries in the same order, values, and
// the same error, naming the same rule.
func TestCompileMatchesReference(t *testing.T) {
	g := newPolicyGen(12)
	errs, entries := 0, 0
	check := func(i int, d DirectionPolicy) {
		t.Helper()
		n, err := compareWithReference(d)
		if err != nil {
			t.Fatalf("draw %d: %v", i, err)
		}
		if n < 0 {
			errs++
		}
		entries += max(n, 0)
	}
	const draws = 4000
	for i := range draws {
		switch i % 4 {
		case 0:
			check(i, g.direction())
		case 1:
			check(i, g.widePod().Egress)
		default:
			check(i, g.sharedDirection())
		}
	}
	for _, n := range []int{1, 30, 300} {
		for _, d := range exceptPolicies(n) {
			check(n, d)
		}
		check(n, overflowPolicy(n+maxPortRules))
	}
	t.Logf("%d draws: %d rejected, %d entries compared", draws, errs, entries)
	if errs < draws/50 || errs > draws/2 {
		t.Fatalf("skewed sample: %d of %d draws rejected", errs, draws)
	}
}

// FuzzCompileMatchesReference is TestCompileMatchesReference with the fuzzer
// choosing the draws (see FuzzCompiledEntriesMatchVerdict).
func FuzzCompileMatchesReference(f *testing.F) {
	for _, seed := range []string{"", "\x00", "npagent", "\xff\xff\xff\xff\xff\xff\xff\xff\x01\x02\x03"} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		g := &policyGen{rnd: rand.New(newByteSource(data)), anyMix: true}
		for _, d := range []DirectionPolicy{g.sharedDirection(), g.direction(), g.widePod().Ingress} {
			if _, err := compareWithReference(d); err != nil {
				t.Fatal(err)
			}
		}
	})
}
