package bpfmaps

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
)

// BenchmarkVerdictsCollect: what one collection of the verdict counters costs
// (EBPF.Verdicts: the per-CPU allowed array, the per-CPU hash of the other
// outcomes, each entry attributed through the commits' id tables) on a node of
// 100 pods, each selected by 20 objects (a rule each) and one admin rule, every
// pod with allowed, default-deny and admin-deny packets counted. series is the
// count records returned, the figure the telemetry's series bound applies to.
func BenchmarkVerdictsCollect(b *testing.B) {
	const pods, objects = 100, 20
	e := openTestEBPF(b, EBPFOptions{})
	admin := TierRule{Priority: 1, Action: ActionDeny, Rule: Rule{CIDR: netip.MustParsePrefix("11.66.0.0/16")},
		Origin: Origin{UID: "u-admin", Kind: "ClusterPolicyEndpoint", Name: "deny-scanners", Index: 0}}
	run := func(ifindex int, src netip.Addr, port uint16) {
		pkt := packetBytes(src, podAddrIngress4, ProtocolTCP, 40000, port)
		if _, err := e.objs.ToPod.Run(&ebpf.RunOptions{Data: pkt, Context: skbContext{Ifindex: uint32(ifindex)}}); err != nil {
			b.Fatal(err)
		}
	}
	for range pods {
		ifindex := dummyInterface(b)
		d := DirectionPolicy{Isolated: true, Admin: []TierRule{admin}}
		for j := range objects {
			d.Allow = append(d.Allow, Rule{CIDR: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(j), 0, 0}), 16),
				Ports: []PortRule{{Protocol: ProtocolTCP, Port: 80}}})
			d.Sources = append(d.Sources, Origin{UID: fmt.Sprintf("u-%d", j), Kind: "PolicyEndpoint", Namespace: "bench", Name: fmt.Sprintf("obj-%d", j), Index: -1})
		}
		if _, err := e.Commit(ifindex, PodPolicy{Ingress: d}); err != nil {
			b.Fatal(err)
		}
		for j := range objects {
			run(ifindex, netip.AddrFrom4([4]byte{10, byte(j), 0, 1}), 80) // allowed
		}
		run(ifindex, netip.MustParseAddr("12.0.0.1"), 80)  // default deny
		run(ifindex, netip.MustParseAddr("11.66.0.1"), 80) // admin deny
	}
	v, err := e.Verdicts()
	if err != nil {
		b.Fatal(err)
	}
	if len(v.Counts) < 3*pods {
		b.Fatalf("%d count records for %d pods, want at least 3 each (allowed, default deny, admin deny)", len(v.Counts), pods)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := e.Verdicts(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(v.Counts)), "series")
}
