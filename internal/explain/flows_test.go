package explain

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/npagent/npagent/internal/report"
)

// TestRecentFlows (pure logic): denials are kept per pod, newest first, at most
// RecentFlowsPerPod each; allowed flows are not kept; a pod unknown by name is
// found by address; past RecentFlowsPods pods the one denied longest ago goes.
func TestRecentFlows(t *testing.T) {
	var r RecentFlows
	t0 := time.Date(2026, 12, 5, 20, 0, 0, 0, time.UTC)
	deny := func(pod string, i int, at time.Time) *report.FlowEvent {
		return &report.FlowEvent{Time: at, Kind: "deny", Verdict: "deny", Direction: "ingress", Reason: "default_deny",
			Namespace: "shop", Pod: pod, PodIP: netip.MustParseAddr("10.0.0.1"),
			Src: netip.MustParseAddr("10.0.0.9"), Dst: netip.MustParseAddr("10.0.0.1"), DstPort: uint16(i), Protocol: 6,
			PolicyKind: "PolicyEndpoint", PolicyNamespace: "shop", PolicyName: "web", RuleIndex: -1, Attributed: true}
	}
	for i := range RecentFlowsPerPod + 3 {
		r.Flow(deny("web", 1000+i, t0.Add(time.Duration(i)*time.Second)))
	}
	r.Flow(&report.FlowEvent{Time: t0, Kind: "new_flow", Verdict: "allow", Namespace: "shop", Pod: "web"})
	got := r.Pod("shop", "web", netip.Addr{})
	if len(got) != RecentFlowsPerPod || got[0].DstPort != uint16(1000+RecentFlowsPerPod+2) || got[len(got)-1].DstPort != 1003 {
		t.Fatalf("web's denials: %d, newest port %d, oldest %d; want %d, %d, 1003", len(got), got[0].DstPort, got[len(got)-1].DstPort,
			RecentFlowsPerPod, 1000+RecentFlowsPerPod+2)
	}
	if f := got[0]; f.Policy != "shop/web" || f.Src != "10.0.0.9" || f.Reason != "default_deny" || f.Rule != -1 {
		t.Errorf("newest denial %+v", f)
	}
	// Unnamed: found by address.
	r.Flow(&report.FlowEvent{Time: t0, Kind: "deny", Verdict: "would_deny", PodIP: netip.MustParseAddr("10.0.0.7"), DstPort: 53, RuleIndex: 2})
	if got := r.Pod("other", "x", netip.MustParseAddr("10.0.0.7")); len(got) != 1 || got[0].Verdict != "would_deny" || got[0].Rule != -1 {
		t.Errorf("by address: %+v (an unattributed event names no rule)", got)
	}
	// The pod bound: the pod denied longest ago goes.
	for i := range RecentFlowsPods {
		r.Flow(deny(fmt.Sprintf("p%d", i), 1, t0.Add(time.Hour+time.Duration(i)*time.Second)))
	}
	if r.Pod("shop", "web", netip.Addr{}) != nil || r.Pod("", "", netip.MustParseAddr("10.0.0.7")) != nil {
		t.Error("the pods denied longest ago were kept past the bound")
	}
	if r.Pod("shop", "p0", netip.Addr{}) == nil || len(r.pods) != RecentFlowsPods {
		t.Errorf("%d pods kept, want %d with p0 among them", len(r.pods), RecentFlowsPods)
	}
}
