package main

// Faults at the binary level: the agent binary against a real kube-apiserver and
// etcd (internal/testenv), reporting through a real OpenTelemetry Collector to an
// OTLP sink in the test, where every reported trigger is one policy.program root
// span (uid, trigger time, start = trigger, end = commit). Each test runs a short
// profile under make test (and make e2e) and the full one under make e2e-full (NPAGENT_E2E=1).

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/seen"
	"github.com/npagent/npagent/internal/testenv"
	"github.com/npagent/npagent/internal/testenv/netlab"
	"github.com/npagent/npagent/internal/testenv/otlptest"
)

const deliveries = "npagent_policy_deliveries_total"

// watchExpired reports whether a watch of PolicyEndpoints from rv is answered 410
// Gone (etcd compacted past rv), as the agent's own watch would be.
func watchExpired(ctx context.Context, t *testing.T, cp *testenv.ControlPlane, rv string) bool {
	t.Helper()
	wc, err := client.NewWithWatch(cp.Config, client.Options{Scheme: cp.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	w, err := wc.Watch(ctx, &v1alpha1.PolicyEndpointList{}, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
	if err != nil {
		return apierrors.IsResourceExpired(err) || apierrors.IsGone(err)
	}
	defer w.Stop()
	select {
	case ev := <-w.ResultChan():
		st, ok := ev.Object.(*metav1.Status)
		return ev.Type == watch.Error && ok && st.Code == http.StatusGone
	case <-time.After(2 * time.Second):
		return false
	}
}

// reportsByKey counts the reports of each (uid, trigger).
func reportsByKey(rs []programReport) map[string]int {
	n := map[string]int{}
	for _, r := range rs {
		n[r.key()]++
	}
	return n
}

// checkTrueLatency: the span runs from the trigger written to the commit, and the
// latency attribute is that span's length.
func checkTrueLatency(t *testing.T, r programReport) {
	t.Helper()
	trig := parseTrigger(t, r.trigger)
	if !r.start.Equal(trig) {
		t.Errorf("%s %s: span starts %s, not at its trigger", r.name, r.uid, r.start.UTC().Format(time.RFC3339Nano))
	}
	if d := r.end.Sub(r.start).Seconds() - r.latency; d > 1e-6 || d < -1e-6 {
		t.Errorf("%s %s: latency attribute %.6fs, span length %.6fs", r.name, r.uid, r.latency, r.end.Sub(r.start).Seconds())
	}
}

// TestFault410RelistWithChangesInTheGap: the agent's connection to the apiserver is
// cut (the proxy refuses connections, as a down apiserver does; the full profile
// also restarts the apiserver meanwhile). While cut, an object is updated, one
// deleted, one deleted and recreated under its name, one created; the apiserver runs
// without a watch cache and etcd is compacted past the agent's resourceVersion, so
// its watch is answered 410 Gone when the connection returns, and it relists. Then
// each change is reported exactly once, with its true latency (from the trigger
// written during the gap to the commit after the return); the recreated object under
// its new uid; nothing twice; and in the pinned eBPF state the deleted object's pods
// (and the recreated object's old pod) have no enforcement left.
func TestFault410RelistWithChangesInTheGap(t *testing.T) {
	skipIfShort(t)
	prof := profile(t)
	pods := addLocalPods(t, 6)
	netlab.HostBPFFS(t)
	pin := fmt.Sprintf("/sys/fs/bpf/npagent-faults-%d", os.Getpid())
	t.Cleanup(func() { os.RemoveAll(pin) })

	cp := testenv.Start(t,
		testenv.WithAPIServerArg("watch-cache", "false"),           // watches read etcd: a compacted revision is 410
		testenv.WithAPIServerArg("etcd-compaction-interval", "2s"), // the apiserver compacts etcd every 2s
	)
	proxy, kubeconfig := proxiedKubeconfig(t, cp.Config)
	sink := newSpanSink(t)
	col := otlptest.StartCollector(t, sink.URL)
	stateFile := filepath.Join(t.TempDir(), "state", "seen.state")
	ctx := context.Background()
	w := &writer{t: t, c: cp.Client}

	a := startAgentEnv(t, otlpEnv(col), kubeconfig, stateFile, "--dataplane=ebpf", "--bpffs-path="+pin)
	testenv.Eventually(t, 60*time.Second, "/readyz 200", func() bool { code, _ := a.get(t, "/readyz"); return code == http.StatusOK })

	// Before the gap: four objects, each with a pod of its own, each reported once.
	initial := map[string]written{}
	for name, pod := range map[string]localPod{"upd": pods[0], "del": pods[1], "recr": pods[2], "still": pods[3]} {
		rec, err := w.create(ctx, name, pod.ip)
		if err != nil {
			t.Fatal(err)
		}
		initial[name] = rec
	}
	testenv.Eventually(t, 60*time.Second, "the four creates to be reported", func() bool { return len(sink.snapshot()) >= 4 })
	var list v1alpha1.PolicyEndpointList
	if err := cp.Client.List(ctx, &list); err != nil {
		t.Fatal(err)
	}
	agentRV := list.ResourceVersion // the agent's watches are at or before it
	relistsBefore := a.metric(t, deliveries, `cause="relist"`)

	// The gap.
	proxy.cut()
	cutAt := time.Now()
	upd, err := w.update(ctx, "upd", 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.delete(ctx, "del"); err != nil {
		t.Fatal(err)
	}
	if err := w.delete(ctx, "recr"); err != nil {
		t.Fatal(err)
	}
	recr, err := w.create(ctx, "recr", pods[4].ip) // same name, new uid, another pod
	if err != nil {
		t.Fatal(err)
	}
	created, err := w.create(ctx, "new", pods[5].ip)
	if err != nil {
		t.Fatal(err)
	}
	if recr.uid == initial["recr"].uid {
		t.Fatalf("recreated recr kept its uid %s", recr.uid)
	}
	if prof.restart {
		cp.RestartAPIServer(t)
	}
	testenv.Eventually(t, 60*time.Second, "etcd compacted past the agent's resourceVersion "+agentRV+" (a watch from it is 410 Gone)",
		func() bool { return watchExpired(ctx, t, cp, agentRV) })
	proxy.restore()
	restoredAt := time.Now()
	t.Logf("gap: %v cut, restored %v after the first write in it", restoredAt.Sub(cutAt).Round(time.Millisecond), restoredAt.Sub(upd.at).Round(time.Millisecond))

	gapWrites := []written{upd, recr, created}
	testenv.Eventually(t, 90*time.Second, "the three triggers written during the gap to be reported", func() bool {
		n := reportsByKey(sink.snapshot())
		for _, g := range gapWrites {
			if n[g.uid+" "+g.trigger] == 0 {
				return false
			}
		}
		return true
	})
	reportedAt := time.Now()
	if n := a.metric(t, deliveries, `cause="relist"`); n <= relistsBefore {
		t.Errorf("relist deliveries %v → %v: the agent did not relist after the 410", relistsBefore, n)
	}
	// Resyncs every second, and a relist: time for any second report to arrive.
	time.Sleep(4 * time.Second)

	reports := sink.snapshot()
	counts := reportsByKey(reports)
	want := []written{initial["upd"], initial["del"], initial["recr"], initial["still"], upd, recr, created}
	for _, wr := range want {
		if c := counts[wr.uid+" "+wr.trigger]; c != 1 {
			t.Errorf("%s (%s) uid %s trigger %s reported %d times, want once", wr.name, wr.op, wr.uid, wr.trigger, c)
		}
	}
	if len(reports) != len(want) {
		t.Errorf("%d reports, want %d (one per trigger written):", len(reports), len(want))
		for _, r := range reports {
			t.Logf("  %s uid %s trigger %s latency %.3fs", r.name, r.uid, r.trigger, r.latency)
		}
	}
	for _, r := range reports {
		checkTrueLatency(t, r)
		if r.name == "recr" && r.trigger == recr.trigger && r.uid != recr.uid {
			t.Errorf("recreated recr's trigger reported under uid %s, want its new uid %s", r.uid, recr.uid)
		}
		for _, g := range gapWrites {
			if r.uid != g.uid || r.trigger != g.trigger {
				continue
			}
			// Written during the gap, programmed only after it: the latency covers the
			// wait, and ends when the agent committed after the connection returned.
			waited := restoredAt.Sub(parseTrigger(t, g.trigger))
			if r.end.Before(restoredAt) || r.end.After(reportedAt) {
				t.Errorf("%s (%s): committed at %s, not between the return %s and the report %s", g.name, g.op,
					r.end.Format(time.StampMilli), restoredAt.Format(time.StampMilli), reportedAt.Format(time.StampMilli))
			}
			t.Logf("%s (%s during the gap): latency %.3fs, waited %.3fs in the gap, %.3fs after the return",
				g.name, g.op, r.latency, waited.Seconds(), r.latency-waited.Seconds())
		}
	}
	for _, r := range reports {
		if r.uid == initial["recr"].uid && r.trigger != initial["recr"].trigger {
			t.Errorf("recr's old uid %s reported trigger %s", r.uid, r.trigger)
		}
	}
	t.Logf("relist deliveries %v → %v; redelivered %v", relistsBefore, a.metric(t, deliveries, `cause="relist"`), a.metric(t, suppressed, `reason="redelivered"`))

	// Enforcement, as pinned: the agent leaves it in bpffs when it exits.
	if code := a.stop(t); code != 0 {
		t.Fatalf("exit code after SIGTERM = %d, want 0", code)
	}
	dp, err := bpfmaps.OpenEBPF(bpfmaps.EBPFOptions{PinPath: pin})
	if err != nil {
		t.Fatalf("open the agent's pinned dataplane: %v", err)
	}
	enforced := dp.Pods()
	dp.Close()
	for name, p := range map[string]localPod{"upd": pods[0], "still": pods[3], "recr (new uid)": pods[4], "new": pods[5]} {
		if !slices.Contains(enforced, p.ifindex) {
			t.Errorf("%s's pod %s (%s, ifindex %d) has no enforcement; pinned pods %v", name, p.ip, p.ifname, p.ifindex, enforced)
		}
	}
	for name, p := range map[string]localPod{"del (deleted)": pods[1], "recr (old uid)": pods[2]} {
		if slices.Contains(enforced, p.ifindex) {
			t.Errorf("%s's pod %s (%s, ifindex %d) is still enforced after the relist; pinned pods %v", name, p.ip, p.ifname, p.ifindex, enforced)
		}
	}
	if t.Failed() {
		t.Logf("agent log:\n%s", lastLines(a.logs(), 80))
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// churner changes PolicyEndpoints at random through the real apiserver: mostly
// spec updates, some delete-and-recreate under the same name (a new uid), some
// deletes and creates.
type churner struct {
	w    *writer
	pods []localPod
	rng  *rand.Rand
	live []string
	made int
}

func (c *churner) podFor(n int) string { return c.pods[n%len(c.pods)].ip }

func (c *churner) create(ctx context.Context) error {
	name := fmt.Sprintf("churn-%d", c.made)
	c.made++
	if _, err := c.w.create(ctx, name, c.podFor(c.made)); err != nil {
		return err
	}
	c.live = append(c.live, name)
	return nil
}

func (c *churner) step(ctx context.Context, n int) error {
	i := c.rng.IntN(len(c.live))
	name := c.live[i]
	switch op := c.rng.Float64(); {
	case op < 0.05 && len(c.live) > 4:
		c.live = slices.Delete(c.live, i, i+1)
		return c.w.delete(ctx, name)
	case op < 0.10:
		return c.create(ctx)
	case op < 0.25:
		if err := c.w.delete(ctx, name); err != nil {
			return err
		}
		_, err := c.w.create(ctx, name, c.podFor(n))
		return err
	default:
		_, err := c.w.update(ctx, name, n)
		return err
	}
}

// run writes every interval until ctx ends.
func (c *churner) run(ctx context.Context, t *testing.T, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if err := c.step(context.Background(), n); err != nil {
			t.Errorf("churn: %v", err)
			return
		}
	}
}

// agentRun is one process of the agent: from its start to its SIGKILL (or SIGTERM).
type agentRun struct {
	start, synced, end time.Time // synced: its informer caches synced (zero: killed before)
}

// consumed reports whether the agent's state file holds trigger as consumed for uid
// (not merely pending): a copy is restored into a seen-set, which answers
// redelivered for a trigger it consumed or holds pending.
func consumed(t *testing.T, stateFile, uid string, trigger time.Time) bool {
	t.Helper()
	raw, err := os.ReadFile(stateFile)
	if err != nil {
		t.Fatalf("read state file: %v", err)
	}
	cp := filepath.Join(t.TempDir(), "seen.state")
	if err := os.WriteFile(cp, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := seen.New(time.Now(), seen.WithStatePath(cp))
	if err != nil {
		t.Fatalf("restore the agent's state file: %v", err)
	}
	if p, ok := s.Pending(uid); ok && p.Equal(trigger) {
		return false
	}
	return s.Observe(uid, trigger, time.Now()) == report.Redelivered
}

// syncedAt is when the agent logged that its informer caches synced.
func syncedAt(a *agentProcess) time.Time {
	for _, line := range strings.Split(a.logs(), "\n") {
		var rec struct {
			Time time.Time
			Msg  string
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "informer caches synced" {
			return rec.Time
		}
	}
	return time.Time{}
}

// TestFaultSIGKILLMidChurn: while a writer changes PolicyEndpoints ten times a
// second, the agent binary is SIGKILLed at random points (before its caches sync,
// mid-commit, between commits), left down for a random while and restarted with
// the same state file — 3 times in the short profile, 10 in the full one — then runs
// to the end. Across all runs no (uid, trigger) is reported twice; every report is
// a trigger that was written, its span from the trigger to the commit; a trigger
// written while no agent ran is committed only after the next start, so its latency
// includes the downtime it waited; and every object live at the end has its last
// trigger reported exactly once.
func TestFaultSIGKILLMidChurn(t *testing.T) {
	skipIfShort(t)
	prof := profile(t)
	pods := addLocalPods(t, 6)
	buildAgent(t) // before the churn: no downtime for the build
	cp := testenv.Start(t)
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	testenv.WriteKubeconfig(t, cp.Config, kubeconfig)
	stateFile := filepath.Join(dir, "state", "seen.state")
	sink := newSpanSink(t)
	col := otlptest.StartCollector(t, sink.URL)
	ctx := context.Background()

	seed := uint64(time.Now().UnixNano())
	t.Logf("random seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 11))
	ch := &churner{w: &writer{t: t, c: cp.Client}, pods: pods, rng: rand.New(rand.NewPCG(seed, 12))}
	for range 8 {
		if err := ch.create(ctx); err != nil {
			t.Fatal(err)
		}
	}
	churnCtx, stopChurn := context.WithCancel(ctx)
	churnDone := make(chan struct{})
	go func() { defer close(churnDone); ch.run(churnCtx, t, 100*time.Millisecond) }()
	defer func() { stopChurn(); <-churnDone }()

	var runs []agentRun
	for i := range prof.kills {
		start := time.Now()
		a := startAgentEnv(t, otlpEnv(col), kubeconfig, stateFile)
		time.Sleep(time.Duration(rng.Int64N(int64(3 * time.Second))))
		if err := a.cmd.Process.Kill(); err != nil {
			t.Fatalf("SIGKILL: %v", err)
		}
		<-a.done
		runs = append(runs, agentRun{start: start, synced: syncedAt(a), end: time.Now()})
		down := 500*time.Millisecond + time.Duration(rng.Int64N(int64(2*time.Second)))
		t.Logf("run %d: killed %v after its start; down for %v", i+1, runs[i].end.Sub(start).Round(time.Millisecond), down.Round(time.Millisecond))
		time.Sleep(down)
	}
	start := time.Now()
	a := startAgentEnv(t, otlpEnv(col), kubeconfig, stateFile)
	runs = append(runs, agentRun{start: start})
	testenv.Eventually(t, 60*time.Second, "/readyz 200 after the last restart", func() bool { code, _ := a.get(t, "/readyz"); return code == http.StatusOK })
	time.Sleep(3 * time.Second) // churn on under the last run
	stopChurn()
	<-churnDone

	// Every object live at the end has its last trigger reported — unless a run
	// consumed it in its state file and was SIGKILLed before the span left it: the
	// state is persisted before the reports are emitted, so a kill in between loses
	// the report rather than risk it twice. The state file tells the two apart.
	var list v1alpha1.PolicyEndpointList
	if err := cp.Client.List(ctx, &list); err != nil {
		t.Fatal(err)
	}
	writes := ch.w.all()
	byKey := map[string]written{}
	for _, w := range writes {
		byKey[w.uid+" "+w.trigger] = w
	}
	last := map[string]string{} // uid → its last trigger
	for _, pe := range list.Items {
		last[string(pe.UID)] = pe.Annotations[v1alpha1.AnnotationLastChangeTriggerTime]
	}
	unreportedLast := func() int {
		n, missing := reportsByKey(sink.snapshot()), 0
		for uid, trig := range last {
			if n[uid+" "+trig] == 0 {
				missing++
			}
		}
		return missing
	}
	// Until all are reported, or nothing new arrives for 10s.
	for seen, quiet := len(sink.snapshot()), time.Now(); unreportedLast() > 0 && time.Since(quiet) < 10*time.Second; time.Sleep(50 * time.Millisecond) {
		if n := len(sink.snapshot()); n != seen {
			seen, quiet = n, time.Now()
		}
	}
	time.Sleep(3 * time.Second) // resyncs: time for a second report to arrive
	beforeStart := a.metric(t, suppressed, `reason="before_start"`)
	lastRun := fmt.Sprintf("redelivered %v, before_start %v, stale %v", a.metric(t, suppressed, `reason="redelivered"`),
		beforeStart, a.metric(t, suppressed, `reason="stale"`))
	// The last run started after a downtime with writes in it: none of them may be
	// hidden as older than what the previous runs had seen.
	if beforeStart != 0 {
		t.Errorf("the last run suppressed %v triggers as before_start", beforeStart)
	}
	if code := a.stop(t); code != 0 {
		t.Fatalf("exit code after SIGTERM = %d, want 0", code)
	}
	runs[len(runs)-1].end = time.Now()
	runs[len(runs)-1].synced = syncedAt(a)

	reports := sink.snapshot()
	counts := reportsByKey(reports)
	for k, n := range counts {
		if n != 1 {
			t.Errorf("(uid, trigger) %s reported %d times", k, n)
		}
		if _, ok := byKey[k]; !ok {
			t.Errorf("(uid, trigger) %s reported but never written", k)
		}
	}
	lostLive := 0
	for uid, trig := range last {
		n := counts[uid+" "+trig]
		if n == 0 && consumed(t, stateFile, uid, parseTrigger(t, trig)) {
			lostLive++
			t.Logf("live object %s: last trigger %s consumed in the state file by a SIGKILLed run, its report lost with the process", uid, trig)
			continue
		}
		if n != 1 {
			t.Errorf("live object %s: last trigger %s reported %d times, want once", uid, trig, n)
		} else if !consumed(t, stateFile, uid, parseTrigger(t, trig)) {
			t.Errorf("live object %s: last trigger %s reported but not consumed in the state file: a restart would report it again", uid, trig)
		}
	}

	// Triggers written while no agent ran: committed after the next start.
	downtime := func(trig time.Time, at time.Time) (next time.Time, ok bool) {
		for i := 0; i+1 < len(runs); i++ {
			if !trig.Before(runs[i].end) && at.Before(runs[i+1].start) {
				return runs[i+1].start, true
			}
		}
		return time.Time{}, false
	}
	var measured, minWaited, maxWaited, maxLatency time.Duration
	minWaited = time.Hour
	for _, r := range reports {
		checkTrueLatency(t, r)
		w, ok := byKey[r.key()]
		if !ok {
			continue
		}
		trig := parseTrigger(t, w.trigger)
		next, ok := downtime(trig, w.at)
		if !ok {
			continue
		}
		waited := next.Sub(trig)
		if r.end.Before(next) {
			t.Errorf("%s %s written during a downtime was committed at %s, before the next agent started at %s",
				w.name, w.trigger, r.end.Format(time.StampMilli), next.Format(time.StampMilli))
		}
		measured++
		minWaited, maxWaited = min(minWaited, waited), max(maxWaited, waited)
		maxLatency = max(maxLatency, r.end.Sub(r.start))
	}
	if measured == 0 {
		t.Errorf("no trigger written while the agent was down was reported (%d writes, %d runs)", len(writes), len(runs))
	}
	// Triggers never reported: superseded before a synced agent saw them, deleted
	// before their commit, or lost with a SIGKILLed run.
	unreported := 0
	for k := range byKey {
		if counts[k] == 0 {
			unreported++
		}
	}
	t.Logf("%d runs (%d SIGKILLed), %d triggers written, %d reported once, 0 twice, %d never reported (superseded or deleted before a synced agent committed them, or lost with a SIGKILL; %d of them the last trigger of a live object, consumed by a killed run); "+
		"%d written during a downtime and reported: waited %v … %v before the next start, latency up to %v",
		len(runs), len(runs)-1, len(byKey), len(counts), unreported, lostLive, measured, minWaited.Round(time.Millisecond), maxWaited.Round(time.Millisecond), maxLatency.Round(time.Millisecond))
	t.Logf("last run's suppressions: %s", lastRun)
}

// TestFaultCollectorOutage: the agent exports to a real collector with every OTLP
// timeout at its default while a writer changes PolicyEndpoints ten times a second.
// The collector is SIGKILLed for 10s (short profile) or 30s (full), then restarted
// on its port; latency is compared over windows of 6s (30s) before and after. Reconcile latency (the agent's own latency histogram, trigger →
// commit, scraped from /metrics) does not grow with the outage; every span that
// did not reach the collector is counted as dropped; resident memory stays
// bounded; and, with the collector down again, SIGTERM ends the agent within its
// shutdown timeout, exit 0.
func TestFaultCollectorOutage(t *testing.T) {
	skipIfShort(t)
	prof := profile(t)
	pods := addLocalPods(t, 4)
	buildAgent(t)
	cp := testenv.Start(t)
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	testenv.WriteKubeconfig(t, cp.Config, kubeconfig)
	sink := newSpanSink(t)
	col := otlptest.StartCollector(t, sink.URL)
	ctx := context.Background()

	// Metrics leave every 2s so export rounds fall in the outage; every timeout
	// (OTLP export, batch span processor export, metric export) is the default.
	shutdownTimeout := 10 * time.Second // the default
	var extra []string
	if prof.shutdown > 0 {
		shutdownTimeout = prof.shutdown
		extra = append(extra, "--shutdown-timeout="+prof.shutdown.String())
	}
	a := startAgentEnv(t, otlpEnv(col, "OTEL_METRIC_EXPORT_INTERVAL=2000"), kubeconfig, filepath.Join(dir, "seen.state"), extra...)
	testenv.Eventually(t, 60*time.Second, "/readyz 200", func() bool { code, _ := a.get(t, "/readyz"); return code == http.StatusOK })
	pid := a.cmd.Process.Pid

	ch := &churner{w: &writer{t: t, c: cp.Client}, pods: pods, rng: rand.New(rand.NewPCG(1, 2))}
	for range 8 {
		if err := ch.create(ctx); err != nil {
			t.Fatal(err)
		}
	}
	churnCtx, stopChurn := context.WithCancel(ctx)
	churnDone := make(chan struct{})
	go func() { defer close(churnDone); ch.run(churnCtx, t, 100*time.Millisecond) }()
	defer func() { stopChurn(); <-churnDone }()

	const latencyHist = "npagent_policy_programming_latency_seconds"
	kind := "npagent_policy_kind=PolicyEndpoint"
	// Warm-up: the first writes, then the window before the outage.
	time.Sleep(3 * time.Second)
	h0 := a.scrapeNative(t, latencyHist, kind)
	rssBefore := vmRSS(t, pid)
	time.Sleep(prof.window)
	h1 := a.scrapeNative(t, latencyHist, kind)
	rssBefore = max(rssBefore, vmRSS(t, pid))

	col.Kill()
	outageStart := time.Now()
	var rssDuring int64
	for time.Since(outageStart) < prof.outage {
		rssDuring = max(rssDuring, vmRSS(t, pid))
		time.Sleep(500 * time.Millisecond)
	}
	h2 := a.scrapeNative(t, latencyHist, kind)
	droppedDuring := a.metric(t, "npagent_telemetry_spans_dropped_total")
	failedDuring := a.metric(t, "npagent_telemetry_metric_exports_failed_total")
	spansAtReturn := sink.spanCount()
	col.Start()
	returned := time.Now()
	outage := returned.Sub(outageStart)
	// How long until spans reach the collector again, and what is dropped meanwhile.
	var resumed time.Duration
	var droppedAtResume float64
	for time.Since(returned) < prof.window+30*time.Second {
		if sink.spanCount() > spansAtReturn {
			resumed = time.Since(returned)
			droppedAtResume = a.metric(t, "npagent_telemetry_spans_dropped_total")
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("spans reach the collector again %v after it returned (dropped by then: %v)", resumed.Round(time.Millisecond), droppedAtResume)
	// The exporters' reconnect backoff is capped (telemetry.collectorReconnect, 5 s),
	// and an export's retries end with its 10 s timeout: after an outage of any
	// length, spans flow again within about their sum. gRPC's default backoff, which
	// grows to 2 min, made it 15.5–19.7 s after a 30 s outage.
	const recoverWithin = 12 * time.Second
	if resumed == 0 || resumed > recoverWithin {
		t.Errorf("spans reached the returned collector after %v (0: never), want within %v", resumed, recoverWithin)
	}

	// After: the exporters find the collector again; what was queued arrives.
	time.Sleep(prof.window - time.Since(returned))
	h3 := a.scrapeNative(t, latencyHist, kind)
	rssAfter := vmRSS(t, pid)

	p99Before, nBefore := windowQuantile(h0, h1, 0.99)
	p99During, nDuring := windowQuantile(h1, h2, 0.99)
	p99After, nAfter := windowQuantile(h2, h3, 0.99)
	p50Before, _ := windowQuantile(h0, h1, 0.5)
	p50During, _ := windowQuantile(h1, h2, 0.5)
	t.Logf("latency histogram schema %d", h3.schema)
	t.Logf("latency p50/p99 (bucket bounds): before %.2f/%.2f ms (%d triggers), collector down %.2f/%.2f ms (%d), after %.2f ms p99 (%d)",
		p50Before*1e3, p99Before*1e3, nBefore, p50During*1e3, p99During*1e3, nDuring, p99After*1e3, nAfter)
	t.Logf("VmRSS before %.1f MiB, max during the %v outage %.1f MiB, after %.1f MiB", mib(rssBefore), outage.Round(time.Millisecond), mib(rssDuring), mib(rssAfter))
	if nBefore < 20 || nDuring < 20 {
		t.Fatalf("too few triggers measured to compare: %d before, %d during", nBefore, nDuring)
	}
	// The collector's outage must not reach the reconcile loop: export never
	// blocks a commit. On a shared 2-core machine the p99 of ~100 triggers moves by
	// several times between two windows with the collector up (before, after), so
	// 10% is not measurable here; the bound is 10% over the worse of those two
	// windows, and at least 1 s over it: an export on the commit path would add its
	// timeout (10s) or its retries' backoff (5s and more), while CPU contention
	// alone (CI under -race beside other tests) moved a p99 by 130 ms.
	ref := max(p99Before, p99After)
	if bound := max(1.1*ref, ref+1.0); p99During > bound {
		t.Errorf("p99 latency during the outage %.2f ms > %.2f ms (with the collector up: %.2f ms before, %.2f ms after)",
			p99During*1e3, bound*1e3, p99Before*1e3, p99After*1e3)
	}
	if rssDuring-rssBefore > 32<<20 {
		t.Errorf("VmRSS grew by %.1f MiB during the outage (%.1f → %.1f MiB)", mib(rssDuring-rssBefore), mib(rssBefore), mib(rssDuring))
	}

	// Losses are counted: every reported trigger whose root span never reached
	// the collector is among the spans counted as dropped.
	reported := a.metric(t, latencyCount, `npagent_policy_kind="PolicyEndpoint"`)
	testenv.Eventually(t, 60*time.Second, "the exporters to deliver again after the outage", func() bool {
		return len(sink.snapshot()) > 0 && a.metric(t, latencyCount) > reported && len(reportsByKey(sink.snapshot())) >= int(reported)-int(a.metric(t, "npagent_telemetry_spans_dropped_total"))
	})
	stopChurn()
	<-churnDone
	time.Sleep(2 * time.Second)
	reported = a.metric(t, latencyCount, `npagent_policy_kind="PolicyEndpoint"`)
	dropped := a.metric(t, "npagent_telemetry_spans_dropped_total")
	failed := a.metric(t, "npagent_telemetry_metric_exports_failed_total")
	arrived := len(reportsByKey(sink.snapshot()))
	t.Logf("reported %v triggers; %d root spans arrived (%d spans in all, duplicates %d); spans dropped %v (%v when the collector returned); metric export rounds failed %v (%v when it returned)",
		reported, arrived, sink.spanCount(), len(sink.snapshot())-arrived, dropped, droppedDuring, failed, failedDuring)
	if missing := int(reported) - arrived; missing > 0 && float64(missing) > dropped {
		t.Errorf("%d reported triggers never reached the collector, %v spans counted as dropped: losses not counted", missing, dropped)
	}
	// A round is counted when it gives up: after its retries, within the OTLP
	// timeout (10s). An outage of twice that fails at least one.
	if outage >= 20*time.Second && failed == 0 {
		t.Errorf("no failed metric export round counted for a %v outage (export every 2s)", outage.Round(time.Second))
	}

	// SIGTERM during an outage: the agent exits within its shutdown timeout
	// (--shutdown-timeout, for the telemetry flush: 3s in the short profile, the
	// default 10s in the full one) and 0.
	col.Kill()
	for range 10 { // changes whose spans wait for the dead collector
		if _, err := ch.w.update(ctx, ch.live[0], 7); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	start := time.Now()
	code := a.stop(t)
	took := time.Since(start)
	t.Logf("SIGTERM with the collector down: exit %d after %v (shutdown timeout %v)", code, took.Round(time.Millisecond), shutdownTimeout)
	if code != 0 {
		t.Errorf("exit code after SIGTERM = %d, want 0", code)
	}
	// The HTTP server's own shutdown (up to 2s) follows the telemetry flush.
	if took > shutdownTimeout+3*time.Second {
		t.Errorf("SIGTERM during the outage took %v to exit, shutdown timeout %v", took, shutdownTimeout)
	}
	var flushLine string
	for _, line := range strings.Split(a.logs(), "\n") {
		if strings.Contains(line, "telemetry flush incomplete") {
			flushLine = line
		}
	}
	switch {
	case flushLine == "":
		t.Errorf("the agent stopped with spans for a dead collector and did not log the incomplete flush")
	case !strings.Contains(flushLine, "spans_dropped") || !strings.Contains(flushLine, "metric_exports_failed"):
		t.Errorf("the incomplete flush's log line does not count the losses: %s", flushLine)
	}
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }
