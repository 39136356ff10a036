package main

import (
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/explain"
	"github.com/npagent/npagent/internal/reconcile"
	"github.com/npagent/npagent/internal/telemetry"
)

// observeVerdicts hands telemetry the dataplane's verdict counters, named after the
// pods the reconcile loop programmed: read at each collection, nothing per packet.
// A failed read is logged (at most once a minute) and exports the last good one.
func observeVerdicts(tel *telemetry.Telemetry, ctrl *reconcile.Controller, dp bpfmaps.Dataplane, log *slog.Logger) {
	var mu sync.Mutex
	var last telemetry.VerdictCounts
	var logged time.Time
	err := tel.ObserveVerdicts(func() telemetry.VerdictCounts {
		mu.Lock()
		defer mu.Unlock()
		vc, err := dp.Verdicts()
		if err != nil {
			if time.Since(logged) > time.Minute {
				log.Warn("read verdict counters", "err", err)
				logged = time.Now()
			}
			return last
		}
		last = namedVerdicts(vc, ctrl.VerdictPods())
		return last
	})
	if err != nil {
		log.Error("verdict counters not exported", "err", err)
	}
}

// namedVerdicts turns the dataplane's counters (by interface, with the deciding
// rule's or the isolating objects' origins) into telemetry's: the pod's namespace
// and name, the deciding object's kind and name (its policy's name when it is a
// chunk of one) and the rule's index. The namespaced tier's allow and the default
// deny name the isolating objects: one by its name, several by their names joined
// by "+" (sorted), none (isolated without an object: strict mode, or a commit that
// failed) by nothing.
func namedVerdicts(vc bpfmaps.VerdictCounts, pods map[int]reconcile.VerdictPod) telemetry.VerdictCounts {
	out := telemetry.VerdictCounts{Lost: vc.Lost, Counts: make([]telemetry.Verdict, 0, len(vc.Counts))}
	for _, c := range vc.Counts {
		v := telemetry.Verdict{Direction: c.Direction.String(), Denied: c.Reason.Denied(), Audited: c.Audited, Reason: c.Reason.String(),
			Rule: -1, Packets: c.Packets, Bytes: c.Bytes}
		if p, ok := pods[c.Ifindex]; ok {
			v.Namespace, v.Pod = p.Namespace, p.Name
		}
		switch {
		case c.Rule != (bpfmaps.Origin{}):
			v.PolicyKind, v.PolicyName, v.Rule = c.Rule.Kind, originName(c.Rule), c.Rule.Index
		case len(c.Sources) > 0:
			v.PolicyKind = c.Sources[0].Kind
			names := make([]string, 0, len(c.Sources))
			for _, s := range c.Sources {
				names = append(names, originName(s))
			}
			slices.Sort(names)
			v.PolicyName = strings.Join(slices.Compact(names), "+")
		}
		out.Counts = append(out.Counts, v)
	}
	return out
}

// originName is the name an operator knows: the policy an object is a chunk of,
// else the object's own.
func originName(o bpfmaps.Origin) string {
	if o.Policy != "" {
		return o.Policy
	}
	return o.Name
}

// verdictSource answers the debug API as its Source does, adding to a pod's answer
// the verdict counters of its interface, read from the kernel's maps at the time.
type verdictSource struct {
	explain.Source
	read  func() (bpfmaps.VerdictCounts, error)
	judge func(bpfmaps.Probe) (bpfmaps.Judgement, error)
}

func (s verdictSource) ExplainPod(q explain.PodQuery) explain.PodExplain {
	out := s.Source.ExplainPod(q)
	if out.Ifindex == 0 {
		return out
	}
	vc, err := s.read()
	if err != nil {
		return out
	}
	mine := bpfmaps.VerdictCounts{}
	for _, c := range vc.Counts {
		if c.Ifindex == out.Ifindex {
			mine.Counts = append(mine.Counts, c)
		}
	}
	for _, v := range namedVerdicts(mine, nil).Counts {
		word := "allow"
		switch {
		case v.Audited:
			word = "would_deny"
		case v.Denied:
			word = "deny"
		}
		out.Verdicts = append(out.Verdicts, explain.PodVerdict{Direction: v.Direction, Verdict: word, Reason: v.Reason,
			PolicyKind: v.PolicyKind, Policy: v.PolicyName, Rule: v.Rule, Packets: v.Packets, Bytes: v.Bytes})
	}
	return out
}

