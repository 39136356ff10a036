package fleet

import (
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/testenv"
	"github.com/npagent/npagent/internal/testenv/fixture"
)

// The run's shape. The defaults are a smoke profile (make fleet FLEET_ARGS=); make
// fleet sets the measured one (FLEET_ARGS).
var (
	flagAgents  = flag.Int("agents", 3, "agent processes, one node each")
	flagObjects = flag.Int("objects", 300, "PolicyEndpoints; object k's first pod is on node k mod agents")
	flagPods    = flag.Int("pods", 2, "local pods per node (a veth and host route each)")
	flagWrites  = flag.Float64("writes", 20, "churn: updates per second, each a new trigger")
	flagWindow  = flag.Duration("window", 5*time.Second, "steady churn measured")
	flagSettle  = flag.Duration("settle", time.Second, "pause between every agent ready and the steady churn")
	flagAfter   = flag.Duration("after", 2*time.Second, "churn after the apiserver restart (its triggers are checked too)")
	flagBase    = flag.Duration("baseline", 2*time.Second, "each baseline: the churn before any agent runs (the writes' own apiserver cost), "+
		"and the agents idle (their own CPU without writes)")
	flagRelay = flag.String("relay-cmd", "", "shell command (sh -c) that starts the relay before the agents; {npagent} is "+
		"the agent binary built for the run, {kubeconfig} an admin kubeconfig and {dir} a scratch directory (also in its "+
		"environment as FLEET_NPAGENT, FLEET_KUBECONFIG, FLEET_DIR). Its CPU and RSS are measured: start it with exec, "+
		"so the shell's pid is the relay's")
	flagAgentArgs = flag.String("agent-args", "", "extra arguments for every agent (space-separated, {npagent}, {kubeconfig} "+
		"and {dir} replaced), e.g. '--relay-url=https://127.0.0.1:7443 --relay-ca={dir}/ca.crt'")
	flagBuiltinRelay = flag.Bool("relay", false, "run the relay tier: npagent relay (the binary built for the run; TLS on "+
		"loopback, a self-signed certificate) before the agents, every agent pointed at it (--relay-url, --relay-ca)")
	flagVariant = flag.String("variant", "", "the variant's name in the table (default: apiserver, or relay with -relay-cmd)")
	flagTable   = flag.String("table", "", "also write the markdown table to this file")
)

// usage is what the processes consumed over a phase of the run.
type usage struct {
	apiCPU, etcdCPU, relayCPU float64 // CPU-seconds
	bytes                     float64 // the apiserver's PolicyEndpoint bytes sent
	lists                     float64 // its PolicyEndpoint LIST requests
	agentCPU                  []float64
	took                      time.Duration
}

// snapshot is the cumulative counters at one instant.
type snapshot struct {
	at                        time.Time
	apiCPU, etcdCPU, relayCPU float64
	bytes                     apiserverBytes
	agentCPU                  []float64
}

// EnvFleet selects TestFleet (make fleet sets it). Without it the test skips: even
// its smoke profile took 65-125 s on the shared 2-core machine (the agent's build,
// the control plane, an apiserver restart), so it is a profile, not a prerequisite,
// and make test leaves it out (TestRelayTier runs a fixed small run there).
const EnvFleet = "NPAGENT_FLEET"

// profile is a run's shape: TestFleet's comes from the flags, TestRelayTier's is
// fixed.
type profile struct {
	agents, objects, pods int
	writes                float64
	window, settle, after time.Duration
	base                  time.Duration
	relayCmd, agentArgs   string
	builtinRelay          bool
	variant               string
}

func flagProfile() profile {
	return profile{agents: *flagAgents, objects: *flagObjects, pods: *flagPods, writes: *flagWrites,
		window: *flagWindow, settle: *flagSettle, after: *flagAfter, base: *flagBase,
		relayCmd: *flagRelay, agentArgs: *flagAgentArgs, builtinRelay: *flagBuiltinRelay, variant: *flagVariant}
}

// TestFleet runs the fleet and prints the table (package doc). It needs root for
// the pods' interfaces and routes, and the tools (kube-apiserver, etcd) and the
// controller's CRDs (NPAGENT_UPSTREAM_CRDS).
func TestFleet(t *testing.T) {
	if os.Getenv(EnvFleet) != "1" {
		t.Skipf("%s=1 selects the fleet run (make fleet; make fleet FLEET_ARGS= for the smoke profile)", EnvFleet)
	}
	f := newFleetRun(t, flagProfile())
	f.baseline()
	f.startAgents()
	f.steadyChurn()
	f.restartAPIServer()
	res := f.finish()
	table := res.markdown()
	fmt.Printf("\n%s\n", table)
	if *flagTable != "" {
		if err := os.WriteFile(*flagTable, []byte(table), 0o644); err != nil {
			t.Error(err)
		}
	}
}

