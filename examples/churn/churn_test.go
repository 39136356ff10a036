package main

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
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
	if sum.Updates == 0 || sum.Recreates == 0 {
		t.Fatalf("summary %+v: the run made no updates or no recreates; the test proves nothing", sum)
	}

	// Every write churn counted arrives as an ADDED or MODIFIED event with a
	// trigger of its own.
	type version struct{ uid, trigger string }
	seen := map[version]bool{}
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
			checkWrite(t, pe, opts, start, end)
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

	var list v1alpha1.PolicyEndpointList
	if err := cp.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != sum.Objects {
		t.Errorf("%d PolicyEndpoints in %s, churn reported %d objects", len(list.Items), ns, sum.Objects)
	}
}

// checkWrite checks one written version: a trigger time inside the run, a valid
// sampled traceparent, one local pod on the host IP and the remote pods off it.
func checkWrite(t *testing.T, pe *v1alpha1.PolicyEndpoint, o options, start, end time.Time) {
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
	var local, remote int
	for _, p := range pe.Spec.PodSelectorEndpoints {
		if string(p.HostIP) == o.hostIP.String() {
			local++
		} else {
			remote++
		}
	}
	if local != 1 || remote != o.remotePods {
		t.Errorf("%s: %d pods on %s and %d elsewhere, want 1 and %d", name, local, o.hostIP, remote, o.remotePods)
	}
}
