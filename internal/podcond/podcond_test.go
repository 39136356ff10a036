package podcond

import (
	"strings"
	"testing"
)

func TestCompute(t *testing.T) {
	pe := func(name string, s State) Object {
		return Object{Kind: "PolicyEndpoint", Namespace: "shop", Name: name, State: s}
	}
	cases := []struct {
		name        string
		f           Facts
		status, why string
		msgContains string
	}{
		{"nothing selects, standard", Facts{}, True, ReasonNoPolicy, "no policy"},
		{"nothing selects, strict", Facts{Strict: true}, False, ReasonDeniedByStrictMode, "denied"},
		{"programmed", Facts{Objects: []Object{pe("b", Programmed), pe("a", Programmed)}}, True, ReasonProgrammed, "PolicyEndpoint shop/a, PolicyEndpoint shop/b"},
		{"one chunk pending", Facts{Objects: []Object{pe("a", Programmed), pe("b", Pending)}}, False, ReasonPending, "shop/b"},
		{"rejected beats pending", Facts{Objects: []Object{pe("a", Rejected), pe("b", Pending)}}, False, ReasonRejected, "shop/a"},
		{"isolated beats rejected", Facts{Objects: []Object{pe("a", Rejected), pe("b", Isolated)}}, False, ReasonIsolated, "shop/b"},
		{"uncommittable", Facts{Uncommittable: true, Objects: []Object{pe("a", Pending)}}, False, ReasonIsolated, "could not be committed"},
		{"no interface", Facts{NoInterface: true, Objects: []Object{pe("a", Pending)}}, False, ReasonNoInterface, "selected by PolicyEndpoint shop/a"},
		{"strict denied while pending", Facts{Strict: true, StrictDenied: true, Objects: []Object{pe("a", Pending)}}, False, ReasonDeniedByStrictMode, "pending: PolicyEndpoint shop/a"},
		{"strict programmed", Facts{Strict: true, Objects: []Object{pe("a", Programmed)}}, True, ReasonProgrammed, "shop/a"},
	}
	for _, c := range cases {
		got := Compute(c.f)
		if got.Status != c.status || got.Reason != c.why || !strings.Contains(got.Message, c.msgContains) {
			t.Errorf("%s: Compute = %+v, want %s/%s with %q", c.name, got, c.status, c.why, c.msgContains)
		}
	}
}

// The message is the same whatever order the facts came in, so a restarted agent
// writes nothing; it is bounded however many objects select the pod.
func TestComputeDeterministicAndBounded(t *testing.T) {
	var a, b []Object
	for i := range 50 {
		o := Object{Kind: "PolicyEndpoint", Namespace: "shop", Name: strings.Repeat("x", i%7) + string(rune('a'+i%26)) + string(rune('a'+i/26))}
		a = append(a, o)
		b = append([]Object{o}, b...)
	}
	a = append(a, a[3]) // listed twice (two addresses of a dual-stack pod)
	ca, cb := Compute(Facts{Objects: a}), Compute(Facts{Objects: b})
	if ca != cb {
		t.Fatalf("order changes the condition:\n%+v\n%+v", ca, cb)
	}
	if !strings.HasSuffix(ca.Message, "and 42 more") || len(ca.Message) > 400 {
		t.Fatalf("message not bounded: %q", ca.Message)
	}
}
