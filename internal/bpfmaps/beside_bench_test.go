package bpfmaps

import (
	"slices"
	"testing"
	"time"
)

// BenchmarkCommitBesideLargeObject is issue 12's "a genuine update while a
// 20,000-rule object compiles on another pod": one op is a small commit on pod A (a
// 10-rule policy whose port changes) while a goroutine commits, over and over, a new
// version of a 20,000-rule object on pod B, each differing from the last in every
// entry. "plain" hands B's commit the rules, so they are validated and compiled under
// the dataplane's lock (as every commit did before rule sets); "sets" builds them
// into a RuleSet first, outside the lock, as reconcile does now. What matters is A's
// wait: its p50, p99 and max; B's commits are written in full either way (20,000
// entries and the other set's deletes, under the lock).
//
//	go test -run '^$' -bench CommitBesideLargeObject -benchtime 400x ./internal/bpfmaps/   # as root
func BenchmarkCommitBesideLargeObject(b *testing.B) {
	const n = 20000
	for _, mode := range []string{"plain", "sets"} {
		b.Run(mode, func(b *testing.B) {
			e := openTestEBPF(b, EBPFOptions{Limits: Limits{EntriesV4: 4*n + 64}})
			small, large := dummyInterface(b), dummyInterface(b)
			versions := [2][]Rule{widePolicy(n, 80).Ingress.Allow, widePolicy(n, 81).Ingress.Allow}
			smalls := [2]PodPolicy{widePolicy(10, 80), widePolicy(10, 443)}
			if _, err := e.Commit(large, PodPolicy{Ingress: DirectionPolicy{Isolated: true, Allow: versions[1]}}); err != nil {
				b.Fatal(err)
			}
			stop, done := make(chan struct{}), make(chan error, 1)
			var largeCommits int
			go func() {
				var prev *RuleSet
				for k := 0; ; k++ {
					select {
					case <-stop:
						done <- nil
						return
					default:
					}
					p := PodPolicy{Ingress: DirectionPolicy{Isolated: true, Allow: versions[k%2]}}
					if mode == "sets" {
						s, err := NewRuleSet("large", Ingress, versions[k%2], prev)
						if err != nil {
							done <- err
							return
						}
						prev = s
						p.Ingress = DirectionPolicy{Isolated: true, AllowSets: []*RuleSet{s}}
					}
					if _, err := e.Commit(large, p); err != nil {
						done <- err
						return
					}
					largeCommits++
				}
			}()
			var waits []time.Duration
			start := time.Now()
			for op := 0; b.Loop(); op++ {
				t := time.Now()
				if _, err := e.Commit(small, smalls[op%2]); err != nil {
					b.Fatal(err)
				}
				waits = append(waits, time.Since(t))
				time.Sleep(time.Millisecond) // updates arrive now and then, not back to back
			}
			elapsed := time.Since(start)
			close(stop)
			if err := <-done; err != nil {
				b.Fatal(err)
			}
			slices.Sort(waits)
			q := func(p float64) float64 {
				return float64(waits[min(len(waits)-1, int(p*float64(len(waits))))].Microseconds())
			}
			b.ReportMetric(q(0.5), "wait-p50-us")
			b.ReportMetric(q(0.99), "wait-p99-us")
			b.ReportMetric(float64(waits[len(waits)-1].Microseconds()), "wait-max-us")
			b.ReportMetric(float64(largeCommits)/elapsed.Seconds(), "large-commits/s")
		})
	}
}
