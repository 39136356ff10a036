package bpfmaps

import "testing"

// BenchmarkCommitReplicas10k: ten pods hold one policy of 10,000 CIDRs, and each op
// moves all ten, one commit each as reconcile makes them, to a policy whose every
// value differs (the worst change: no delta helps). entries is what the tries hold
// afterwards. With entry groups the first pod writes the new entries, the other nine
// find them, and the set they left is deleted once; with a copy per pod every pod
// writes and deletes its own 10,000.
func BenchmarkCommitReplicas10k(b *testing.B) {
	const n, pods = 10000, 10
	// Room for ten copies and their second sets, so that the comparison with a copy
	// per pod runs (the default 65,536 fails it at the seventh pod).
	e := openTestEBPF(b, EBPFOptions{Limits: Limits{EntriesV4: 4 * n * pods}})
	pols := [2]PodPolicy{widePolicy(n, 80), widePolicy(n, 81)}
	ifs := make([]int, pods)
	for i := range ifs {
		ifs[i] = dummyInterface(b)
		if _, err := e.Commit(ifs[i], pols[1]); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		for _, ifindex := range ifs {
			if _, err := e.Commit(ifindex, pols[i%2]); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(trieEntries(b, e)), "entries")
}
