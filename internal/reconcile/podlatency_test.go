package reconcile

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/podcond"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/seen"
	"github.com/npagent/npagent/internal/testenv"
	"github.com/npagent/npagent/internal/translate"
)

func (s *recordingSink) PodProgrammed(r *report.PodRecord) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pods = append(s.pods, r)
}

func (s *recordingSink) PodUnselected() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unselected++
}

func (s *recordingSink) podRecords() ([]*report.PodRecord, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*report.PodRecord(nil), s.pods...), s.unselected
}

var _ report.PodSink = (*recordingSink)(nil)

// readyPod creates a pod on node with an IP whose network became usable at ready
// (PodReadyToStartContainers), or without that condition when ready is zero.
func readyPod(t *testing.T, cp *testenv.ControlPlane, ns, name, node, ip string, ready time.Time, labels map[string]string) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}}}
	ctx := context.Background()
	if err := cp.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	p.Status.PodIP, p.Status.PodIPs = ip, []corev1.PodIP{{IP: ip}}
	if !ready.IsZero() {
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionTrue,
			LastTransitionTime: metav1.NewTime(ready)}}
	}
	if err := cp.Client.Status().Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPodEnforcementWindow: a new pod's window, from its network becoming usable to
// the commit that first programmed its policy, is reported once per pod uid —
// not again when its policy changes, nor after a relist or an agent restart; a pod
// no policy selects is counted, not reported; without PodReadyToStartContainers the
// window starts when the agent first saw the IP.
func TestPodEnforcementWindow(t *testing.T) {
	cp := testenv.Start(t)
	const node, ns = "192.0.2.54", "pw"
	mine := "node-" + node
	createNamespace(t, cp, ns)
	createNamespace(t, cp, "pw-open")
	resolver := newLookupTableResolver("10.54.0.1", 51, "10.54.0.2", 52, "10.54.0.3", 53)
	dp := bpfmaps.NewMemory()
	state := filepath.Join(t.TempDir(), "pods.state")
	newPodSeen := func() *seen.Set {
		s, err := seen.New(time.Now(), seen.WithStatePath(state))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	started := time.Now()
	a := startAgent(t, cp, agentOptions{nodeIP: node, dp: dp, resolver: resolver, podStatus: true, podSeen: newPodSeen()})

	// The policy exists, selecting app=web; the pod comes, its network ready at
	// ready; the controller lists it a moment later.
	pe := ingressPE(ns, "web", nil, "10.99.0.1/32", 80)
	pe.Spec.PodSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}
	pe.Annotations = map[string]string{v1alpha1.AnnotationTraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	create(t, cp, pe)
	// A condition's time has whole seconds: the window's start must be after the
	// pod seen-set's creation, or it is before_start.
	time.Sleep(time.Until(started.Add(1300 * time.Millisecond)))
	ready := time.Now().Add(-200 * time.Millisecond).Truncate(time.Second)
	web := readyPod(t, cp, ns, "web", mine, "10.54.0.1", ready, map[string]string{"app": "web"})
	waitCondition(t, cp, ns, "web", podcond.False, podcond.ReasonPending)
	time.Sleep(300 * time.Millisecond) // the open window
	listed := time.Now()
	update(t, cp, pe, func(pe *v1alpha1.PolicyEndpoint) {
		pe.Spec.PodSelectorEndpoints = []v1alpha1.PodEndpoint{pod(node, "10.54.0.1")}
		pe.Spec.PodSelectorEndpoints[0].Namespace = ns
	})
	waitCondition(t, cp, ns, "web", podcond.True, podcond.ReasonProgrammed)
	testenv.Eventually(t, 10*time.Second, "the pod's window reported", func() bool { r, _ := a.sink.podRecords(); return len(r) == 1 })
	recs, _ := a.sink.podRecords()
	r := recs[0]
	if r.UID != string(web.UID) || !r.NetworkReady.Equal(ready) || r.Source != report.SourceReadyToStartContainers {
		t.Errorf("record %+v, want uid %s, start %v from %s", r, web.UID, ready, report.SourceReadyToStartContainers)
	}
	if r.Programmed.Before(listed) || r.Programmed.After(time.Now()) {
		t.Errorf("window ends at %v, want the commit after the pod was listed (%v)", r.Programmed, listed)
	}
	if len(r.TraceParents) != 1 || len(r.Objects) != 1 || r.Objects[0] != "PolicyEndpoint pw/web" {
		t.Errorf("record names %v with traceparents %v, want PolicyEndpoint pw/web and its traceparent", r.Objects, r.TraceParents)
	}
	t.Logf("window %v (source %s)", r.Programmed.Sub(r.NetworkReady), r.Source)

	// Its policy changes: programmed again, not a new pod.
	update(t, cp, pe, func(pe *v1alpha1.PolicyEndpoint) { pe.Spec.Ingress[0].CIDR = "10.99.0.2/32" })
	// A pod no policy selects is counted; a pod without PodReadyToStartContainers
	// starts its window when first seen.
	readyPod(t, cp, "pw-open", "open", mine, "10.54.0.2", time.Now(), nil)
	waitCondition(t, cp, "pw-open", "open", podcond.True, podcond.ReasonNoPolicy)
	create(t, cp, ingressPE(ns, "old", []v1alpha1.PodEndpoint{pod(node, "10.54.0.3")}, "10.99.0.3/32", 80))
	// The object before the pod: both come over watches of their own, and a pod seen
	// first would be counted unselected.
	testenv.Eventually(t, 10*time.Second, "the agent holds old", func() bool {
		_, ok := a.c.current(translate.Key{Kind: report.KindPolicyEndpoint, Namespace: ns, Name: "old"})
		return ok
	})
	seenAt := time.Now()
	readyPod(t, cp, ns, "old-kubelet", mine, "10.54.0.3", time.Time{}, nil)
	waitCondition(t, cp, ns, "old-kubelet", podcond.True, podcond.ReasonProgrammed)
	testenv.Eventually(t, 10*time.Second, "the second pod's window reported", func() bool { r, _ := a.sink.podRecords(); return len(r) == 2 })
	recs, unselected := a.sink.podRecords()
	if recs[1].Source != report.SourceFirstSeenIP || recs[1].NetworkReady.Before(seenAt.Add(-time.Second)) {
		t.Errorf("second record %+v, want source %s, start after %v", recs[1], report.SourceFirstSeenIP, seenAt)
	}
	if unselected != 1 {
		t.Errorf("pods counted unselected = %d, want 1", unselected)
	}

	// A relist and a restart report nothing again.
	waitStatusIdle(t, a)
	cp.RestartAPIServer(t)
	time.Sleep(2 * time.Second)
	waitStatusIdle(t, a)
	if recs, _ := a.sink.podRecords(); len(recs) != 2 {
		t.Errorf("after a relist: %d records, want 2", len(recs))
	}
	a.stop()
	b := startAgent(t, cp, agentOptions{nodeIP: node, dp: dp, resolver: resolver, podStatus: true, podSeen: newPodSeen()})
	waitStatusIdle(t, b)
	if recs, unselected := b.sink.podRecords(); len(recs) != 0 || unselected != 0 {
		t.Errorf("a restarted agent reported %d windows and counted %d unselected pods, want none", len(recs), unselected)
	}
}
