package seen_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/seen"
	"github.com/npagent/npagent/internal/testenv"
)

var peGVR = schema.GroupVersionResource{Group: v1alpha1.GroupName, Version: "v1alpha1", Resource: v1alpha1.ResourcePolicyEndpoints}

// observer is an informer handler that feeds the seen-set the way the agent does:
// Observe at event time, and — standing in for the worker and the dataplane, which
// this test is not about — an immediate Committed for every accepted trigger.
type observer struct {
	t   *testing.T
	set *seen.Set

	mu       sync.Mutex
	answers  map[report.Reason]int
	events   int
	reported map[string]int // uid/trigger → reports
}

func newObserver(t *testing.T, set *seen.Set) *observer {
	return &observer{t: t, set: set, answers: map[report.Reason]int{}, reported: map[string]int{}}
}

func (o *observer) handle(obj any) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	received := time.Now()
	uid := string(u.GetUID())
	trigger, err := seen.ParseTrigger(u.GetAnnotations()[v1alpha1.AnnotationLastChangeTriggerTime])
	o.mu.Lock()
	defer o.mu.Unlock()
	o.events++
	if err != nil {
		o.set.ObserveInvalid(uid)
		o.answers[report.InvalidAnnotation]++
		return
	}
	r := o.set.Observe(uid, trigger, received)
	o.answers[r]++
	if r != report.Accepted {
		return
	}
	now := time.Now()
	reports, err := o.set.Committed(uid, trigger, report.Attempt{Start: now, End: now})
	if err != nil {
		o.t.Errorf("Committed %s: %v", u.GetName(), err)
	}
	for _, rep := range reports {
		o.reported[rep.UID+"/"+rep.Trigger.Format(time.RFC3339Nano)]++
	}
}

type snapshot struct {
	events   int
	answers  map[report.Reason]int
	reported int
}

func (o *observer) snapshot() snapshot {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := snapshot{events: o.events, answers: map[report.Reason]int{}}
	for k, v := range o.answers {
		s.answers[k] = v
	}
	for _, n := range o.reported {
		s.reported += n
	}
	return s
}

func (o *observer) duplicates() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var d []string
	for k, n := range o.reported {
		if n > 1 {
			d = append(d, fmt.Sprintf("%s reported %d times", k, n))
		}
	}
	return d
}

func runInformer(t *testing.T, client dynamic.Interface, resync time.Duration, o *observer) (stop func()) {
	t.Helper()
	factory := dynamicinformer.NewDynamicSharedInformerFactory(client, resync)
	inf := factory.ForResource(peGVR).Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    o.handle,
		UpdateFunc: func(_, newObj any) { o.handle(newObj) },
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("informer cache did not sync")
	}
	return func() { cancel(); factory.Shutdown() }
}

func newPE(name string, trigger time.Time) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(v1alpha1.SchemeGroupVersion.String())
	u.SetKind("PolicyEndpoint")
	u.SetNamespace("default")
	u.SetName(name)
	u.SetAnnotations(map[string]string{v1alpha1.AnnotationLastChangeTriggerTime: trigger.UTC().Format(time.RFC3339Nano)})
	_ = unstructured.SetNestedField(u.Object, map[string]any{"name": name, "namespace": "default"}, "spec", "policyRef")
	return u
}

// TestInformerRedeliveriesSuppressed drives the seen-set from a real informer on a real
// kube-apiserver through every re-delivery of DESIGN.md's table that a running agent
// meets — resync, relist after an apiserver restart, and an agent restart that restores
// the state file — and shows that each re-delivered object is suppressed as redelivered,
// nothing is reported twice, and a genuine update made after the restart is reported.
func TestInformerRedeliveriesSuppressed(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: needs the real kube-apiserver (run without -short)")
	}
	cp := testenv.Start(t)
	client, err := dynamic.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	pes := client.Resource(peGVR).Namespace("default")

	const n = 20
	state := filepath.Join(t.TempDir(), "seen.state")
	start := time.Now().Add(-time.Second)
	set, restoreErr := seen.New(start, seen.WithStatePath(state))
	if restoreErr != nil {
		t.Fatalf("first start: unexpected restore error: %v", restoreErr)
	}
	for i := range n {
		if _, err := pes.Create(ctx, newPE(fmt.Sprintf("pe-%02d", i), time.Now()), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// Resync: a 1 s resync period re-delivers every object with its unchanged
	// resourceVersion, again and again.
	o := newObserver(t, set)
	stop := runInformer(t, client, time.Second, o)
	testenv.Eventually(t, 10*time.Second, "every object reported once", func() bool { return o.snapshot().reported == n })
	afterAdd := o.snapshot()
	testenv.Eventually(t, 15*time.Second, "two resync rounds", func() bool { return o.snapshot().events >= afterAdd.events+2*n })
	stop()
	s := o.snapshot()
	if got := s.answers[report.Redelivered]; got < 2*n {
		t.Errorf("resync: %d redelivered answers, want at least %d", got, 2*n)
	}
	if s.reported != n || s.answers[report.Accepted] != n {
		t.Errorf("resync: accepted %d, reported %d; want %d and %d", s.answers[report.Accepted], s.reported, n, n)
	}

	// Relist: an informer without resync, then an apiserver restart. With the watch
	// cache on, the restarted apiserver answers the old resourceVersion with 410 and the
	// reflector lists everything again: one OnUpdate per object, same resourceVersion.
	o2 := newObserver(t, set)
	stop2 := runInformer(t, client, 0, o2)
	testenv.Eventually(t, 10*time.Second, "initial list", func() bool { return o2.snapshot().events >= n })
	beforeRestart := o2.snapshot()
	cp.RestartAPIServer(t)
	testenv.Eventually(t, 60*time.Second, "relist after the apiserver restart", func() bool { return o2.snapshot().events >= beforeRestart.events+n })
	relisted := o2.snapshot()
	if got := relisted.answers[report.Redelivered]; got != relisted.events {
		t.Errorf("relist: %d of %d deliveries answered redelivered (answers %v)", got, relisted.events, relisted.answers)
	}

	// A genuine update after the restart: a new trigger, accepted and reported once.
	updated := newPE("pe-00", time.Now())
	cur, err := pes.Get(ctx, "pe-00", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.SetAnnotations(updated.GetAnnotations())
	if _, err := pes.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the genuine update reported", func() bool { return o2.snapshot().reported == 1 })
	stop2()
	if got := o2.snapshot().answers[report.Accepted]; got != 1 {
		t.Errorf("after the restart: %d accepted, want exactly 1 (the genuine update)", got)
	}

	// Agent restart: a new process restores the state file; its initial list delivers
	// every object again and none is reported.
	if err := set.Persist(); err != nil {
		t.Fatal(err)
	}
	restarted, restoreErr := seen.New(time.Now(), seen.WithStatePath(state))
	if restoreErr != nil {
		t.Fatalf("agent restart: restore: %v", restoreErr)
	}
	o3 := newObserver(t, restarted)
	stop3 := runInformer(t, client, 0, o3)
	testenv.Eventually(t, 10*time.Second, "initial list after the agent restart", func() bool { return o3.snapshot().events >= n })
	stop3()
	if s := o3.snapshot(); s.reported != 0 || s.answers[report.Redelivered] != s.events {
		t.Errorf("agent restart: %d reported, %d of %d redelivered (answers %v); want 0 and all", s.reported, s.answers[report.Redelivered], s.events, s.answers)
	}

	for _, obs := range []*observer{o, o2, o3} {
		for _, d := range obs.duplicates() {
			t.Error(d)
		}
	}
}
