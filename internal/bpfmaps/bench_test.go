package bpfmaps

import (
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// widePolicy is an isolated ingress policy of n side-by-side /32 CIDRs on one TCP port.
func widePolicy(n int, port int32) PodPolicy {
	d := DirectionPolicy{Isolated: true, Allow: make([]Rule, n)}
	for i := range d.Allow {
		a := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		d.Allow[i] = Rule{CIDR: netip.PrefixFrom(a, 32), Ports: []PortRule{{Protocol: ProtocolTCP, Port: port}}}
	}
	return PodPolicy{Ingress: d}
}

// BenchmarkCommit10k compares, for one policy of 10,000 CIDRs whose every value
// changes: the atomic commit (a full one: the inactive set written in full, switch,
// the other set deleted), one BatchUpdate of the same 10,000 entries into a trie (the
// floor of any full commit), per-key Puts into a live trie (not atomic: packets see a
// mix while it runs), and a map-in-map swap (fill a fresh inner trie, one outer
// update).
func BenchmarkCommit10k(b *testing.B) {
	const n = 10000
	// fullCommits times commits that alternate between two policies differing in every
	// entry's value: each writes the inactive set in full and deletes the other.
	fullCommits := func(b *testing.B, pols [2]PodPolicy) {
		e := openTestEBPF(b, EBPFOptions{})
		ifindex := dummyInterface(b)
		if _, err := e.Commit(ifindex, pols[1]); err != nil {
			b.Fatal(err)
		}
		var write, sw, clean time.Duration
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; b.Loop(); i++ {
			res, err := e.Commit(ifindex, pols[i%2])
			if err != nil || res.EntriesWritten != n || res.EntriesDeleted != n || res.Delta {
				b.Fatalf("commit: %+v %v", res, err)
			}
			write += res.Write
			sw += res.Switch
			clean += res.Cleanup
		}
		b.ReportMetric(float64(write.Nanoseconds())/float64(b.N), "write-ns/op")
		b.ReportMetric(float64(sw.Nanoseconds())/float64(b.N), "switch-ns/op")
		b.ReportMetric(float64(clean.Nanoseconds())/float64(b.N), "cleanup-ns/op")
	}
	b.Run("atomic-commit", func(b *testing.B) {
		fullCommits(b, [2]PodPolicy{widePolicy(n, 80), widePolicy(n, 81)})
	})

	b.Run("atomic-commit-sets", func(b *testing.B) {
		// The same as reconcile commits it: the rules are a RuleSet, validated and
		// hashed when built (untimed), so the commit flattens and writes them only.
		var pols [2]PodPolicy
		for i := range pols {
			s, err := NewRuleSet("PolicyEndpoint bench/wide", Ingress, widePolicy(n, int32(80+i)).Ingress.Allow, nil)
			if err != nil {
				b.Fatal(err)
			}
			pols[i] = PodPolicy{Ingress: DirectionPolicy{Isolated: true, AllowSets: []*RuleSet{s}}}
		}
		fullCommits(b, pols)
	})

	keys, vals := make([]policyLpmKey4, n), make([]policyRuleValue, n)
	for i := range keys {
		keys[i] = policyLpmKey4{Prefixlen: 96, Group: 1, Tag: entryTag(1, tierNamespaced), Addr: [4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}}
		vals[i].Count = 1
		vals[i].Rules[0] = policyPortRule{Port: 80, EndPort: 80, Proto: uint8(ProtocolTCP), Action: uint8(ActionAccept)}
	}
	trieSpec := &ebpf.MapSpec{Type: ebpf.LPMTrie, KeySize: 16, ValueSize: uint32(len(vals[0].Rules)*8 + 8), MaxEntries: 2 * n, Flags: 1 /* BPF_F_NO_PREALLOC */}

	b.Run("batch-update", func(b *testing.B) {
		// The entries go into an empty trie each time (deleted untimed), as a full
		// commit writes them into an empty entry set.
		requireKernel(b)
		m, err := ebpf.NewMap(trieSpec)
		if err != nil {
			b.Fatal(err)
		}
		defer m.Close()
		b.ReportAllocs()
		for b.Loop() {
			if _, err := m.BatchUpdate(keys, vals, nil); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if _, err := m.BatchDelete(keys, nil); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	})

	b.Run("per-key-live", func(b *testing.B) {
		requireKernel(b)
		m, err := ebpf.NewMap(trieSpec)
		if err != nil {
			b.Fatal(err)
		}
		defer m.Close()
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			for k := range keys {
				vals[k].Rules[0].Port = uint16(80 + i%2)
				if err := m.Put(keys[k], vals[k]); err != nil {
					b.Fatal(err)
				}
			}
		}
	})

	b.Run("map-in-map-swap", func(b *testing.B) { benchMapInMapSwap(b, ebpf.ArrayOfMaps, keys, vals) })
}

// benchMapInMapSwap fills a fresh inner trie with one batch and swaps it into an
// array-of-maps with one update: atomic, but every outer update waits for an RCU grace
// period.
func benchMapInMapSwap(b *testing.B, outerType ebpf.MapType, keys []policyLpmKey4, vals []policyRuleValue) {
	requireKernel(b)
	trieSpec := &ebpf.MapSpec{Type: ebpf.LPMTrie, KeySize: 16, ValueSize: uint32(len(vals[0].Rules)*8 + 8), MaxEntries: uint32(2 * len(keys)), Flags: 1 /* BPF_F_NO_PREALLOC */}
	outer, err := ebpf.NewMap(&ebpf.MapSpec{Type: outerType, KeySize: 4, ValueSize: 4, MaxEntries: 1, InnerMap: trieSpec})
	if err != nil {
		b.Fatal(err)
	}
	defer outer.Close()
	var current *ebpf.Map
	b.ReportAllocs()
	for b.Loop() {
		inner, err := ebpf.NewMap(trieSpec)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := inner.BatchUpdate(keys, vals, nil); err != nil {
			b.Fatal(err)
		}
		if err := outer.Put(uint32(0), inner); err != nil {
			b.Fatal(err)
		}
		if current != nil {
			current.Close()
		}
		current = inner
	}
	if current != nil {
		current.Close()
	}
}

// BenchmarkCommitSmall: one pod, a 10-CIDR policy alternating with another; and the
// map-in-map swap of the same 10 entries for comparison.
func BenchmarkCommitSmall(b *testing.B) {
	b.Run("atomic-commit", func(b *testing.B) {
		e := openTestEBPF(b, EBPFOptions{})
		ifindex := dummyInterface(b)
		pols := [2]PodPolicy{widePolicy(10, 80), widePolicy(10, 81)}
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if _, err := e.Commit(ifindex, pols[i%2]); err != nil {
				b.Fatal(err)
			}
		}
	})
	swapKeys, swapVals := make([]policyLpmKey4, 10), make([]policyRuleValue, 10)
	for i := range swapKeys {
		swapKeys[i] = policyLpmKey4{Prefixlen: 96, Group: 1, Addr: [4]byte{10, 0, 0, byte(i)}}
		swapVals[i].Count = 1
	}
	b.Run("map-in-map-swap", func(b *testing.B) { benchMapInMapSwap(b, ebpf.ArrayOfMaps, swapKeys, swapVals) })
	b.Run("hash-of-maps-swap", func(b *testing.B) { benchMapInMapSwap(b, ebpf.HashOfMaps, swapKeys, swapVals) })
}

