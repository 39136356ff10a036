package main

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/explain"
	"github.com/npagent/npagent/internal/reconcile"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/telemetry"
)

// The dataplane's counters are named for export: the pod by its interface, the
// deciding rule's object (its policy's name when it is a chunk) and index, the
// isolating objects of a default deny, and nothing for a pod isolated without an
// object or a count no longer attributed.
func TestNamedVerdicts(t *testing.T) {
	web := bpfmaps.Origin{UID: "u1", Kind: "PolicyEndpoint", Namespace: "shop", Name: "web-abcde", Policy: "web", Index: -1}
	db := bpfmaps.Origin{UID: "u2", Kind: "PolicyEndpoint", Namespace: "shop", Name: "db-xyz", Index: -1}
	admin := bpfmaps.Origin{UID: "u3", Kind: "ClusterPolicyEndpoint", Name: "deny-metadata", Index: 2}
	vc := bpfmaps.VerdictCounts{Lost: 4, Counts: []bpfmaps.VerdictCount{
		{Ifindex: 7, Direction: bpfmaps.Egress, Reason: bpfmaps.ReasonAdminDeny, Rule: admin, Attributed: true, Packets: 3, Bytes: 180},
		{Ifindex: 7, Direction: bpfmaps.Ingress, Reason: bpfmaps.ReasonDefaultDeny, Sources: []bpfmaps.Origin{web, db}, Attributed: true, Packets: 5, Bytes: 300},
		{Ifindex: 7, Direction: bpfmaps.Ingress, Reason: bpfmaps.ReasonAllow, Sources: []bpfmaps.Origin{web}, Attributed: true, Packets: 9, Bytes: 900},
		{Ifindex: 8, Direction: bpfmaps.Ingress, Reason: bpfmaps.ReasonDefaultDeny, Attributed: true, Packets: 1, Bytes: 60},
		{Ifindex: 9, Direction: bpfmaps.Egress, Reason: bpfmaps.ReasonConntrackReply, Packets: 2, Bytes: 120},
		{Ifindex: 7, Direction: bpfmaps.Ingress, Reason: bpfmaps.ReasonDefaultDeny, Audited: true, Sources: []bpfmaps.Origin{web}, Attributed: true, Packets: 6, Bytes: 360},
	}}
	pods := map[int]reconcile.VerdictPod{
		7: {IP: netip.MustParseAddr("10.1.0.5"), Namespace: "shop", Name: "web-1"},
		8: {IP: netip.MustParseAddr("10.1.0.6")},
	}
	got := namedVerdicts(vc, pods)
	want := telemetry.VerdictCounts{Lost: 4, Counts: []telemetry.Verdict{
		{Direction: "egress", Denied: true, Reason: "admin_deny", Namespace: "shop", Pod: "web-1", PolicyKind: "ClusterPolicyEndpoint", PolicyName: "deny-metadata", Rule: 2, Packets: 3, Bytes: 180},
		{Direction: "ingress", Denied: true, Reason: "default_deny", Namespace: "shop", Pod: "web-1", PolicyKind: "PolicyEndpoint", PolicyName: "db-xyz+web", Rule: -1, Packets: 5, Bytes: 300},
		{Direction: "ingress", Reason: "policy_allow", Namespace: "shop", Pod: "web-1", PolicyKind: "PolicyEndpoint", PolicyName: "web", Rule: -1, Packets: 9, Bytes: 900},
		{Direction: "ingress", Denied: true, Reason: "default_deny", Rule: -1, Packets: 1, Bytes: 60},
		{Direction: "egress", Reason: "conntrack_reply", Rule: -1, Packets: 2, Bytes: 120},
		{Direction: "ingress", Denied: true, Audited: true, Reason: "default_deny", Namespace: "shop", Pod: "web-1", PolicyKind: "PolicyEndpoint", PolicyName: "web", Rule: -1, Packets: 6, Bytes: 360},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("named verdicts\n got %+v\nwant %+v", got, want)
	}
}

// fakeExplainSource answers a pod query with a fixed pod.
type fakeExplainSource struct{ pod explain.PodExplain }

func (f fakeExplainSource) HasSynced() bool { return true }
func (f fakeExplainSource) ExplainObject(report.Kind, string, string) explain.ObjectExplain {
	return explain.ObjectExplain{}
}
func (f fakeExplainSource) ExplainPod(explain.PodQuery) explain.PodExplain { return f.pod }

// `npagent explain pod/...` shows the pod's verdict counters, read from the kernel's
// maps: only its interface's, named, the denials first; a pod without an interface
// shows none.
func TestExplainPodVerdicts(t *testing.T) {
	web := bpfmaps.Origin{Kind: "PolicyEndpoint", Namespace: "shop", Name: "web", Index: -1}
	admin := bpfmaps.Origin{Kind: "ClusterPolicyEndpoint", Name: "deny-metadata", Index: 1}
	read := func() (bpfmaps.VerdictCounts, error) {
		return bpfmaps.VerdictCounts{Counts: []bpfmaps.VerdictCount{
			{Ifindex: 7, Direction: bpfmaps.Ingress, Reason: bpfmaps.ReasonAllow, Sources: []bpfmaps.Origin{web}, Attributed: true, Packets: 9, Bytes: 900},
			{Ifindex: 7, Direction: bpfmaps.Egress, Reason: bpfmaps.ReasonAdminDeny, Rule: admin, Attributed: true, Packets: 3, Bytes: 180},
			{Ifindex: 8, Direction: bpfmaps.Ingress, Reason: bpfmaps.ReasonDefaultDeny, Packets: 5, Bytes: 300},
		}}, nil
	}
	src := verdictSource{Source: fakeExplainSource{explain.PodExplain{Node: "n", Namespace: "shop", Name: "web-1", IP: "10.1.0.5",
		OnNode: true, Synced: true, Programmed: true, Ifindex: 7}}, read: read}
	p := src.ExplainPod(explain.PodQuery{Namespace: "shop", Name: "web-1"})
	want := []explain.PodVerdict{
		{Direction: "ingress", Verdict: "allow", Reason: "policy_allow", PolicyKind: "PolicyEndpoint", Policy: "web", Rule: -1, Packets: 9, Bytes: 900},
		{Direction: "egress", Verdict: "deny", Reason: "admin_deny", PolicyKind: "ClusterPolicyEndpoint", Policy: "deny-metadata", Rule: 1, Packets: 3, Bytes: 180},
	}
	if !reflect.DeepEqual(p.Verdicts, want) {
		t.Errorf("verdicts %+v, want %+v", p.Verdicts, want)
	}
	var b strings.Builder
	printPod(&b, &p)
	out := b.String()
	deny, allow := -1, -1
	for i, line := range strings.Split(out, "\n") {
		switch strings.Join(strings.Fields(line), " ") {
		case "egress deny admin_deny ClusterPolicyEndpoint deny-metadata 1 3 180":
			deny = i
		case "ingress allow policy_allow PolicyEndpoint web - 9 900":
			allow = i
		}
	}
	if deny < 0 || allow < 0 || deny > allow {
		t.Errorf("explain output lacks the verdicts, denials first:\n%s", out)
	}
	noIf := verdictSource{Source: fakeExplainSource{explain.PodExplain{Node: "n", OnNode: true, Synced: true}}, read: read}
	if got := noIf.ExplainPod(explain.PodQuery{}).Verdicts; got != nil {
		t.Errorf("a pod without an interface: verdicts %+v, want none", got)
	}
}
