package explain

import (
	"net/netip"
	"sync"
	"time"

	"github.com/npagent/npagent/internal/report"
)

// Bounds of RecentFlows: the denials kept per pod, and the pods kept (the one
// whose last denial is oldest goes first).
const (
	RecentFlowsPerPod = 10
	RecentFlowsPods   = 512
)

// PodFlow is one packet the policy denied (or, in audit mode, would have),
// as a flow event named it.
type PodFlow struct {
	Time      time.Time `json:"time"`
	Verdict   string    `json:"verdict"`   // deny, would_deny
	Direction string    `json:"direction"` // the pod's: ingress, egress
	Reason    string    `json:"reason"`
	Src       string    `json:"src,omitempty"`
	Dst       string    `json:"dst,omitempty"`
	SrcPort   uint16    `json:"srcPort,omitempty"`
	DstPort   uint16    `json:"dstPort,omitempty"`
	Protocol  uint8     `json:"protocol"`
	// PolicyKind and Policy name the deciding object; Rule is its rule's index,
	// -1 when no single rule decided (a default deny).
	PolicyKind string `json:"policyKind,omitempty"`
	Policy     string `json:"policy,omitempty"`
	Rule       int    `json:"rule"`
}

// RecentFlows is a report.FlowSink that keeps the last denials of each pod, for
// explain pod: what the policy dropped for a pod lately, answered on the node
// without a logs backend. The zero value is ready; it is safe for concurrent use.
type RecentFlows struct {
	mu   sync.Mutex
	pods map[string]*podFlows
}

type podFlows struct {
	ring [RecentFlowsPerPod]PodFlow
	n    int // events ever added; the newest is ring[(n-1)%len]
	last time.Time
}

// Flow keeps a denial (deny or would_deny); other events are ignored.
func (r *RecentFlows) Flow(ev *report.FlowEvent) {
	if ev.Kind != "deny" {
		return
	}
	key := flowKey(ev.Namespace, ev.Pod, ev.PodIP)
	if key == "" {
		return
	}
	f := PodFlow{Time: ev.Time, Verdict: ev.Verdict, Direction: ev.Direction, Reason: ev.Reason,
		SrcPort: ev.SrcPort, DstPort: ev.DstPort, Protocol: ev.Protocol, PolicyKind: ev.PolicyKind, Rule: ev.RuleIndex}
	if ev.Src.IsValid() {
		f.Src = ev.Src.String()
	}
	if ev.Dst.IsValid() {
		f.Dst = ev.Dst.String()
	}
	switch {
	case ev.PolicyName != "" && ev.PolicyNamespace != "":
		f.Policy = ev.PolicyNamespace + "/" + ev.PolicyName
	case ev.PolicyName != "":
		f.Policy = ev.PolicyName
	}
	if !ev.Attributed {
		f.Rule = -1
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pods == nil {
		r.pods = map[string]*podFlows{}
	}
	p := r.pods[key]
	if p == nil {
		if len(r.pods) >= RecentFlowsPods {
			r.evictOldest()
		}
		p = &podFlows{}
		r.pods[key] = p
	}
	p.ring[p.n%RecentFlowsPerPod] = f
	p.n++
	p.last = ev.Time
}

// evictOldest drops the pod whose last denial is the oldest. Called with mu held.
func (r *RecentFlows) evictOldest() {
	var oldest string
	var at time.Time
	for k, p := range r.pods {
		if oldest == "" || p.last.Before(at) {
			oldest, at = k, p.last
		}
	}
	delete(r.pods, oldest)
}

// Pod is the pod's recent denials, newest first: by namespace and name when
// given, else by address.
func (r *RecentFlows) Pod(namespace, name string, ip netip.Addr) []PodFlow {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.pods[flowKey(namespace, name, netip.Addr{})]
	if p == nil && ip.IsValid() {
		p = r.pods[flowKey("", "", ip)]
	}
	if p == nil {
		return nil
	}
	n := min(p.n, RecentFlowsPerPod)
	out := make([]PodFlow, 0, n)
	for i := range n {
		out = append(out, p.ring[(p.n-1-i)%RecentFlowsPerPod])
	}
	return out
}

// flowKey names a pod: namespace/name when known, else its address.
func flowKey(namespace, name string, ip netip.Addr) string {
	switch {
	case name != "":
		return namespace + "/" + name
	case ip.IsValid():
		return "ip:" + ip.Unmap().String()
	}
	return ""
}
