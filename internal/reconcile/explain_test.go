package reconcile

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/explain"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/testenv"
)

// TestExplain runs the loop against a real kube-apiserver (in-memory dataplane,
// a lookup-table resolver as in the integration tests) and reads ExplainObject and
// ExplainPod through an object's life: waiting for its pod's interface (pending,
// not programmed), a failed commit then a successful one (a report with both
// attempts and the phases), another chunk of the same policy, an object with
// nothing on this node, a rejected version, and a delete (history dropped).
func TestExplain(t *testing.T) {
	cp := sharedCP(t)
	const node = "192.0.2.40"
	createNamespace(t, cp, "explain")
	mem := bpfmaps.NewMemory()
	dp := &failingDataplane{Dataplane: mem}
	resolver := newLookupTableResolver() // the pod's interface is not there yet
	a := startAgent(t, cp, agentOptions{nodeIP: node, dp: dp, resolver: resolver})

	const traceparent = "00-4bf92f3577b34da6a3ce929e0e9a0e4f-00f067aa0ba902b7-01"
	web := ingressPE("explain", "web", []v1alpha1.PodEndpoint{{HostIP: node, PodIP: "10.1.40.1", Name: "web-0", Namespace: "explain"}}, "10.2.0.0/16", 80)
	web.Annotations = map[string]string{v1alpha1.AnnotationTraceParent: traceparent}
	trigger := create(t, cp, web)

	// 1. The pod's interface is missing: pending, waiting, not programmed.
	var ex explain.ObjectExplain
	testenv.Eventually(t, 20*time.Second, "web waiting for its interface", func() bool {
		ex = a.c.ExplainObject(report.KindPolicyEndpoint, "explain", "web")
		return ex.State == explain.StateWaiting
	})
	if ex.Programmed || ex.UID != string(web.UID) || ex.ResourceVersion != web.ResourceVersion || !ex.Trigger.Equal(trigger) {
		t.Errorf("explain = %+v: want web's uid, rv %s, trigger %v, not programmed", ex, web.ResourceVersion, trigger)
	}
	if ex.WriterTraceID != "4bf92f3577b34da6a3ce929e0e9a0e4f" {
		t.Errorf("trace id = %q, want the traceparent's", ex.WriterTraceID)
	}
	if !strings.Contains(ex.Detail, "10.1.40.1") || fmt.Sprint(ex.LocalPods) != "[10.1.40.1]" {
		t.Errorf("detail %q, local pods %v: want the waiting pod named", ex.Detail, ex.LocalPods)
	}
	if len(ex.Pending) != 1 || !ex.Pending[0].Trigger.Equal(trigger) || ex.Pending[0].Age <= 0 || ex.Pending[0].Waiting <= 0 || ex.Pending[0].Age < ex.Pending[0].Waiting {
		t.Errorf("pending = %+v: want the trigger, with its age and wait", ex.Pending)
	}
	if len(ex.Versions) != 1 || ex.Versions[0].ResourceVersion != web.ResourceVersion || !ex.Versions[0].Trigger.Equal(trigger) ||
		ex.Versions[0].Received.IsZero() || ex.Versions[0].Outcome != explain.StateWaiting {
		t.Errorf("versions = %+v: want the one version, received, waiting", ex.Versions)
	}
	if len(ex.Reports) != 0 {
		t.Errorf("reports before any commit: %+v", ex.Reports)
	}
	pod := a.c.ExplainPod(explain.PodQuery{IP: addr("10.1.40.1")})
	if pod.Programmed || !pod.Synced || !pod.OnNode || len(pod.Objects) != 1 || pod.Objects[0].State != explain.StateWaiting || pod.Name != "web-0" {
		t.Errorf("pod = %+v: want web waiting, not programmed", pod)
	}

	// 2. The interface appears; the first commit fails, the retry succeeds.
	dp.failures.Store(1)
	resolver.set("10.1.40.1", 41)
	// Programmed (the table) comes before the report (the seen-set, then the Sink),
	// which the worker makes after it releases the table.
	testenv.Eventually(t, 20*time.Second, "web programmed and reported", func() bool {
		ex = a.c.ExplainObject(report.KindPolicyEndpoint, "explain", "web")
		return ex.Programmed && len(ex.Reports) > 0
	})
	if ex.State != explain.StateProgrammed || len(ex.Pending) != 0 || len(ex.FailedAttempts) != 0 || !ex.Consumed.Equal(trigger) {
		t.Errorf("explain = %+v: want programmed, nothing pending, the trigger consumed", ex)
	}
	if len(ex.Reports) != 1 {
		t.Fatalf("reports = %+v, want one", ex.Reports)
	}
	r := ex.Reports[0]
	if !r.Trigger.Equal(trigger) || r.ResourceVersion != web.ResourceVersion || r.AttemptCount != 2 || len(r.Attempts) != 2 || r.Pods != 1 || r.WriterTraceID != ex.WriterTraceID {
		t.Errorf("report = %+v: want the trigger, two attempts, one pod, the trace id", r)
	}
	if r.Delivery <= 0 || r.Queue <= 0 || r.Compute <= 0 || r.Latency < r.Delivery+r.Queue {
		t.Errorf("report phases: delivery %v queue %v compute %v latency %v", r.Delivery, r.Queue, r.Compute, r.Latency)
	}
	if len(r.Attempts) == 2 {
		if !strings.Contains(r.Attempts[0].Err, errInjected.Error()) || r.Attempts[1].Err != "" {
			t.Errorf("attempts = %+v: want the first failed (injected), the second not", r.Attempts)
		}
		if last := r.Attempts[1]; last.Phases.Merge <= 0 || last.Duration < last.Phases.Merge || last.LockWait < 0 ||
			!last.Programmed.Equal(r.Committed) || last.Programmed.Before(last.Start) || last.Programmed.After(last.End) {
			t.Errorf("last attempt = %+v: want its merge phase within its duration, and the commit at its switch, inside it", last)
		}
	}
	if v := ex.Versions[len(ex.Versions)-1]; v.Outcome != explain.StateProgrammed || v.Pods != 1 || !v.HasLocalWork() {
		t.Errorf("version = %+v: want programmed, one pod, local work", v)
	}
	pod = a.c.ExplainPod(explain.PodQuery{Namespace: "explain", Name: "web-0"})
	if !pod.Programmed || pod.IP != "10.1.40.1" || pod.Ifindex != 41 || len(pod.Objects) != 1 || !pod.Objects[0].Lists || !pod.Objects[0].Programmed {
		t.Errorf("pod by name = %+v: want web programmed on ifindex 41", pod)
	}

	// 3. A rules-only chunk of the same policy applies to the pod too.
	chunk := ingressPE("explain", "web-2", nil, "10.3.0.0/16", 443)
	chunk.Spec.PolicyRef.Name = "web"
	create(t, cp, chunk)
	testenv.Eventually(t, 20*time.Second, "the chunk listed for the pod, programmed", func() bool {
		pod = a.c.ExplainPod(explain.PodQuery{IP: addr("10.1.40.1")})
		return len(pod.Objects) == 2 && pod.Programmed
	})
	if o := pod.Objects[1]; o.Name != "web-2" || o.Lists || o.PolicyRef != "web" {
		t.Errorf("chunk = %+v: want web-2, not listing the pod, of policy web", o)
	}

	// 4. Nothing on this node.
	remote := ingressPE("explain", "remote", []v1alpha1.PodEndpoint{pod2("192.0.2.99", "10.1.99.1")}, "10.4.0.0/16", 80)
	create(t, cp, remote)
	testenv.Eventually(t, 20*time.Second, "remote synced", func() bool {
		ex = a.c.ExplainObject(report.KindPolicyEndpoint, "explain", "remote")
		return ex.State == explain.StateNoLocalWork
	})
	if !ex.Programmed || len(ex.LocalPods) != 0 || len(ex.Versions) != 1 || ex.Versions[0].HasLocalWork() {
		t.Errorf("remote = %+v: want nothing to do here, no local work", ex)
	}
	if p := a.c.ExplainPod(explain.PodQuery{IP: addr("10.1.99.1")}); p.OnNode || p.Programmed || p.HostIP != "192.0.2.99" {
		t.Errorf("a pod of another node = %+v: want not on this node, not programmed", p)
	}

	// 4b. Commits that keep failing: the failed attempts and their errors, the
	// trigger pending with its failure count; then the retry succeeds.
	resolver.set("10.1.40.2", 42)
	dp.failures.Store(1 << 20)
	flaky := ingressPE("explain", "flaky", []v1alpha1.PodEndpoint{pod2(node, "10.1.40.2")}, "10.5.0.0/16", 80)
	flakyTrigger := create(t, cp, flaky)
	testenv.Eventually(t, 20*time.Second, "flaky failing, twice at least", func() bool {
		ex = a.c.ExplainObject(report.KindPolicyEndpoint, "explain", "flaky")
		return ex.State == explain.StateFailed && len(ex.FailedAttempts) >= 2
	})
	if ex.Programmed || !strings.Contains(ex.Detail, errInjected.Error()) || !strings.Contains(ex.FailedAttempts[0].Err, errInjected.Error()) ||
		len(ex.Pending) != 1 || !ex.Pending[0].Trigger.Equal(flakyTrigger) || ex.Pending[0].Failures < 2 {
		t.Errorf("flaky = %+v: want failed, the injected error, the trigger pending with its failures", ex)
	}
	if p := a.c.ExplainPod(explain.PodQuery{IP: addr("10.1.40.2")}); p.Programmed || len(p.Objects) != 1 || p.Objects[0].State != explain.StateFailed {
		t.Errorf("pod of a failing object = %+v", p)
	}
	dp.failures.Store(0)
	testenv.Eventually(t, 20*time.Second, "flaky programmed", func() bool {
		ex = a.c.ExplainObject(report.KindPolicyEndpoint, "explain", "flaky")
		return ex.Programmed && len(ex.Reports) == 1
	})
	if r := ex.Reports[0]; r.AttemptCount < 3 || r.Attempts[len(r.Attempts)-1].Err != "" || !strings.Contains(r.Attempts[0].Err, errInjected.Error()) || len(ex.FailedAttempts) != 0 {
		t.Errorf("flaky report = %+v, failed attempts now %v: want the failures then the success, none left", r, ex.FailedAttempts)
	}

	// 5. A rejected version: the last valid one stays, the error is shown.
	update(t, cp, web, func(pe *v1alpha1.PolicyEndpoint) { pe.Spec.Ingress[0].CIDR = "10.2.0.0/33" })
	testenv.Eventually(t, 20*time.Second, "web rejected", func() bool {
		ex = a.c.ExplainObject(report.KindPolicyEndpoint, "explain", "web")
		return ex.State == explain.StateRejected
	})
	if ex.Programmed || !strings.Contains(ex.Detail, "10.2.0.0/33") || len(ex.Versions) != 2 || ex.Versions[1].Outcome != explain.StateRejected {
		t.Errorf("rejected = %+v: want not programmed, the field error, two versions", ex)
	}
	if p := a.c.ExplainPod(explain.PodQuery{IP: addr("10.1.40.1")}); p.Programmed {
		t.Errorf("pod of a rejected version reported programmed: %+v", p)
	}

	// 6. Unknown objects; a deleted object's history is dropped.
	if ex := a.c.ExplainObject(report.KindClusterPolicyEndpoint, "", "nope"); ex.State != explain.StateNotFound || ex.Programmed {
		t.Errorf("unknown object = %+v", ex)
	}
	remove(t, cp, web)
	testenv.Eventually(t, 20*time.Second, "web's history dropped", func() bool {
		return !a.c.explain.Holds(string(web.UID))
	})
	testenv.Eventually(t, 20*time.Second, "the pod without web", func() bool {
		p := a.c.ExplainPod(explain.PodQuery{IP: addr("10.1.40.1")})
		return p.Programmed && len(p.Objects) == 0
	})

	// The JSON form round-trips (cmd/npagent serves it).
	b, err := json.Marshal(a.c.ExplainObject(report.KindPolicyEndpoint, "explain", "remote"))
	if err != nil || !strings.Contains(string(b), `"state":"no-local-work"`) {
		t.Errorf("JSON: %s %v", b, err)
	}
}

