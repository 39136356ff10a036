package reconcile

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
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
	cp := testenv.Start(t)
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
	var ex ObjectExplain
	testenv.Eventually(t, 20*time.Second, "web waiting for its interface", func() bool {
		ex = a.c.ExplainObject(report.KindPolicyEndpoint, "explain", "web")
		return ex.State == StateWaiting
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
		ex.Versions[0].Received.IsZero() || ex.Versions[0].Outcome != StateWaiting {
		t.Errorf("versions = %+v: want the one version, received, waiting", ex.Versions)
	}
	if len(ex.Reports) != 0 {
		t.Errorf("reports before any commit: %+v", ex.Reports)
	}
	pod := a.c.ExplainPod(PodQuery{IP: addr("10.1.40.1")})
	if pod.Programmed || !pod.Synced || !pod.OnNode || len(pod.Objects) != 1 || pod.Objects[0].State != StateWaiting || pod.Name != "web-0" {
		t.Errorf("pod = %+v: want web waiting, not programmed", pod)
	}

	// 2. The interface appears; the first commit fails, the retry succeeds.
	dp.failures.Store(1)
	resolver.set("10.1.40.1", 41)
	testenv.Eventually(t, 20*time.Second, "web programmed", func() bool {
		ex = a.c.ExplainObject(report.KindPolicyEndpoint, "explain", "web")
		return ex.Programmed
	})
	if ex.State != StateProgrammed || len(ex.Pending) != 0 || len(ex.FailedAttempts) != 0 || !ex.Consumed.Equal(trigger) {
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
	if v := ex.Versions[len(ex.Versions)-1]; v.Outcome != StateProgrammed || v.Pods != 1 || !v.HasLocalWork() {
		t.Errorf("version = %+v: want programmed, one pod, local work", v)
	}
	pod = a.c.ExplainPod(PodQuery{Namespace: "explain", Name: "web-0"})
	if !pod.Programmed || pod.IP != "10.1.40.1" || pod.Ifindex != 41 || len(pod.Objects) != 1 || !pod.Objects[0].Lists || !pod.Objects[0].Programmed {
		t.Errorf("pod by name = %+v: want web programmed on ifindex 41", pod)
	}

	// 3. A rules-only chunk of the same policy applies to the pod too.
	chunk := ingressPE("explain", "web-2", nil, "10.3.0.0/16", 443)
	chunk.Spec.PolicyRef.Name = "web"
	create(t, cp, chunk)
	testenv.Eventually(t, 20*time.Second, "the chunk listed for the pod, programmed", func() bool {
		pod = a.c.ExplainPod(PodQuery{IP: addr("10.1.40.1")})
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
		return ex.State == StateNoLocalWork
	})
	if !ex.Programmed || len(ex.LocalPods) != 0 || len(ex.Versions) != 1 || ex.Versions[0].HasLocalWork() {
		t.Errorf("remote = %+v: want nothing to do here, no local work", ex)
	}
	if p := a.c.ExplainPod(PodQuery{IP: addr("10.1.99.1")}); p.OnNode || p.Programmed || p.HostIP != "192.0.2.99" {
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
		return ex.State == StateFailed && len(ex.FailedAttempts) >= 2
	})
	if ex.Programmed || !strings.Contains(ex.Detail, errInjected.Error()) || !strings.Contains(ex.FailedAttempts[0].Err, errInjected.Error()) ||
		len(ex.Pending) != 1 || !ex.Pending[0].Trigger.Equal(flakyTrigger) || ex.Pending[0].Failures < 2 {
		t.Errorf("flaky = %+v: want failed, the injected error, the trigger pending with its failures", ex)
	}
	if p := a.c.ExplainPod(PodQuery{IP: addr("10.1.40.2")}); p.Programmed || len(p.Objects) != 1 || p.Objects[0].State != StateFailed {
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
		return ex.State == StateRejected
	})
	if ex.Programmed || !strings.Contains(ex.Detail, "10.2.0.0/33") || len(ex.Versions) != 2 || ex.Versions[1].Outcome != StateRejected {
		t.Errorf("rejected = %+v: want not programmed, the field error, two versions", ex)
	}
	if p := a.c.ExplainPod(PodQuery{IP: addr("10.1.40.1")}); p.Programmed {
		t.Errorf("pod of a rejected version reported programmed: %+v", p)
	}

	// 6. Unknown objects; a deleted object's history is dropped.
	if ex := a.c.ExplainObject(report.KindClusterPolicyEndpoint, "", "nope"); ex.State != StateNotFound || ex.Programmed {
		t.Errorf("unknown object = %+v", ex)
	}
	remove(t, cp, web)
	testenv.Eventually(t, 20*time.Second, "web's history dropped", func() bool {
		a.c.explain.mu.Lock()
		defer a.c.explain.mu.Unlock()
		_, ok := a.c.explain.byUID[web.UID]
		return !ok
	})
	testenv.Eventually(t, 20*time.Second, "the pod without web", func() bool {
		p := a.c.ExplainPod(PodQuery{IP: addr("10.1.40.1")})
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

// TestExplainLogBounded: per uid at most explainVersions versions and
// explainReports reports (each with at most explainAttempts attempts), the newest
// kept; forget drops the uid.
func TestExplainLogBounded(t *testing.T) {
	var l explainLog
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 20 {
		v := objectVersion{uid: "u", resourceVersion: fmt.Sprint(i), trigger: base.Add(time.Duration(i) * time.Second)}
		l.received(v, base.Add(time.Duration(i)*time.Second+time.Millisecond))
		res := commitResult{pods: 1}
		res.attempt.Start, res.attempt.End = base, base.Add(time.Duration(i)*time.Second+2*time.Millisecond)
		l.synced(v, &res, nil)
		attempts := make([]report.Attempt, i+1)
		for j := range attempts {
			attempts[j] = report.Attempt{Start: base, End: base.Add(time.Duration(j) * time.Millisecond), Err: fmt.Sprint(j)}
		}
		l.reported(&report.Record{UID: "u", ResourceVersion: fmt.Sprint(i), Trigger: v.trigger, Attempts: attempts})
	}
	versions, reports := l.snapshot("u")
	if len(versions) != explainVersions || versions[0].ResourceVersion != "12" || versions[explainVersions-1].ResourceVersion != "19" {
		t.Errorf("versions = %d, %s..%s; want the newest %d", len(versions), versions[0].ResourceVersion, versions[len(versions)-1].ResourceVersion, explainVersions)
	}
	if versions[explainVersions-1].Outcome != StateProgrammed {
		t.Errorf("newest version outcome %q", versions[explainVersions-1].Outcome)
	}
	if len(reports) != explainReports || reports[explainReports-1].ResourceVersion != "19" {
		t.Fatalf("reports = %+v; want the newest %d", reports, explainReports)
	}
	last := reports[explainReports-1]
	if len(last.Attempts) != explainAttempts || last.AttemptCount != 20 || last.Attempts[explainAttempts-1].Err != "19" {
		t.Errorf("attempts kept %d of %d, last %q: want the newest %d", len(last.Attempts), last.AttemptCount, last.Attempts[len(last.Attempts)-1].Err, explainAttempts)
	}
	l.forget("u")
	if v, r := l.snapshot("u"); v != nil || r != nil || len(l.byUID) != 0 {
		t.Errorf("after forget: %v %v", v, r)
	}
	var nilLog *explainLog
	nilLog.received(objectVersion{uid: types.UID("x")}, base) // a loop built in parts: no panic
}

func TestTraceID(t *testing.T) {
	for in, want := range map[string]string{
		"00-4bf92f3577b34da6a3ce929e0e9a0e4f-00f067aa0ba902b7-01": "4bf92f3577b34da6a3ce929e0e9a0e4f",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01": "",
		"00-4BF92F3577B34DA6A3CE929E0E9A0E4F-00f067aa0ba902b7-01": "",
		"garbage": "",
		"":        "",
	} {
		if got := traceID(in); got != want {
			t.Errorf("traceID(%q) = %q, want %q", in, got, want)
		}
	}
}