// fleetRun is one run of the harness: the control plane, the objects and their
// writer, the report sink, the relay if any and the agents, and the figures so far
// (res). Its phases run in order: baseline, startAgents, steadyChurn,
// restartAPIServer, finish.
type fleetRun struct {
	t               *testing.T
	p               profile
	ctx             context.Context
	nodes           []*node
	cp              *testenv.ControlPlane
	cs              kubernetes.Interface
	apiPID, etcdPID int
	relayPID        int
	dir, bin        string
	agentKubeconfig map[string]string
	extra, env      []string
	sockets         string
	w               *writer
	sink            *reportSink
	relay           *builtinRelay // with p.builtinRelay
	relayCmd        *exec.Cmd     // the relay's process, either kind
	res             result
	errorMsgs       map[string]int // the agents' ERROR lines by message, after finish
}

// newFleetRun starts the control plane, creates the nodes, their pods and the
// objects, and starts the relay if the profile has one; no agent runs yet.
func newFleetRun(t *testing.T, p profile) *fleetRun {
	t.Helper()
	agents, objects := p.agents, p.objects
	if agents < 1 || agents > 250 || objects < agents || p.pods < 1 || p.pods > 250 {
		t.Fatalf("-agents %d (1..250), -objects %d (≥ agents), -pods %d (1..250)", agents, objects, p.pods)
	}
	variant := p.variant
	if variant == "" {
		variant = "apiserver"
		if p.relayCmd != "" || p.builtinRelay {
			variant = "relay"
		}
	}
	f := &fleetRun{t: t, p: p, ctx: context.Background(), nodes: make([]*node, agents)}
	f.res = result{variant: variant, agents: agents, objects: objects, pods: p.pods, writes: p.writes}
	ctx, nodes := f.ctx, f.nodes
	for i := range nodes {
		nodes[i] = &node{name: fmt.Sprintf("fleet-%03d", i), ip: nodeIP(i)}
	}
	addPods(t, nodes, p.pods)

	cp := testenv.Start(t, testenv.WithCRDDir(testenv.UpstreamCRDDir(t)))
	f.cp, f.cs = cp, clientset(t, cp.Config)
	f.apiPID, f.etcdPID = childPID(t, "kube-apiserver"), childPID(t, "etcd")
	f.dir = t.TempDir()
	kubeconfig := filepath.Join(f.dir, "kubeconfig")
	testenv.WriteKubeconfig(t, cp.Config, kubeconfig)
	f.bin = buildAgent(t, f.dir)

	// The cluster: a Node per agent (the agent reads its addresses), then the objects.
	for _, n := range nodes {
		nd := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}}
		if err := cp.Client.Create(ctx, nd); err != nil {
			t.Fatalf("create Node %s: %v", n.name, err)
		}
		nd.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.ip}}
		if err := cp.Client.Status().Update(ctx, nd); err != nil {
			t.Fatalf("Node %s status: %v", n.name, err)
		}
	}
	if err := cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bench"}}); err != nil {
		t.Fatal(err)
	}
	f.w = &writer{c: cp.Client, objs: make([]*v1alpha1.PolicyEndpoint, objects), nodeOf: func(k int) string { return nodes[k%agents].name }}
	began := time.Now()
	if err := createObjects(ctx, f.w, nodes); err != nil {
		t.Fatal(err)
	}
	t.Logf("created %d PolicyEndpoints in %v (%d local to each of %d nodes, over %d pods each)",
		objects, time.Since(began).Round(time.Millisecond), objects/agents, agents, p.pods)

	f.sink = newReportSink(t)
	fill := strings.NewReplacer("{npagent}", f.bin, "{kubeconfig}", kubeconfig, "{dir}", f.dir).Replace
	// Every agent its own identity: a token bound to a pod on its node.
	f.agentKubeconfig = agentKubeconfigs(t, f.cs, cp.Config, f.dir, nodes)
	var relayArgs []string
	switch {
	case p.builtinRelay:
		f.relay = newBuiltinRelay(t, f.bin, kubeconfig, f.dir)
		f.relayCmd = f.relay.start(t)
		relayArgs = f.relay.agentArgs()
	case p.relayCmd != "":
		f.relayCmd = startRelay(t, fill(p.relayCmd), []string{"FLEET_NPAGENT=" + f.bin, "FLEET_KUBECONFIG=" + kubeconfig, "FLEET_DIR=" + f.dir})
	}
	if f.relayCmd != nil {
		f.relayPID = f.relayCmd.Process.Pid
	}
	f.res.relay = f.relayPID != 0
	f.extra = append(strings.Fields(fill(p.agentArgs)), relayArgs...)
	f.env = []string{
		"OTEL_TRACES_EXPORTER=otlp", "OTEL_METRICS_EXPORTER=none", "OTEL_LOGS_EXPORTER=none",
		"OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf", "OTEL_EXPORTER_OTLP_ENDPOINT=" + f.sink.URL,
		"OTEL_BSP_SCHEDULE_DELAY=500",
	}
	sockets, err := os.MkdirTemp("", "npfleet") // unix socket paths are short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockets) })
	f.sockets = sockets
	return f
}

