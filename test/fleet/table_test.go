package fleet

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// result is one run's figures.
type result struct {
	variant                       string
	agents, objects, pods         int
	writes                        float64
	readyIn                       time.Duration
	noAgents, idle                usage // the churn before the agents; the agents without churn
	noAgentsWrites                int
	cold, steady, restart         usage
	steadyWrites                  int
	rss, peak                     []float64 // bytes per agent
	lat                           []time.Duration
	downUp, synced, syncedAfterUp time.Duration
	afterUpCPU                    float64 // the new apiserver's CPU after it was ready
	relisted                      int
	relay                         bool
	relayRSS                      float64
	reports, written              int
	dup, unexpected, missing      int
	errorLogs                     int
}

// The cost model's cluster (issue 23): N nodes, P PolicyEndpoints, W writes/s.
const (
	modelN = 5000
	modelP = 50000
	modelW = 50
)

func meanMax(xs []float64) (mean, most float64) {
	if len(xs) == 0 {
		return 0, 0
	}
	for _, x := range xs {
		mean += x
	}
	return mean / float64(len(xs)), slices.Max(xs)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }

const mib = 1 << 20

// markdown is the run's table, then the per-unit figures and the cost model they give.
func (r result) markdown() string {
	var b strings.Builder
	row := func(name, format string, args ...any) {
		fmt.Fprintf(&b, "| %s | "+format+" |\n", append([]any{name}, args...)...)
	}
	secs := r.steady.took.Seconds()
	cpuMean, cpuMax := meanMax(r.steady.agentCPU)
	rssMean, rssMax := meanMax(r.rss)
	peakMean, peakMax := meanMax(r.peak)
	rCPUMean, rCPUMax := meanMax(r.restart.agentCPU)
	idleMean, _ := meanMax(r.idle.agentCPU)
	fmt.Fprintf(&b, "| fleet | %s |\n|---|---|\n", r.variant)
	row("agents × objects (local to each), pods per node", "%d × %d (%d), %d", r.agents, r.objects, r.objects/r.agents, r.pods)
	row("baseline: apiserver CPU, the same churn and no agent", "%.3f cores (%d writes in %.0f s)", r.noAgents.apiCPU/r.noAgents.took.Seconds(), r.noAgentsWrites, r.noAgents.took.Seconds())
	row("baseline: apiserver CPU and agent CPU (mean), agents and no churn", "%.3f cores, %.1f ms/s", r.idle.apiCPU/r.idle.took.Seconds(), idleMean/r.idle.took.Seconds()*1e3)
	row("cold start: every agent ready", "%.1f s", r.readyIn.Seconds())
	row("cold start: apiserver CPU", "%.1f CPU-s (%.2f per agent)", r.cold.apiCPU, r.cold.apiCPU/float64(r.agents))
	row("steady: writes", "%d in %.0f s (%.1f/s)", r.steadyWrites, secs, float64(r.steadyWrites)/secs)
	row("steady: apiserver CPU", "%.3f cores", r.steady.apiCPU/secs)
	row("steady: etcd CPU", "%.3f cores", r.steady.etcdCPU/secs)
	row("steady: apiserver sent for PolicyEndpoints (watch events; lists gzipped)", "%.2f MB/s", r.steady.bytes/secs/1e6)
	row("steady: agent CPU, mean / max", "%.1f / %.1f ms/s", cpuMean/secs*1e3, cpuMax/secs*1e3)
	row("steady: agent RSS, mean / max", "%.1f / %.1f MiB", rssMean/mib, rssMax/mib)
	row("steady: trigger→commit p50 / p99 / max", "%.1f / %.1f / %.1f ms (%d reports)", ms(quantile(r.lat, 0.5)), ms(quantile(r.lat, 0.99)), ms(quantile(r.lat, 1)), len(r.lat))
	row("restart: apiserver stop → ready again", "%.1f s", r.downUp.Seconds())
	row("restart: every agent synced (committed a write made after)", "%.1f s after the stop (%.1f s after ready)", r.synced.Seconds(), r.syncedAfterUp.Seconds())
	row("restart: apiserver CPU, stop → synced (after ready)", "%.1f CPU-s (%.1f)", r.restart.apiCPU, r.afterUpCPU)
	row("restart: apiserver sent for PolicyEndpoints (lists gzipped), LIST requests", "%.1f MB, %.0f", r.restart.bytes/1e6, r.restart.lists)
	row("restart: agents that relisted", "%d of %d", r.relisted, r.agents)
	row("restart: agent CPU, mean / max", "%.2f / %.2f CPU-s", rCPUMean, rCPUMax)
	row("restart: peak agent RSS, mean / max", "%.1f / %.1f MiB", peakMean/mib, peakMax/mib)
	if r.relay {
		row("relay: CPU steady / restart, RSS", "%.3f cores / %.1f CPU-s, %.1f MiB", r.steady.relayCPU/secs, r.restart.relayCPU, r.relayRSS/mib)
	}
	row("exactly once: reports / triggers written", "%d / %d", r.reports, r.written)
	row("exactly once: twice / not written / missing", "%d / %d / %d", r.dup, r.unexpected, r.missing)
	row("agent ERROR log lines", "%d", r.errorLogs)

	// Per unit: what the agents add to the apiserver's steady CPU (over the same
	// churn with no agent) and the bytes it sends, per write delivered to one agent
	// (a watcher-event); the agent's CPU over its idle baseline per write in the
	// cluster (without a relay every agent receives every write); the apiserver's CPU
	// and bytes per object served in the relist storm (after it was ready: its own
	// boot left out); RSS per cluster object (the process's whole RSS: an upper bound).
	events := float64(r.steadyWrites) * float64(r.agents)
	served := float64(r.objects) * float64(r.agents)
	apiPerEvent := (r.steady.apiCPU/secs - r.noAgents.apiCPU/r.noAgents.took.Seconds()) * secs / events
	bytesPerEvent := r.steady.bytes / events
	agentPerEvent := (cpuMean/secs - idleMean/r.idle.took.Seconds()) * secs / float64(r.steadyWrites)
	relistPerObject := r.afterUpCPU / served
	relistBytes := r.restart.bytes / served
	rssPerObject := rssMean / float64(r.objects)
	peakPerObject := peakMean / float64(r.objects)
	fmt.Fprintf(&b, "\n| per unit (%s) | measured | at N = %d, P = %d, W = %d/s |\n|---|---|---|\n", r.variant, modelN, modelP, modelW)
	fmt.Fprintf(&b, "| apiserver CPU per write per agent (over no agent) | %.1f µs | %.1f cores |\n", apiPerEvent*1e6, apiPerEvent*modelN*modelW)
	fmt.Fprintf(&b, "| apiserver bytes per write per agent | %.0f B | %.0f MB/s |\n", bytesPerEvent, bytesPerEvent*modelN*modelW/1e6)
	fmt.Fprintf(&b, "| agent CPU per write in the cluster (over idle) | %.0f µs | %.1f ms/s per node, %.1f cores cluster-wide |\n",
		agentPerEvent*1e6, agentPerEvent*modelW*1e3, agentPerEvent*modelW*modelN)
	fmt.Fprintf(&b, "| agent RSS per cluster object (steady / restart peak) | %.1f / %.1f KB | %.0f / %.0f MB per node |\n",
		rssPerObject/1e3, peakPerObject/1e3, rssPerObject*modelP/1e6, peakPerObject*modelP/1e6)
	fmt.Fprintf(&b, "| relist storm: apiserver CPU per object served | %.1f µs | %.0f CPU-s |\n", relistPerObject*1e6, relistPerObject*modelN*modelP)
	fmt.Fprintf(&b, "| relist storm: apiserver bytes per object served | %.0f B | %.0f GB |\n", relistBytes, relistBytes*modelN*modelP/1e9)
	return b.String()
}
