package reconcile

import (
	"testing"
	"time"

	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/testenv"
)

// BenchmarkColdStart10k is an agent's cold start with 10,000 PolicyEndpoints of about
// 1.5 KB in 100 namespaces (real apiserver, memory dataplane, no state from a previous
// process), 1 % of them selecting a pod on this node: from the start of the loop to
// its caches synced (synced-s), to every local pod holding its policy in the
// dataplane (programmed-s), and to ready — synced and every local object of the
// initial list programmed, what /readyz answers (ready-s). Figures, no assertion:
// the apiserver shares the machine's cores with the agent.
func BenchmarkColdStart10k(b *testing.B) { benchColdStart(b, 10000) }

// BenchmarkColdStart50k is BenchmarkColdStart10k with 50,000 objects.
func BenchmarkColdStart50k(b *testing.B) { benchColdStart(b, 50000) }

func benchColdStart(b *testing.B, n int) {
	const every = 100
	cp := testenv.Start(b)
	resolver := createMemPEsIn(b, cp, n, every, 100) // a cluster's objects span namespaces
	want := n / every
	for b.Loop() {
		dp := bpfmaps.NewMemory()
		start := time.Now()
		programmed := make(chan time.Duration, 1)
		go func() {
			for time.Since(start) < 5*time.Minute {
				if len(dp.Pods()) >= want {
					programmed <- time.Since(start)
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
			programmed <- -1
		}()
		a := startAgent(b, cp, agentOptions{nodeIP: benchNode, dp: dp, resolver: resolver})
		synced := time.Since(start)
		testenv.Eventually(b, 5*time.Minute, "ready", func() bool { return a.c.LocalPending() == 0 })
		ready := time.Since(start)
		p := <-programmed
		if p < 0 {
			b.Fatalf("%d of %d local pods programmed after 5 minutes", len(dp.Pods()), want)
		}
		b.Logf("%d objects, %d local: synced after %v, pods programmed after %v, ready after %v", n, want, synced, p, ready)
		b.ReportMetric(synced.Seconds(), "synced-s")
		b.ReportMetric(p.Seconds(), "programmed-s")
		b.ReportMetric(ready.Seconds(), "ready-s")
		a.stop()
	}
}
