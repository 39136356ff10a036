package main

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

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

// podsByQuery answers each pod query from a table (by IP, or namespace/name).
type podsByQuery map[string]explain.PodExplain

func (podsByQuery) HasSynced() bool { return true }
func (podsByQuery) ExplainObject(report.Kind, string, string) explain.ObjectExplain {
	return explain.ObjectExplain{}
}
func (p podsByQuery) ExplainPod(q explain.PodQuery) explain.PodExplain {
	k := q.Namespace + "/" + q.Name
	if q.IP.IsValid() {
		k = q.IP.String()
	}
	if pod, ok := p[k]; ok {
		return pod
	}
	out := explain.PodExplain{Node: "n", OnNode: true, Synced: true}
	if q.IP.IsValid() {
		out.IP = q.IP.String()
	}
	return out
}

// ExplainVerdict judges the packet at each end that is a pod with state on this
// node, egress then ingress, with the dataplane's judgement named: the deciding
// rule's object and index, or the isolating objects; strict mode is said as such;
// an end on another node, or unknown, is a note; an unresolvable pod or two
// families are errors.
func TestExplainVerdictSource(t *testing.T) {
	web := bpfmaps.Origin{UID: "u1", Kind: "PolicyEndpoint", Namespace: "shop", Name: "web-abcde", Policy: "web", Index: -1}
	admin := bpfmaps.Origin{UID: "u3", Kind: "ClusterPolicyEndpoint", Name: "deny-metadata", Index: 2}
	pods := podsByQuery{
		"shop/web-1": {Node: "n", Namespace: "shop", Name: "web-1", IP: "10.1.0.5", OnNode: true, Synced: true, Ifindex: 7},
		"10.1.0.5":   {Node: "n", Namespace: "shop", Name: "web-1", IP: "10.1.0.5", OnNode: true, Synced: true, Ifindex: 7},
		"shop/db-0":  {Node: "n", Namespace: "shop", Name: "db-0", IP: "10.2.0.9", OnNode: false, HostIP: "10.0.0.2", Synced: true},
		"shop/new-0": {Node: "n", Namespace: "shop", Name: "new-0", IP: "10.1.0.6", OnNode: true, Synced: true, Ifindex: 8, StrictDenied: true},
	}
	var probes []bpfmaps.Probe
	judge := func(p bpfmaps.Probe) (bpfmaps.Judgement, error) {
		probes = append(probes, p)
		switch {
		case p.Ifindex == 8:
			return bpfmaps.Judgement{Managed: true, Isolated: true, Reason: bpfmaps.ReasonDefaultDeny, Attributed: true}, nil
		case p.Direction == bpfmaps.Egress:
			return bpfmaps.Judgement{Managed: true, Admin: true, Reason: bpfmaps.ReasonAdminDeny, Rule: admin, Attributed: true,
				Match: &bpfmaps.PortMatch{Protocol: bpfmaps.ProtocolTCP, Port: 80, EndPort: 80, Action: bpfmaps.ActionDeny}}, nil
		}
		return bpfmaps.Judgement{Managed: true, Isolated: true, Namespaced: true, Reason: bpfmaps.ReasonAllow, Sources: []bpfmaps.Origin{web}, Attributed: true,
			Match: &bpfmaps.PortMatch{Protocol: bpfmaps.ProtocolTCP, Port: 8000, EndPort: 8080, Action: bpfmaps.ActionAccept}}, nil
	}
	src := verdictSource{Source: pods, judge: judge}
	ip := func(s string) explain.PodQuery { return explain.PodQuery{IP: netip.MustParseAddr(s)} }
	pod := func(ns, name string) explain.PodQuery { return explain.PodQuery{Namespace: ns, Name: name} }

	// From a peer outside to the local pod: its ingress only.
	v, err := src.ExplainVerdict(explain.VerdictQuery{From: ip("192.0.2.1"), To: pod("shop", "web-1"), Protocol: "tcp", Port: 8080})
	if err != nil || v.Verdict != explain.VerdictAllow || len(v.Checks) != 1 {
		t.Fatalf("peer to pod: %+v, %v; want allowed by one check", v, err)
	}
	c := v.Checks[0]
	want := explain.VerdictCheck{Direction: "ingress", Pod: "shop/web-1", Ifindex: 7, Managed: true, Verdict: "allow", Reason: "policy_allow",
		Isolated: true, Objects: []explain.VerdictObject{{Kind: "PolicyEndpoint", Namespace: "shop", Name: "web-abcde", UID: "u1", Policy: "web", Rule: -1}},
		Match: "TCP 8000-8080", Attributed: true, Why: "allowed by the namespaced policy of pe/shop/web-abcde (entry TCP 8000-8080)"}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("check\n got %+v\nwant %+v", c, want)
	}
	if p := probes[0]; p.Direction != bpfmaps.Ingress || p.Ifindex != 7 || p.Src != netip.MustParseAddr("192.0.2.1") || p.Dst != netip.MustParseAddr("10.1.0.5") ||
		p.Proto != bpfmaps.ProtocolTCP || p.Port != 8080 {
		t.Errorf("probe %+v", p)
	}
	if !strings.Contains(strings.Join(v.Notes, "\n"), "192.0.2.1 is not a pod this agent knows") {
		t.Errorf("notes %q: want the peer named as no pod", v.Notes)
	}
	// From the local pod to one on another node: its egress (an admin Deny), and a note.
	v, err = src.ExplainVerdict(explain.VerdictQuery{From: pod("shop", "web-1"), To: pod("shop", "db-0"), Protocol: "tcp", Port: 80})
	if err != nil || v.Verdict != explain.VerdictDeny || len(v.Checks) != 1 || v.Checks[0].Direction != "egress" ||
		v.Checks[0].Why != "admin deny by cpe/deny-metadata rule 2 (entry TCP 80)" ||
		!strings.Contains(strings.Join(v.Notes, "\n"), "shop/db-0 is on node 10.0.0.2: its ingress is judged there") {
		t.Errorf("pod to a pod on another node: %+v, %v", v, err)
	}
	// Strict mode, said as such; ICMP is ICMPv4 for IPv4 ends.
	v, err = src.ExplainVerdict(explain.VerdictQuery{From: pod("shop", "web-1"), To: pod("shop", "new-0"), Protocol: "icmp"})
	if err != nil || v.Verdict != explain.VerdictDeny || len(v.Checks) != 2 || v.Protocol != "ICMP" ||
		!strings.Contains(v.Checks[1].Why, "strict mode") {
		t.Errorf("to a strict-denied pod: %+v, %v", v, err)
	}
	if _, err := src.ExplainVerdict(explain.VerdictQuery{From: pod("shop", "nope"), To: ip("10.1.0.5"), Protocol: "tcp", Port: 80}); err == nil || !strings.Contains(err.Error(), "shop/nope") {
		t.Errorf("unknown pod: %v, want an error naming it", err)
	}
	if _, err := src.ExplainVerdict(explain.VerdictQuery{From: ip("fd00::1"), To: ip("10.1.0.5"), Protocol: "tcp", Port: 80}); err == nil {
		t.Error("two families: no error")
	}
}

