package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/testenv"
)

// The demo's accounting starts from churn's summary, so the summary must be what
// the apiserver saw: every trigger churn says it wrote is one write of a new
// object version carrying a new, valid trigger time and a valid traceparent,
// seen by a watch; every object selects one pod on --host-ip and the remote
// pods elsewhere.
func TestChurnWritesWhatItReports(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a real kube-apiserver")
	}
	cp := testenv.Start(t)
	ctx := context.Background()
	const ns = "churn"
	if err := cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	testenv.WriteKubeconfig(t, cp.Config, kubeconfig)

	wc, err := client.NewWithWatch(cp.Config, client.Options{Scheme: cp.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	w, err := wc.Watch(ctx, &v1alpha1.PolicyEndpointList{}, client.InNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	start := time.Now()
	opts := options{
		kubeconfig: kubeconfig, namespace: ns, prefix: "c-", objects: 4, static: 2,
		rate: 40, duration: 4 * time.Second, // the first write waits for discovery (about 2 s)
		hostIP: netip.MustParseAddr("192.0.2.7"), localPodIPs: []netip.Addr{netip.MustParseAddr("10.250.0.2"), netip.MustParseAddr("10.250.0.3")},
		remotePods: 2, recreateFraction: 0.25,
		nodeName: "node-a", newPodIPs: []netip.Addr{netip.MustParseAddr("10.250.0.9")}, newPodsAt: 0.5,
		triggerKey: v1alpha1.AnnotationLastChangeTriggerTime, traceParentKey: v1alpha1.AnnotationTraceParent,
		seed: 7,
	}
	sum, err := churn(ctx, opts, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("churn: %v (summary %+v)", err, sum)
	}
	end := time.Now()
	if sum.TriggersWritten != sum.Creates+sum.Updates+sum.Recreates || sum.Errors != 0 || sum.Objects != 6 {
		t.Fatalf("summary %+v: want triggers = creates + updates + recreates, no errors, 6 objects", sum)
	}
	if sum.NewPods != 1 {
		t.Fatalf("summary %+v: want 1 new pod", sum)
	}
	if sum.Updates == 0 || sum.Recreates == 0 {
		t.Fatalf("summary %+v: the run made no updates or no recreates; the test proves nothing", sum)
	}

	// Every write churn counted arrives as an ADDED or MODIFIED event with a
	// trigger of its own.
	type version struct{ uid, trigger string }
	seen := map[version]bool{}
	listingNew := 0
	timeout := time.After(20 * time.Second)
	for len(seen) < sum.TriggersWritten {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("watch closed after %d of %d triggers", len(seen), sum.TriggersWritten)
			}
			if ev.Type != watch.Added && ev.Type != watch.Modified {
				continue
			}
			pe := ev.Object.(*v1alpha1.PolicyEndpoint)
			trigger := pe.Annotations[opts.triggerKey]
			v := version{string(pe.UID), trigger}
			if seen[v] {
				t.Errorf("%s/%s: trigger %s written twice", pe.Namespace, pe.Name, trigger)
			}
			seen[v] = true
			if checkWrite(t, pe, opts, start, end) {
				listingNew++
			}
		case <-timeout:
			t.Fatalf("watch saw %d triggers, churn reported %d", len(seen), sum.TriggersWritten)
		}
	}
	select {
	case ev := <-w.ResultChan():
		if ev.Type == watch.Added || ev.Type == watch.Modified {
			t.Errorf("a write beyond the %d churn reported: %s", sum.TriggersWritten, ev.Type)
		}
	case <-time.After(500 * time.Millisecond):
	}

	if listingNew == 0 {
		t.Error("no write listed the new pod")
	}
	// The new pod is on the node with its IP, and every object selects it.
	var pod corev1.Pod
	if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: newPodName(0)}, &pod); err != nil {
		t.Fatal(err)
	}
	if pod.Spec.NodeName != opts.nodeName || pod.Status.PodIP != opts.newPodIPs[0].String() || pod.Labels[newPodLabel] != pod.Name {
		t.Errorf("pod %s/%s: node %q, IP %q, labels %v; want %s, %s, %s=%s", ns, pod.Name, pod.Spec.NodeName, pod.Status.PodIP, pod.Labels, opts.nodeName, opts.newPodIPs[0], newPodLabel, pod.Name)
	}

	var list v1alpha1.PolicyEndpointList
	if err := cp.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != sum.Objects {
		t.Errorf("%d PolicyEndpoints in %s, churn reported %d objects", len(list.Items), ns, sum.Objects)
	}
}

// checkWrite checks one written version: a trigger time inside the run, a valid
// sampled traceparent, one local pod on the host IP (plus, once they started, a
// new pod), the remote pods off it, and, on the changing objects, a podSelector
// naming the new pod they list (the static ones never list one). It reports
// whether the version lists a new pod.
func checkWrite(t *testing.T, pe *v1alpha1.PolicyEndpoint, o options, start, end time.Time) (listsNew bool) {
	t.Helper()
	name := pe.Namespace + "/" + pe.Name
	trigger, err := time.Parse(time.RFC3339Nano, pe.Annotations[o.triggerKey])
	if err != nil {
		t.Errorf("%s: trigger annotation: %v", name, err)
	} else if trigger.Before(start.Add(-time.Second)) || trigger.After(end) {
		t.Errorf("%s: trigger %s outside the run [%s, %s]", name, trigger, start, end)
	}
	carrier := propagation.MapCarrier{"traceparent": pe.Annotations[o.traceParentKey]}
	sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), carrier))
	if !sc.IsValid() || !sc.IsSampled() {
		t.Errorf("%s: traceparent %q is not a valid sampled W3C traceparent", name, carrier["traceparent"])
	}
	var local, fresh, remote int
	for _, p := range pe.Spec.PodSelectorEndpoints {
		switch {
		case string(p.HostIP) != o.hostIP.String():
			remote++
		case slices.ContainsFunc(o.newPodIPs, func(ip netip.Addr) bool { return ip.String() == string(p.PodIP) }):
			fresh++
		default:
			local++
		}
	}
	if local != 1 || fresh > 1 || remote != o.remotePods {
		t.Errorf("%s: %d pods on %s, %d new ones, %d elsewhere; want 1, at most 1, %d", name, local, o.hostIP, fresh, remote, o.remotePods)
	}
	var idx int
	if _, err := fmt.Sscanf(strings.TrimPrefix(pe.Name, o.prefix), "%d", &idx); err != nil {
		t.Fatalf("%s: not a churn name: %v", name, err)
	}
	sel := pe.Spec.PodSelector
	switch {
	case idx >= o.objects && (sel != nil || fresh > 0):
		t.Errorf("%s: a static object with podSelector %v listing %d new pods, want neither", name, sel, fresh)
	case idx < o.objects && (sel == nil || sel.MatchLabels[newPodLabel] != newPodName(idx%len(o.newPodIPs))):
		t.Errorf("%s: podSelector %v, want %s=%s", name, sel, newPodLabel, newPodName(idx%len(o.newPodIPs)))
	}
	return fresh == 1
}