// BenchmarkCommitUnchanged: re-committing the committed policy (a relist) writes
// nothing; the cost is validation and hashing.
func BenchmarkCommitUnchanged(b *testing.B) {
	for _, n := range []int{10, 10000} {
		b.Run(map[int]string{10: "10-cidrs", 10000: "10k-cidrs"}[n], func(b *testing.B) {
			e := openTestEBPF(b, EBPFOptions{})
			ifindex := dummyInterface(b)
			p := widePolicy(n, 80)
			if _, err := e.Commit(ifindex, p); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				res, err := e.Commit(ifindex, p)
				if err != nil || !res.Skipped || res.EntriesWritten != 0 {
					b.Fatalf("unchanged commit wrote: %+v %v", res, err)
				}
			}
		})
	}
}

// BenchmarkVerdict10k: the program's cost per packet, through BPF_PROG_TEST_RUN with
// the kernel repeating the run, for a pod whose ingress trie holds 10,000 entries and
// a node set of four addresses ("node": a port the policy denies, from a node
// address).
func BenchmarkVerdict10k(b *testing.B) {
	e := openTestEBPF(b, EBPFOptions{})
	ifindex := dummyInterface(b)
	if _, err := e.Commit(ifindex, widePolicy(10000, 80)); err != nil {
		b.Fatal(err)
	}
	// A node set as a node has one: its addresses and a host-side veth address.
	if err := e.SetNodeAddrs([]netip.Prefix{netip.MustParsePrefix("192.0.2.10/32"), netip.MustParsePrefix("169.254.1.1/32"),
		netip.MustParsePrefix("2001:db8::10/128"), netip.MustParsePrefix("fe80::1/128")}); err != nil {
		b.Fatal(err)
	}
	benchVerdicts(b, e, ifindex, []verdictCase{
		{"allowed", packetBytes(netip.MustParseAddr("10.0.20.7"), podAddrIngress4, ProtocolTCP, 40000, 80)},
		{"denied-port", packetBytes(netip.MustParseAddr("10.0.20.7"), podAddrIngress4, ProtocolTCP, 40000, 81)},
		{"denied-miss", packetBytes(netip.MustParseAddr("11.0.0.1"), podAddrIngress4, ProtocolTCP, 40000, 80)},
		{"node", packetBytes(netip.MustParseAddr("192.0.2.10"), podAddrIngress4, ProtocolTCP, 40000, 81)},
	})
}