// TestExplainPodPrintsRecentDenials: explain pod prints the pod's recent denials,
// one line each with its direction, verdict, ends, protocol, reason, deciding
// object and rule, after the verdict counters.
func TestExplainPodPrintsRecentDenials(t *testing.T) {
	at := time.Date(2026, 12, 5, 20, 1, 2, 0, time.UTC)
	p := explain.PodExplain{Node: "n", Namespace: "shop", Name: "web-1", IP: "10.1.0.5", OnNode: true, Synced: true, Programmed: true,
		RecentDenials: []explain.PodFlow{
			{Time: at, Verdict: "deny", Direction: "ingress", Reason: "default_deny", Src: "10.9.0.1", SrcPort: 40000, Dst: "10.1.0.5", DstPort: 8081,
				Protocol: 6, PolicyKind: "PolicyEndpoint", Policy: "shop/web", Rule: -1},
			{Time: at, Verdict: "would_deny", Direction: "egress", Reason: "admin_deny", Src: "10.1.0.5", Dst: "169.254.169.254",
				Protocol: 1, PolicyKind: "ClusterPolicyEndpoint", Policy: "deny-metadata", Rule: 1},
		}}
	var b strings.Builder
	printPod(&b, &p)
	out := b.String()
	for _, want := range []string{
		"2026-12-05T20:01:02Z ingress deny 10.9.0.1:40000 10.1.0.5:8081 tcp default_deny pe/shop/web -",
		"2026-12-05T20:01:02Z egress would_deny 10.1.0.5 169.254.169.254 icmp admin_deny cpe/deny-metadata 1",
	} {
		found := false
		for _, line := range strings.Split(out, "\n") {
			found = found || strings.Join(strings.Fields(line), " ") == want
		}
		if !found {
			t.Errorf("explain pod output lacks %q:\n%s", want, out)
		}
	}
}
