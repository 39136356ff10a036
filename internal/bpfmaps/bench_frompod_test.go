package bpfmaps

import (
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// BenchmarkVerdictFromPod: the from-pod program's cost per packet (the pod's egress
// policy of 10,000 CIDRs, its addresses known: the anti-spoofing lookup is on this
// path), for an allowed packet and one that misses the trie.
func BenchmarkVerdictFromPod(b *testing.B) {
	e := openTestEBPF(b, EBPFOptions{})
	ifindex := dummyInterface(b)
	p := PodPolicy{Egress: widePolicy(10000, 80).Ingress}
	p.Addrs = []netip.Addr{podAddrEgress4, podAddrEgress6}
	if _, err := e.Commit(ifindex, p); err != nil {
		b.Fatal(err)
	}
	for _, c := range []verdictCase{
		{"allowed", packetBytes(podAddrEgress4, netip.MustParseAddr("10.0.20.7"), ProtocolTCP, 40000, 80)},
		{"denied-miss", packetBytes(podAddrEgress4, netip.MustParseAddr("11.0.0.1"), ProtocolTCP, 40000, 80)},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			stats, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
			if err == nil {
				defer stats.Close()
			}
			before, _ := e.objs.FromPod.Stats()
			start := time.Now()
			if _, err := e.objs.FromPod.Run(&ebpf.RunOptions{Data: c.pkt, Context: skbContext{Ifindex: uint32(ifindex)}, Repeat: uint32(b.N)}); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N), "ns/packet")
			// The kernel's own run time per packet (as benchVerdicts): less noise.
			if after, _ := e.objs.FromPod.Stats(); err == nil && before != nil && after != nil && after.RunCount > before.RunCount {
				b.ReportMetric(float64((after.Runtime-before.Runtime).Nanoseconds())/float64(after.RunCount-before.RunCount), "run-ns/packet")
			}
		})
	}
}