func (f *fleetRun) snap() snapshot {
	s := snapshot{at: time.Now(), apiCPU: cpuSeconds(f.apiPID), etcdCPU: cpuSeconds(f.etcdPID), bytes: scrapeAPIServer(f.t, f.cs)}
	if f.relayPID != 0 {
		s.relayCPU = cpuSeconds(f.relayPID)
	}
	for _, n := range f.nodes {
		if n.agent != nil {
			s.agentCPU = append(s.agentCPU, cpuSeconds(n.agent.pid()))
		}
	}
	return s
}

func since(a, b snapshot) usage {
	u := usage{apiCPU: b.apiCPU - a.apiCPU, etcdCPU: b.etcdCPU - a.etcdCPU, relayCPU: b.relayCPU - a.relayCPU,
		bytes: b.bytes.total() - a.bytes.total(), lists: b.bytes.lists - a.bytes.lists, took: b.at.Sub(a.at)}
	for i := range b.agentCPU {
		if i < len(a.agentCPU) {
			u.agentCPU = append(u.agentCPU, b.agentCPU[i]-a.agentCPU[i])
		} else {
			u.agentCPU = append(u.agentCPU, b.agentCPU[i])
		}
	}
	return u
}

// baseline runs the churn with no agent, so what the agents add to the apiserver's
// CPU can be told from what the writes cost it anyway. Its triggers predate every
// agent (before_start): not expected to be reported.
func (f *fleetRun) baseline() {
	b0 := f.snap()
	if err := f.w.churn(f.ctx, f.p.writes, f.p.base, func(int) bool { return false }); err != nil {
		f.t.Fatalf("churn: %v", err)
	}
	f.res.noAgents = since(b0, f.snap())
	f.res.noAgentsWrites = len(f.w.all())
	f.w.mu.Lock()
	f.w.writes = nil
	f.w.mu.Unlock()
}

// startAgents is the cold start: every agent at once, until each /readyz answers
// 200; then the settle pause and the idle baseline (the agents without churn).
func (f *fleetRun) startAgents() {
	t := f.t
	cold0 := f.snap()
	for i, n := range f.nodes {
		args := append([]string{
			"--kubeconfig=" + f.agentKubeconfig[n.name],
			"--node-name=" + n.name,
			"--node-ip=" + n.ip,
			"--dataplane=memory",
			"--state-file=" + filepath.Join(f.dir, n.name, "seen.state"),
			"--metrics-addr=127.0.0.1:0",
			"--health-addr=127.0.0.1:0",
			"--log-format=json",
			"--debug-socket=" + filepath.Join(f.sockets, strconv.Itoa(i)+".sock"),
		}, f.extra...)
		n.agent = startAgent(t, f.bin, f.env, args)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range f.nodes {
				t.Logf("agent %s (pid %d), last lines of its log:\n%s", n.name, n.agent.pid(), n.agent.logs())
			}
		}
	})
	for _, n := range f.nodes {
		n.agent.waitHTTP(t)
	}
	f.res.readyIn = waitAll(t, f.nodes, 10*time.Minute, "/readyz 200", func(n *node) bool { return n.agent.ready() })
	f.res.cold = since(cold0, f.snap())
	t.Logf("cold start: every agent ready %v after the start; apiserver %.1f CPU-s", f.res.readyIn.Round(time.Millisecond), f.res.cold.apiCPU)
	time.Sleep(f.p.settle) // let the initial work settle
	i0 := f.snap()
	time.Sleep(f.p.base)
	f.res.idle = since(i0, f.snap())
}

