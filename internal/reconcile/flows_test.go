package reconcile

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/explain"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/testenv"
)

// flowRecorder is a report.FlowSink keeping what it is handed.
type flowRecorder struct {
	mu  sync.Mutex
	evs []report.FlowEvent
}

func (r *flowRecorder) Flow(ev *report.FlowEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := *ev
	c.Policies = append([]string(nil), ev.Policies...)
	r.evs = append(r.evs, c)
}

func (r *flowRecorder) forPort(port uint16) []report.FlowEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []report.FlowEvent
	for _, ev := range r.evs {
		if ev.DstPort == port {
			out = append(out, ev)
		}
	}
	return out
}

// TestEBPFFlowEvents: a real packet a PolicyEndpoint's default deny drops reaches
// the sinks named: the pod as the object's endpoints name it, the deciding object
// (kind, namespace, name, uid), its tier, the resourceVersion committed and that
// version's trigger time; the counters count it emitted.
func TestEBPFFlowEvents(t *testing.T) {
	l := newPodLab(t)
	l.serve(t, 8080)
	testenv.Eventually(t, 10*time.Second, "port 8080 reachable before any policy", func() bool { return l.reach(8080) == nil })
	dp := openKernelDataplane(t, "flows")
	cp := sharedCP(t)
	const node = "192.0.2.21"
	createNamespace(t, cp, "flows")
	a := startAgent(t, cp, agentOptions{nodeIP: node, dp: dp})
	rec := &flowRecorder{}
	ctx, cancel := context.WithCancel(context.Background())
	flows, err := a.c.StartFlows(ctx, dp, FlowOptions{Events: bpfmaps.FlowEventConfig{Mode: bpfmaps.FlowEventsDeny}, Node: "node-f",
		Sinks: []report.FlowSink{rec}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); flows.Wait() })

	pe := ingressPE("flows", "web", []v1alpha1.PodEndpoint{pod(node, l.podIP)}, l.hostIP+"/32", 8080)
	trigger := create(t, cp, pe)
	testenv.Eventually(t, 20*time.Second, "record for the create", func() bool { return len(a.sink.recordsFor(string(pe.UID))) == 1 })
	if err := l.reach(8081); err == nil {
		t.Fatal("port 8081 reachable: the policy is not enforced")
	}
	testenv.Eventually(t, 5*time.Second, "a flow event for the SYN to 8081", func() bool { return len(rec.forPort(8081)) > 0 })
	ev := rec.forPort(8081)[0]
	want := report.FlowEvent{Node: "node-f", Kind: "deny", Verdict: "deny", Direction: "ingress", Reason: "default_deny",
		Namespace: "flows", Pod: "p-" + l.podIP, PodIP: netip.MustParseAddr(l.podIP),
		Src: netip.MustParseAddr(l.hostIP), Dst: netip.MustParseAddr(l.podIP), DstPort: 8081, Protocol: 6,
		PolicyKind: "PolicyEndpoint", PolicyNamespace: "flows", PolicyName: "web", PolicyUID: string(pe.UID),
		Policies: []string{"web"}, Tier: "namespaced", RuleIndex: -1, ResourceVersion: pe.ResourceVersion, Attributed: true}
	got := ev
	got.Time, got.SrcPort, got.Length, got.TriggerTime = time.Time{}, 0, 0, time.Time{}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("event\n %+v\nwant\n %+v", got, want)
	}
	if !ev.TriggerTime.Equal(trigger) {
		t.Errorf("trigger time %v, want the version's %v", ev.TriggerTime, trigger)
	}
	if ev.SrcPort == 0 || ev.Length == 0 || time.Since(ev.Time) > 10*time.Second {
		t.Errorf("event source port %d, length %d, time %v: want the packet's", ev.SrcPort, ev.Length, ev.Time)
	}
	// explain pod shows it: the read model is a sink of its own.
	ex := a.c.ExplainPod(explain.PodQuery{Namespace: "flows", Name: "p-" + l.podIP})
	if i := slices.IndexFunc(ex.RecentDenials, func(f explain.PodFlow) bool { return f.DstPort == 8081 }); i < 0 {
		t.Errorf("explain pod flows/p-%s: recent denials %+v, want the SYN to 8081", l.podIP, ex.RecentDenials)
	} else if f := ex.RecentDenials[i]; f.Policy != "flows/web" || f.PolicyKind != "PolicyEndpoint" || f.Reason != "default_deny" ||
		f.Direction != "ingress" || f.Src != l.hostIP || f.Protocol != 6 || f.Rule != -1 {
		t.Errorf("explain pod's denial %+v", f)
	}
	var c report.FlowCounts
	flows.Counts(&c)
	if c.Emitted == 0 || c.QueueFull != 0 {
		t.Errorf("counts %+v: want events emitted, none dropped", c)
	}
}
