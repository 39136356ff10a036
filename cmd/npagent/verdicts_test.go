package main

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/reconcile"
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