// steadyChurn measures the steady churn, until every trigger of it is reported,
// and returns its first and last snapshots.
func (f *fleetRun) steadyChurn() (s0, s1 snapshot) {
	t := f.t
	s0 = f.snap()
	if err := f.w.churn(f.ctx, f.p.writes, f.p.window, func(int) bool { return false }); err != nil {
		t.Fatalf("churn: %v", err)
	}
	s1 = f.snap()
	f.res.steady = since(s0, s1)
	windowWrites := f.w.all()
	f.res.steadyWrites = len(windowWrites)
	f.res.rss = make([]float64, len(f.nodes))
	for i, n := range f.nodes {
		r, _ := memStatus(n.agent.pid())
		f.res.rss[i] = float64(r)
	}
	testenv.Eventually(t, 2*time.Minute, "every trigger of the steady churn reported", func() bool {
		return allReported(f.sink.snapshot(), windowWrites)
	})
	f.res.lat = latencies(f.sink.snapshot(), windowWrites)
	t.Logf("steady: %d writes in %v, %d reports", len(windowWrites), f.res.steady.took.Round(time.Millisecond), len(f.res.lat))
	return s0, s1
}

// restartAPIServer is the apiserver restart: from its stop until every agent has
// committed a probe written to one of its local objects once the apiserver is back.
func (f *fleetRun) restartAPIServer() {
	t, ctx, nodes := f.t, f.ctx, f.nodes
	relists := func() []float64 {
		var r []float64
		for _, n := range nodes {
			r = append(r, n.agent.metric("npagent_watch_relists_total", `npagent_policy_kind="PolicyEndpoint"`))
		}
		return r
	}
	relists0 := relists()
	peak := make([]float64, len(nodes))
	samplerDone := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			for i, n := range nodes {
				r, _ := memStatus(n.agent.pid())
				peak[i] = max(peak[i], float64(r))
			}
			select {
			case <-samplerDone:
				return
			case <-tick.C:
			}
		}
	}()
	r0 := f.snap()
	reaped0 := childrenCPU()
	stopAt := time.Now()
	f.cp.StopAPIServer(t)
	oldAPICPU := childrenCPU() - reaped0 // the stopped apiserver, reaped by envtest
	f.cp.StartAPIServer(t)
	upAt := time.Now()
	f.apiPID = childPID(t, "kube-apiserver")
	bootCPU := cpuSeconds(f.apiPID) // the new apiserver's own start, before the storm
	var probes []write
	for i := range nodes {
		wr, err := f.w.update(ctx, i) // object i is local to node i
		if err != nil {
			t.Fatalf("probe write: %v", err)
		}
		probes = append(probes, wr)
	}
	var syncedAt time.Time
	testenv.Eventually(t, 10*time.Minute, "every agent to commit its probe write after the apiserver restart", func() bool {
		if !allReported(f.sink.snapshot(), probes) {
			return false
		}
		syncedAt = time.Now()
		return true
	})
	r1 := f.snap()
	close(samplerDone)
	sampler.Wait()
	restart := usage{
		apiCPU:   oldAPICPU - r0.apiCPU + r1.apiCPU, // the old one's stop, the new one's whole life
		etcdCPU:  r1.etcdCPU - r0.etcdCPU,
		relayCPU: r1.relayCPU - r0.relayCPU,
		bytes:    r1.bytes.total(), // the new apiserver's counters start at zero
		lists:    r1.bytes.lists,
		took:     r1.at.Sub(stopAt),
	}
	for i := range r1.agentCPU {
		restart.agentCPU = append(restart.agentCPU, r1.agentCPU[i]-r0.agentCPU[i])
	}
	var committed time.Time // the last probe's commit, by the agent's own clock
	for _, r := range f.sink.snapshot() {
		for _, p := range probes {
			if r.key() == p.key() && r.end.After(committed) {
				committed = r.end
			}
		}
	}
	relisted := 0
	for i, r := range relists() {
		if r > relists0[i] {
			relisted++
		}
	}
	t.Logf("restart: apiserver down and up in %v; every agent committed its probe %v after the stop (%v after the apiserver was ready; seen by the test %v after the stop); %d of %d agents relisted",
		upAt.Sub(stopAt).Round(time.Millisecond), committed.Sub(stopAt).Round(time.Millisecond), committed.Sub(upAt).Round(time.Millisecond),
		syncedAt.Sub(stopAt).Round(time.Millisecond), relisted, len(nodes))
	f.res.restart, f.res.downUp, f.res.synced, f.res.syncedAfterUp = restart, upAt.Sub(stopAt), committed.Sub(stopAt), committed.Sub(upAt)
	f.res.afterUpCPU, f.res.peak, f.res.relisted = r1.apiCPU-bootCPU, peak, relisted
}

// finish runs more churn after the restart, then checks exactly once over the
// whole run (t.Error for each fault) and that no agent exited, and counts and logs
// the agents' ERROR lines by message (f.errorMsgs).
func (f *fleetRun) finish() result {
	t := f.t
	if err := f.w.churn(f.ctx, f.p.writes, f.p.after, func(int) bool { return false }); err != nil {
		t.Fatalf("churn after the restart: %v", err)
	}
	all := f.w.all()
	testenv.Eventually(t, 2*time.Minute, "every trigger written reported", func() bool { return allReported(f.sink.snapshot(), all) })
	time.Sleep(2 * time.Second) // time for a second report of anything to arrive
	reports := f.sink.snapshot()
	dup, unexpected, missing, examples := exactlyOnce(reports, all)
	for _, e := range examples {
		t.Error(e)
	}
	errorLogs, errorMsgs := 0, map[string]int{}
	for _, n := range f.nodes {
		select {
		case <-n.agent.done:
			t.Errorf("agent %s exited: %v", n.name, n.agent.exit)
		default:
		}
		errorLogs += n.agent.errors()
		n.agent.errorMessages(errorMsgs)
	}
	for m, n := range errorMsgs {
		t.Logf("agents logged %d× at ERROR: %s", n, m)
	}
	f.errorMsgs = errorMsgs
	res := f.res
	res.reports, res.written, res.dup, res.unexpected, res.missing, res.errorLogs = len(reports), len(all), dup, unexpected, missing, errorLogs
	if f.relayPID != 0 {
		r, _ := memStatus(f.relayPID)
		res.relayRSS = float64(r)
	}
	return res
}

// createObjects creates the fleet's objects: BenchPE k with its first pod moved to
// node k mod N (one of its local pods), from 8 goroutines.
func createObjects(ctx context.Context, w *writer, nodes []*node) error {
	const creators = 8
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	for g := range creators {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := g; k < len(w.objs); k += creators {
				n := nodes[k%len(nodes)]
				pe := fixture.BenchPE(k, 1)
				pe.UID, pe.ResourceVersion = "", ""
				pe.Spec.PodSelectorEndpoints[0].HostIP = v1alpha1.NetworkAddress(n.ip)
				pe.Spec.PodSelectorEndpoints[0].PodIP = v1alpha1.NetworkAddress(n.pods[k/len(nodes)%len(n.pods)])
				if err := w.c.Create(ctx, pe); err != nil {
					mu.Lock()
					first = firstErr(first, fmt.Errorf("create %s: %w", pe.Name, err))
					mu.Unlock()
					return
				}
				w.objs[k] = pe
			}
		}()
	}
	wg.Wait()
	return first
}

func firstErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// startRelay runs the relay command and returns its process (killed at cleanup).
func startRelay(t testing.TB, command string, env []string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sh", "-c", command)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("relay: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	t.Logf("relay started (pid %d): %s", cmd.Process.Pid, command)
	return cmd
}

// waitAll polls cond for every node until each has held once, and returns how long
// that took.
func waitAll(t *testing.T, nodes []*node, timeout time.Duration, what string, cond func(*node) bool) time.Duration {
	t.Helper()
	start := time.Now()
	left := slices.Clone(nodes)
	for len(left) > 0 {
		left = slices.DeleteFunc(left, cond)
		if len(left) == 0 {
			break
		}
		if time.Since(start) > timeout {
			t.Fatalf("%d of %d agents not %s within %v (first: %s)", len(left), len(nodes), what, timeout, left[0].name)
		}
		time.Sleep(250 * time.Millisecond)
	}
	return time.Since(start)
}

// childrenCPU is the CPU time of this process's children that have exited and been
// waited for (cutime + cstime of /proc/self/stat), seconds.
func childrenCPU() float64 {
	raw, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return 0
	}
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	cu, _ := strconv.ParseFloat(f[13], 64) // field 16
	cs, _ := strconv.ParseFloat(f[14], 64) // field 17
	return (cu + cs) / clockTicks
}

// latencies is the trigger→commit latency of each report of a write in ws.
func latencies(reports []programReport, ws []write) []time.Duration {
	want := map[string]bool{}
	for _, w := range ws {
		want[w.key()] = true
	}
	var out []time.Duration
	for _, r := range reports {
		if want[r.key()] {
			out = append(out, r.latency())
		}
	}
	slices.Sort(out)
	return out
}

func quantile(xs []time.Duration, q float64) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	return xs[min(len(xs)-1, int(math.Ceil(q*float64(len(xs))))-1)]
}
