package reconcile

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/podif"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/seen"
	"github.com/npagent/npagent/internal/testenv"
	"github.com/npagent/npagent/internal/translate"
)

// recordingSink keeps everything the loop reports, for assertions.
type recordingSink struct {
	mu         sync.Mutex
	records    []*report.Record
	commits    int
	commitErrs int
	pods       []*report.PodRecord // report.PodSink: new pods' windows
	unselected int
}

func newRecordingSink() *recordingSink { return &recordingSink{} }

func (s *recordingSink) Report(r *report.Record) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.records = append(s.records, r)
}

func (s *recordingSink) Committed(_ report.Kind, a *report.Attempt) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.commits++
	if a.Err != "" {
		s.commitErrs++
	}
}

// invalidCount is the loop's count of rejected versions of kind k in field.
func invalidCount(c *Controller, k report.Kind, field string) uint64 {
	var counts report.Counts
	c.Counts(&counts)
	return counts.InvalidObjects[report.InvalidObject{Kind: k, Field: field}]
}

// recordsFor returns the records of one uid, oldest first.
func (s *recordingSink) recordsFor(uid string) []*report.Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*report.Record
	for _, r := range s.records {
		if r.UID == uid {
			out = append(out, r)
		}
	}
	return out
}

func (s *recordingSink) recordCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.records)
}

// lookupTableResolver is the tests' podif.Resolver: a pure lookup table from pod IP
// to a made-up ifindex, so the memory dataplane can be driven without interfaces.
type lookupTableResolver struct {
	mu    sync.Mutex
	table map[netip.Addr]int
}

func newLookupTableResolver(pairs ...any) *lookupTableResolver {
	r := &lookupTableResolver{table: map[netip.Addr]int{}}
	for i := 0; i < len(pairs); i += 2 {
		r.table[netip.MustParseAddr(pairs[i].(string))] = pairs[i+1].(int)
	}
	return r
}

func (r *lookupTableResolver) set(ip string, ifindex int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.table[netip.MustParseAddr(ip)] = ifindex
}

func (r *lookupTableResolver) Resolve(ip netip.Addr) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ifindex, ok := r.table[ip]; ok {
		return ifindex, nil
	}
	return 0, fmt.Errorf("lookup table has no %s: %w", ip, podif.ErrInterfaceNotFound)
}

// failingDataplane fails the first failures Commit calls of policies with rules, then
// passes them on. A policy without rules (the isolation of a pod whose commit failed)
// always passes.
type failingDataplane struct {
	bpfmaps.Dataplane
	failures atomic.Int32
	calls    atomic.Int32
}

var errInjected = errors.New("injected commit failure")

func (d *failingDataplane) Commit(ifindex int, p bpfmaps.PodPolicy) (bpfmaps.CommitResult, error) {
	d.calls.Add(1)
	if hasRules(p) && d.failures.Add(-1) >= 0 {
		return bpfmaps.CommitResult{}, errInjected
	}
	return d.Dataplane.Commit(ifindex, p)
}

// agent is one running Controller with its seen-set and sink.
type agent struct {
	c    *Controller
	seen *seen.Set
	sink *recordingSink
	dp   bpfmaps.Dataplane
	stop func() // cancels Run and waits for it; also run at cleanup
}

type agentOptions struct {
	nodeIP   string
	dp       bpfmaps.Dataplane
	resolver podif.Resolver
	resync   time.Duration
	state    string // seen-set state file; "" for none
	logger   *slog.Logger
	compile  translate.Options
	// watchStall is Config.WatchStallTimeout; 0 for the default.
	watchStall time.Duration
	lastValid  string // LastValidDir; "" for none
	mode       EnforcingMode
	share      float64 // NamespaceEntryShare; 0: not enforced
	podStatus  bool    // Config.PodStatus
	podSeen    *seen.Set
	// restConfig reaches the apiserver instead of cp.Config (a counting transport).
	restConfig *rest.Config
}

func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// startAgent runs a Controller against the control plane until the test ends, and
// waits for its caches to sync.
func startAgent(t testing.TB, cp *testenv.ControlPlane, o agentOptions) *agent {
	t.Helper()
	var opts []seen.Option
	if o.state != "" {
		opts = append(opts, seen.WithStatePath(o.state))
	}
	set, err := seen.New(time.Now(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	if o.dp == nil {
		o.dp = bpfmaps.NewMemory()
	}
	if o.logger == nil {
		o.logger = testLogger(t)
	}
	a := &agent{seen: set, sink: newRecordingSink(), dp: o.dp}
	restConfig := cp.Config
	if o.restConfig != nil {
		restConfig = o.restConfig
	}
	a.c, err = New(restConfig, Config{
		NodeName:      "node-" + o.nodeIP,
		NodeIP:        netip.MustParseAddr(o.nodeIP),
		Dataplane:     o.dp,
		Seen:          set,
		Sink:          a.sink,
		Resolver:      o.resolver,
		ResyncPeriod:  o.resync,
		MaxRetryDelay: 500 * time.Millisecond,
		Logger:        o.logger,
		Compile:       o.compile,
		LastValidDir:  o.lastValid,
		EnforcingMode: o.mode,

		NamespaceEntryShare: o.share,
		PodStatus:           o.podStatus,
		PodStatusQPS:        50,
		PodSeen:             o.podSeen,

		WatchStallTimeout: o.watchStall,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.c.Run(ctx) }()
	var once sync.Once
	a.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("Run did not return 30s after its context ended")
			}
			if err := set.Persist(); err != nil {
				t.Errorf("persist seen-set: %v", err)
			}
		})
	}
	t.Cleanup(a.stop)
	testenv.Eventually(t, 2*time.Minute, "caches synced", a.c.HasSynced) // 50k objects on a loaded machine
	return a
}

