package bpfmaps

import (
	"fmt"
	"net/netip"
	"testing"
)

// referenceDecider is DirectionPolicy.Verdict's decision with what made it: the
// reason a counter would name and, in a tier, the deciding rule.
func referenceDecider(d DirectionPolicy, peer netip.Addr, proto Protocol, port uint16) (VerdictReason, *TierRule) {
	if !proto.hasPorts() {
		port = 0
	}
	if !d.Isolated && len(d.Admin) == 0 && len(d.Baseline) == 0 {
		return ReasonNoPolicy, nil
	}
	for _, r := range sortedTier(d.Admin) {
		if !r.Rule.matches(peer, proto, port) {
			continue
		}
		if r.Action == ActionAccept {
			return ReasonAdminAccept, &r
		}
		if r.Action == ActionDeny {
			return ReasonAdminDeny, &r
		}
		break
	}
	if d.Isolated {
		if d.Verdict(peer, proto, port) {
			return ReasonAllow, nil
		}
		return ReasonDefaultDeny, nil
	}
	for _, r := range sortedTier(d.Baseline) {
		if r.Rule.matches(peer, proto, port) {
			switch r.Action {
			case ActionAccept:
				return ReasonBaselineAccept, &r
			case ActionDeny:
				return ReasonBaselineDeny, &r
			}
			break
		}
	}
	return ReasonDefaultAllow, nil
}

// TestJudgeMemory: over random policies with named objects and tier rules, the
// in-memory backend's Judge gives DirectionPolicy.Verdict's answer (with the node
// exemption), the reason and deciding tier rule the reference names, and the
// isolating objects; a source that is not the pod's is spoofed; an interface
// without state is unmanaged.
func TestJudgeMemory(t *testing.T) {
	seen := map[VerdictReason]int{}
	for seed := range uint64(40) {
		g := newPolicyGen(seed).withNode()
		m := NewMemory()
		if err := m.SetNodeAddrs(testNodeSet); err != nil {
			t.Fatal(err)
		}
		pol := g.pod()
		for d, dp := range []*DirectionPolicy{&pol.Ingress, &pol.Egress} {
			if dp.Isolated {
				dp.Sources = []Origin{{UID: "u", Kind: "PolicyEndpoint", Namespace: "ns", Name: fmt.Sprint(Direction(d)), Index: -1}}
			}
			for i := range dp.Admin {
				dp.Admin[i].Origin = Origin{Kind: "ClusterPolicyEndpoint", Name: "admin", Index: i}
			}
			for i := range dp.Baseline {
				dp.Baseline[i].Origin = Origin{Kind: "ClusterPolicyEndpoint", Name: "baseline", Index: i}
			}
		}
		self4, self6 := netip.MustParseAddr("10.9.9.9"), netip.MustParseAddr("fd00:9::9")
		pol.Addrs = []netip.Addr{self4, self6}
		if _, err := m.Commit(7, pol); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		for range 300 {
			pkt := g.packet()
			self := self4
			if pkt.peer.Is6() {
				self = self6
			}
			for d, dp := range []DirectionPolicy{pol.Ingress, pol.Egress} {
				p := Probe{Ifindex: 7, Direction: Direction(d), Src: pkt.peer, Dst: self, Proto: pkt.proto, Port: pkt.port}
				if d == int(Egress) {
					p.Src, p.Dst = self, pkt.peer
				}
				j, err := m.Judge(p)
				if err != nil {
					t.Fatal(err)
				}
				node := nodeContains(testNodeSet, pkt.peer)
				want := node || dp.Verdict(pkt.peer, pkt.proto, pkt.port)
				reason, rule := referenceDecider(dp, pkt.peer, pkt.proto, pkt.port)
				got := j.Reason
				if j.Reason == ReasonNode {
					got = j.PolicyReason
				}
				if reason == ReasonDefaultAllow && got == ReasonNoPolicy {
					reason = got // tier rules that decide nothing (Pass only) compile to no policy
				}
				if j.Passes() != want || got != reason || (j.Reason == ReasonNode) != (node && reason.Denied()) || !j.Attributed {
					t.Fatalf("seed %d %s %+v: judged %+v; want passes=%v reason %s", seed, Direction(d), pkt, j, want, reason)
				}
				if rule != nil && j.Rule != rule.Origin {
					t.Fatalf("seed %d %s %+v: credited to %+v, want %+v", seed, Direction(d), pkt, j.Rule, rule.Origin)
				}
				if (reason == ReasonAllow || reason == ReasonDefaultDeny) && (len(j.Sources) != 1 || j.Sources[0] != dp.Sources[0]) {
					t.Fatalf("seed %d %s %+v: sources %v, want %v", seed, Direction(d), pkt, j.Sources, dp.Sources)
				}
				seen[got]++
			}
			forged := netip.MustParseAddr("10.9.9.8")
			if pkt.peer.Is6() {
				forged = netip.MustParseAddr("fd00:9::8")
			}
			j, err := m.Judge(Probe{Ifindex: 7, Direction: Egress, Src: forged, Dst: pkt.peer, Proto: pkt.proto, Port: pkt.port})
			if err != nil || j.Reason != ReasonSpoofed || j.Passes() {
				t.Fatalf("forged source: %+v, %v; want spoofed", j, err)
			}
		}
		if j, err := m.Judge(Probe{Ifindex: 8, Direction: Ingress, Src: self4, Dst: self4, Proto: ProtocolTCP, Port: 80}); err != nil || j.Managed || !j.Passes() {
			t.Fatalf("interface without state: %+v, %v; want unmanaged, passes", j, err)
		}
	}
	for _, r := range []VerdictReason{ReasonNoPolicy, ReasonAllow, ReasonDefaultAllow, ReasonAdminAccept, ReasonAdminDeny,
		ReasonBaselineAccept, ReasonBaselineDeny, ReasonDefaultDeny} {
		if seen[r] == 0 {
			t.Errorf("no packet judged %s (judged: %v)", r, seen)
		}
	}
}