type verdictCase struct {
	name string
	pkt  []byte
}

// benchVerdicts runs each packet through the to-pod program b.N times in the kernel's
// repeat loop (BPF_PROG_TEST_RUN) and reports the cost per packet: ns/packet by the
// wall clock, and run-ns/packet by the kernel's own run-time statistics
// (BPF_ENABLE_STATS, enabled for the run only), which time each run of the program
// alone: on a loaded machine the wall clock also counts the loop, the syscall and
// every preemption.
func benchVerdicts(b *testing.B, e *EBPF, ifindex int, cases []verdictCase) {
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			stats, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
			if err == nil {
				defer stats.Close()
			}
			before, _ := e.objs.ToPod.Stats()
			start := time.Now()
			if _, err := e.objs.ToPod.Run(&ebpf.RunOptions{Data: c.pkt, Context: skbContext{Ifindex: uint32(ifindex)}, Repeat: uint32(b.N)}); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N), "ns/packet")
			if after, _ := e.objs.ToPod.Stats(); err == nil && before != nil && after != nil && after.RunCount > before.RunCount {
				b.ReportMetric(float64((after.Runtime-before.Runtime).Nanoseconds())/float64(after.RunCount-before.RunCount), "run-ns/packet")
			}
		})
	}
}

// BenchmarkVerdictManyPods: the program's cost per packet when the pod-state maps hold
// their default capacity of 4096 pods. The denied packet misses the pod's 10-entry trie,
// so the state is read twice (before and after the miss).
func BenchmarkVerdictManyPods(b *testing.B) {
	e := openTestEBPF(b, EBPFOptions{})
	ifindex := dummyInterface(b)
	if _, err := e.Commit(ifindex, widePolicy(10, 80)); err != nil {
		b.Fatal(err)
	}
	// Other pods' states go straight into the maps, under the ifindexes that follow:
	// only how full the maps are matters here, not their interfaces or entries.
	for i := 1; i < 4096; i++ {
		other := uint32(ifindex + i)
		st := e.pods[uint32(ifindex)].state
		for d, w := range st.Dir {
			st.Dir[d] = dirWord(other, wordGen(w), wordFlags(w))
		}
		if err := e.states.put(other, &st); err != nil {
			b.Fatal(err)
		}
	}
	benchVerdicts(b, e, ifindex, []verdictCase{
		{"allowed", packetBytes(netip.MustParseAddr("10.0.0.7"), podAddrIngress4, ProtocolTCP, 40000, 80)},
		{"denied-miss", packetBytes(netip.MustParseAddr("11.0.0.1"), podAddrIngress4, ProtocolTCP, 40000, 80)},
	})
}