// createNamespace creates namespace name, or keeps it if an earlier test on the
// shared control plane made it (no namespace controller runs there: a deleted
// namespace would stay terminating and refuse new objects, so none is deleted).
func createNamespace(t testing.TB, cp *testenv.ControlPlane, name string) {
	t.Helper()
	if err := cp.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create namespace %s: %v", name, err)
	}
}

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// sharedCP is the package's shared control plane (testenv.Shared), emptied of what an
// earlier test left that an agent reads: every agent watches the whole cluster, so a
// test must start with no PolicyEndpoint, ClusterPolicyEndpoint or pod but its own.
// Tests that stop, restart or compact the control plane use testenv.Start.
func sharedCP(t testing.TB) *testenv.ControlPlane {
	t.Helper()
	cp := testenv.Shared(t)
	ctx := context.Background()
	var pes v1alpha1.PolicyEndpointList
	var cpes v1alpha1.ClusterPolicyEndpointList
	var pods corev1.PodList
	testenv.Eventually(t, 30*time.Second, "the shared control plane emptied of the last test's objects", func() bool {
		for _, list := range []client.ObjectList{&pes, &cpes, &pods} {
			if err := cp.Client.List(ctx, list); err != nil {
				t.Fatalf("list %T: %v", list, err)
			}
		}
		if len(pes.Items)+len(cpes.Items)+len(pods.Items) == 0 {
			return true
		}
		var objs []client.Object
		for i := range pes.Items {
			objs = append(objs, &pes.Items[i])
		}
		for i := range cpes.Items {
			objs = append(objs, &cpes.Items[i])
		}
		for i := range pods.Items {
			objs = append(objs, &pods.Items[i])
		}
		for _, o := range objs {
			// Pods bound to a node wait for a kubelet to confirm; none runs here.
			if err := cp.Client.Delete(ctx, o, client.GracePeriodSeconds(0)); err != nil && !apierrors.IsNotFound(err) {
				t.Fatalf("delete %T %s/%s: %v", o, o.GetNamespace(), o.GetName(), err)
			}
		}
		return false
	})
	return cp
}

// stamp sets a fresh trigger annotation and returns it. Triggers are strictly
// increasing within a test so every write carries a new one.
func stamp(obj metav1.Object) time.Time {
	now := nextTrigger()
	ann := obj.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	ann[v1alpha1.AnnotationLastChangeTriggerTime] = now.Format(time.RFC3339Nano)
	obj.SetAnnotations(ann)
	return now
}

var (
	triggerMu   sync.Mutex
	lastTrigger time.Time
)

func nextTrigger() time.Time {
	triggerMu.Lock()
	defer triggerMu.Unlock()
	now := time.Now().UTC()
	if !now.After(lastTrigger) {
		now = lastTrigger.Add(time.Microsecond)
	}
	lastTrigger = now
	return now
}

func create(t testing.TB, cp *testenv.ControlPlane, obj client.Object) time.Time {
	t.Helper()
	trigger := stamp(obj)
	if err := cp.Client.Create(context.Background(), obj); err != nil {
		t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
	return trigger
}

// update applies change to the stored object, stamps a new trigger and writes it.
func update[T client.Object](t testing.TB, cp *testenv.ControlPlane, obj T, change func(T)) time.Time {
	t.Helper()
	if err := cp.Client.Get(context.Background(), client.ObjectKeyFromObject(obj), obj); err != nil {
		t.Fatalf("get %s: %v", obj.GetName(), err)
	}
	change(obj)
	trigger := stamp(obj)
	if err := cp.Client.Update(context.Background(), obj); err != nil {
		t.Fatalf("update %s: %v", obj.GetName(), err)
	}
	return trigger
}

func remove(t testing.TB, cp *testenv.ControlPlane, obj client.Object) {
	t.Helper()
	if err := cp.Client.Delete(context.Background(), obj); err != nil {
		t.Fatalf("delete %s: %v", obj.GetName(), err)
	}
}

// triggersOf returns the reported trigger times of the records, sorted.
func triggersOf(recs []*report.Record) []time.Time {
	out := make([]time.Time, len(recs))
	for i, r := range recs {
		out[i] = r.Trigger
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Before(out[j]) })
	return out
}

func sameTimes(a, b []time.Time) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].Equal(b[i]) {
			return false
		}
	}
	return true
}

func hasRules(p bpfmaps.PodPolicy) bool {
	for _, d := range []bpfmaps.DirectionPolicy{p.Ingress, p.Egress} {
		if len(d.Allow)+len(d.AllowSets)+len(d.Admin)+len(d.Baseline) > 0 {
			return true
		}
	}
	return false
}

func ptr[T any](v T) *T { return &v }

var testNode = netip.MustParseAddr("192.0.2.10")

func pod(hostIP, podIP string) v1alpha1.PodEndpoint {
	return v1alpha1.PodEndpoint{HostIP: v1alpha1.NetworkAddress(hostIP), PodIP: v1alpha1.NetworkAddress(podIP), Name: "p-" + podIP, Namespace: "shop"}
}

// waitInitialSync waits until the agent synced every object of its initial list once
// and has nothing queued.
func waitInitialSync(t testing.TB, a *agent) {
	t.Helper()
	testenv.Eventually(t, 20*time.Second, "the agent's initial sync done, nothing queued", func() bool {
		a.c.initial.mu.Lock()
		done := a.c.initial.begun && a.c.initial.pending == nil
		a.c.initial.mu.Unlock()
		return done && a.c.queue.Len() == 0
	})
}
