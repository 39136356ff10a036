package main

// Faults at the binary level: the agent binary against a real kube-apiserver and
// etcd (internal/testenv), reporting through a real OpenTelemetry Collector to an
// OTLP sink in the test, where every reported trigger is one policy.program root
// span (uid, trigger time, start = trigger, end = commit). Each test runs a short
// profile under make test and the full one under make e2e (NPAGENT_E2E=1).

import (
	"context"
	"fmt"
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
	"github.com/npagent/npagent/internal/testenv"
	"github.com/npagent/npagent/internal/testenv/netlab"
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
	col := startOTelCollector(t, sink)
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
			t.Errorf("%s (%s) %s uid %s trigger %s reported %d times, want once", wr.name, wr.op, "", wr.uid, wr.trigger, c)
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