// ExplainVerdict implements explain.VerdictSource: each end is resolved through the
// read model (its address, and for a pod on this node the interface holding its
// state), then each of this node's programs on the packet's path — the sender's
// egress, the receiver's ingress — judges it from the maps the kernel holds
// (bpfmaps.Judger): the decision is the dataplane's, not recomputed from objects.
func (s verdictSource) ExplainVerdict(q explain.VerdictQuery) (explain.VerdictExplain, error) {
	out := explain.VerdictExplain{At: time.Now(), Checks: []explain.VerdictCheck{}}
	var pods [2]explain.PodExplain
	for i, end := range []explain.PodQuery{q.From, q.To} {
		pods[i] = s.Source.ExplainPod(end)
		if pods[i].IP == "" {
			return out, fmt.Errorf("pod %s/%s: no policy object lists it and strict mode holds no address for it: give its IP", end.Namespace, end.Name)
		}
	}
	out.Node = pods[0].Node
	from, to := verdictEnd(q.From, &pods[0]), verdictEnd(q.To, &pods[1])
	out.From, out.To = from, to
	src, dst := netip.MustParseAddr(from.IP), netip.MustParseAddr(to.IP)
	if src.Is4() != dst.Is4() {
		return out, fmt.Errorf("%s and %s are not of one address family: give the other end's address of the same family", src, dst)
	}
	proto := map[string]bpfmaps.Protocol{"tcp": bpfmaps.ProtocolTCP, "udp": bpfmaps.ProtocolUDP, "sctp": bpfmaps.ProtocolSCTP}[q.Protocol]
	if q.Protocol == "icmp" {
		proto = bpfmaps.ProtocolICMP
		if src.Is6() {
			proto = bpfmaps.ProtocolICMPv6
		}
	}
	out.Protocol, out.Port = proto.String(), q.Port
	for i, d := range []bpfmaps.Direction{bpfmaps.Egress, bpfmaps.Ingress} {
		end, pod := [2]explain.VerdictEnd{from, to}[i], &pods[i]
		side := [2]string{"sender", "receiver"}[i]
		switch {
		case end.Ifindex != 0:
			j, err := s.judge(bpfmaps.Probe{Ifindex: end.Ifindex, Direction: d, Src: src, Dst: dst, Proto: proto, Port: q.Port})
			if err != nil {
				return out, fmt.Errorf("judge the packet at %s's %s: %w", endName(end), d, err)
			}
			out.Checks = append(out.Checks, verdictCheck(d, end, pod, j))
		case end.Pod && !end.Local:
			out.Notes = append(out.Notes, fmt.Sprintf("the %s %s is on node %s: its %s is judged there (ask the agent on that node)", side, endName(end), orDash(end.HostIP), d))
		case end.Local:
			out.Notes = append(out.Notes, fmt.Sprintf("the %s %s holds no state on this node: its %s programs are not attached, its packets pass unjudged", side, endName(end), d))
		default:
			out.Notes = append(out.Notes, fmt.Sprintf("the %s %s is not a pod this agent knows (outside the cluster, or a pod no policy object lists): no %s check of it on this node", side, end.IP, d))
		}
	}
	out.Verdict = explain.VerdictNotJudged
	for _, c := range out.Checks {
		switch {
		case c.Verdict == explain.VerdictDeny:
			out.Verdict = explain.VerdictDeny
		case c.Verdict == explain.VerdictWouldDeny && out.Verdict != explain.VerdictDeny:
			out.Verdict = explain.VerdictWouldDeny
		case out.Verdict == explain.VerdictNotJudged:
			out.Verdict = explain.VerdictAllow
		}
	}
	if len(out.Checks) == 2 && out.Checks[0].Verdict == explain.VerdictDeny {
		out.Notes = append(out.Notes, "the sender's egress drops it: the receiver's ingress never sees it (shown as it would judge it)")
	}
	out.Notes = append(out.Notes, "judged as a new flow's first packet (TCP SYN, UDP datagram, ICMP echo request): packets of a connection one direction allowed pass the other as replies (conntrack_reply)")
	return out, nil
}

func verdictEnd(q explain.PodQuery, p *explain.PodExplain) explain.VerdictEnd {
	e := explain.VerdictEnd{IP: p.IP, Namespace: p.Namespace, Name: p.Name, HostIP: p.HostIP, Ifindex: p.Ifindex}
	e.Query = "pod/" + q.Namespace + "/" + q.Name
	if q.IP.IsValid() {
		e.Query = q.IP.String()
	}
	// A pod the read model knows: named by an object or strict mode, or holding state.
	e.Pod = p.Name != "" || p.Ifindex != 0
	e.Local = e.Pod && p.OnNode
	return e
}