func pod2(hostIP, podIP string) v1alpha1.PodEndpoint {
	return v1alpha1.PodEndpoint{HostIP: v1alpha1.NetworkAddress(hostIP), PodIP: v1alpha1.NetworkAddress(podIP), Name: "p-" + podIP, Namespace: "explain"}
}

// TestSyncOutcome: how a sync ended, as the history records it: rejected (with the
// reason), failed (with the error), waiting for interfaces (the pods and the
// resolver's error), no local work, programmed; the time is the attempt's end, or
// its start when nothing was committed.
func TestSyncOutcome(t *testing.T) {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	res := func(f func(*commitResult)) *commitResult {
		r := &commitResult{pods: 1}
		r.attempt.Start, r.attempt.End = base, base.Add(time.Second)
		f(r)
		return r
	}
	for _, tc := range []struct {
		name    string
		res     *commitResult
		invalid error
		want    explain.Sync
	}{
		{"programmed", res(func(*commitResult) {}), nil, explain.Sync{Outcome: explain.StateProgrammed, Pods: 1, SyncedAt: base.Add(time.Second)}},
		{"rejected", res(func(*commitResult) {}), errors.New("bad cidr"), explain.Sync{Outcome: explain.StateRejected, Detail: "bad cidr", Pods: 1, SyncedAt: base.Add(time.Second)}},
		{"failed", res(func(r *commitResult) { r.err = errors.New("boom") }), nil, explain.Sync{Outcome: explain.StateFailed, Detail: "boom", Pods: 1, SyncedAt: base.Add(time.Second)}},
		{"waiting", res(func(r *commitResult) {
			r.notDone, r.resolveErr = []netip.Addr{addr("10.0.0.1"), addr("10.0.0.2")}, errors.New("no route")
		}), nil, explain.Sync{Outcome: explain.StateWaiting, Detail: "10.0.0.1,10.0.0.2: no route", Pods: 1, SyncedAt: base.Add(time.Second)}},
		{"no local work", res(func(r *commitResult) { r.noLocalWork = true }), nil, explain.Sync{Outcome: explain.StateNoLocalWork, Pods: 1, SyncedAt: base.Add(time.Second)}},
		{"no pods, nothing committed", res(func(r *commitResult) { r.pods, r.attempt.End = 0, time.Time{} }), nil, explain.Sync{Outcome: explain.StateNoLocalWork, SyncedAt: base}},
	} {
		if got := syncOutcome(tc.res, tc.invalid); got != tc.want {
			t.Errorf("%s: syncOutcome = %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