// withCIDR returns p with one more ingress CIDR.
func withCIDR(p PodPolicy, cidr string) PodPolicy {
	p.Ingress.Allow = append(p.Ingress.Allow[:len(p.Ingress.Allow):len(p.Ingress.Allow)],
		Rule{CIDR: netip.MustParsePrefix(cidr), Ports: []PortRule{{Protocol: ProtocolTCP, Port: 80}}})
	return p
}

// BenchmarkCommitDelta10k: one CIDR added to (and, every other op, removed from) a
// 10,000-CIDR policy, atomically, the way reconcile commits it: the object's rules
// are a RuleSet built from its previous version (prepare-ns/op: NewRuleSet, before
// the lock, untimed), then committed (ns/op: Commit, the lock included), which
// compiles the one changed entry and writes it into each of the two entry sets.
// "1-pod" commits one pod; "10-pods" commits the same change to ten pods the policy
// selects (one op = one set built, ten commits). record-bytes is what user space
// keeps of one pod's committed entries.
func BenchmarkCommitDelta10k(b *testing.B) {
	const n = 10000
	for _, pods := range []int{1, 10} {
		b.Run(map[int]string{1: "1-pod", 10: "10-pods"}[pods], func(b *testing.B) {
			e := openTestEBPF(b, EBPFOptions{Limits: Limits{EntriesV4: 2*pods*(n+1) + 16}})
			ifaces := make([]int, pods)
			for i := range ifaces {
				ifaces[i] = dummyInterface(b)
			}
			rules := [2][]Rule{widePolicy(n, 80).Ingress.Allow, withCIDR(widePolicy(n, 80), "11.0.0.1/32").Ingress.Allow}
			var cur *RuleSet
			build := func(op int) (PodPolicy, time.Duration) {
				start := time.Now()
				s, err := NewRuleSet("PolicyEndpoint bench/wide", Ingress, rules[op%2], cur)
				if err != nil {
					b.Fatal(err)
				}
				cur = s
				return PodPolicy{Ingress: DirectionPolicy{Isolated: true, AllowSets: []*RuleSet{s}}}, time.Since(start)
			}
			for op := range 2 { // the second commit fills the second set
				p, _ := build(op)
				for _, i := range ifaces {
					if _, err := e.Commit(i, p); err != nil {
						b.Fatal(err)
					}
				}
			}
			var prepare, compile, write, clean time.Duration
			b.ReportAllocs()
			for op := 0; b.Loop(); op++ {
				b.StopTimer()
				p, took := build(op)
				prepare += took
				b.StartTimer()
				for _, i := range ifaces {
					res, err := e.Commit(i, p)
					if err != nil || !res.Delta || !res.Incremental || res.EntriesWritten+res.EntriesDeleted != 2 {
						b.Fatalf("commit: %+v %v, want an incremental delta of one entry per set", res, err)
					}
					compile += res.Compile
					write += res.Write
					clean += res.Cleanup
				}
			}
			b.ReportMetric(float64(prepare.Nanoseconds())/float64(b.N), "prepare-ns/op")
			b.ReportMetric(float64(compile.Nanoseconds())/float64(b.N), "compile-ns/op")
			b.ReportMetric(float64(write.Nanoseconds())/float64(b.N), "write-ns/op")
			b.ReportMetric(float64(clean.Nanoseconds())/float64(b.N), "cleanup-ns/op")
			b.ReportMetric(float64(e.pods[uint32(ifaces[0])].dirs[Ingress].entries().bytes()), "record-bytes")
		})
	}
}