func endName(e explain.VerdictEnd) string {
	if e.Name != "" {
		return e.Namespace + "/" + e.Name
	}
	return e.IP
}

// verdictCheck is a judgement in the debug API's terms, with the objects named.
func verdictCheck(d bpfmaps.Direction, end explain.VerdictEnd, pod *explain.PodExplain, j bpfmaps.Judgement) explain.VerdictCheck {
	c := explain.VerdictCheck{Direction: d.String(), Pod: endName(end), Ifindex: end.Ifindex, Managed: j.Managed, Verdict: explain.VerdictAllow,
		Generation: j.Gen, Isolated: j.Isolated, Admin: j.Admin, Baseline: j.Baseline, Attributed: j.Attributed}
	if !j.Managed {
		c.Reason, c.Why = "unmanaged", "the interface holds no state: the packet passes unjudged"
		return c
	}
	switch {
	case j.Audited:
		c.Verdict = explain.VerdictWouldDeny
	case !j.Passes():
		c.Verdict = explain.VerdictDeny
	}
	c.Reason = j.Reason.String()
	decided := j.Reason
	if j.PolicyReason != 0 {
		c.PolicyReason, decided = j.PolicyReason.String(), j.PolicyReason
	}
	if j.Rule != (bpfmaps.Origin{}) {
		c.Objects = []explain.VerdictObject{verdictObject(j.Rule, j.Rule.Index)}
	}
	for _, o := range j.Sources {
		c.Objects = append(c.Objects, verdictObject(o, -1))
	}
	if m := j.Match; m != nil {
		c.Match = m.Protocol.String()
		switch {
		case m.Port == 0 && m.EndPort == 0xffff:
		case m.Port == m.EndPort:
			c.Match += fmt.Sprintf(" %d", m.Port)
		default:
			c.Match += fmt.Sprintf(" %d-%d", m.Port, m.EndPort)
		}
	}
	names := make([]string, 0, len(c.Objects))
	for _, o := range c.Objects {
		n := objectName(o.Kind, o.Namespace, o.Name)
		if o.Rule >= 0 {
			n += fmt.Sprintf(" rule %d", o.Rule)
		}
		names = append(names, n)
	}
	by := strings.Join(names, ", ")
	if !j.Attributed {
		by = "(objects unknown: the commit in force predates this agent process)"
	}
	var why string
	switch decided {
	case bpfmaps.ReasonNoPolicy:
		why = "no policy applies to this direction: allowed"
	case bpfmaps.ReasonAllow:
		why = fmt.Sprintf("allowed by the namespaced policy of %s (entry %s)", by, c.Match)
	case bpfmaps.ReasonDefaultAllow:
		why = "not isolated, and no admin or baseline rule decided: allowed"
	case bpfmaps.ReasonAdminAccept, bpfmaps.ReasonAdminDeny, bpfmaps.ReasonBaselineAccept, bpfmaps.ReasonBaselineDeny:
		why = fmt.Sprintf("%s by %s (entry %s)", strings.ReplaceAll(decided.String(), "_", " "), by, c.Match)
	case bpfmaps.ReasonDefaultDeny:
		switch {
		case len(j.Sources) > 0:
			why = fmt.Sprintf("default deny: isolated by %s, and no allow rule matches", by)
		case pod.StrictDenied:
			why = "default deny by strict mode: no policy selecting the pod is committed yet"
		case !j.Attributed:
			why = "default deny: isolated, and no allow rule matches " + by
		default:
			why = "default deny: isolated without an object (strict mode, or fail-closed after a commit that failed)"
		}
	case bpfmaps.ReasonSpoofed:
		why = "the source is not one of the pod's own addresses (anti-spoofing)"
	default:
		why = decided.String()
	}
	switch {
	case j.Reason == bpfmaps.ReasonNode:
		why = "traffic between the pod and its node passes whatever the policy says (" + why + ")"
	case j.Audited:
		why = "audit mode passes it: " + why
	}
	c.Why = why
	return c
}

func verdictObject(o bpfmaps.Origin, rule int) explain.VerdictObject {
	return explain.VerdictObject{Kind: o.Kind, Namespace: o.Namespace, Name: o.Name, UID: o.UID, Policy: o.Policy, Rule: rule}
}
