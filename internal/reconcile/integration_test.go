package reconcile

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/testenv"
)

var (
	tcp  = bpfmaps.ProtocolTCP
	addr = netip.MustParseAddr
)

func ingressPE(ns, name string, pods []v1alpha1.PodEndpoint, cidr string, port int32) *v1alpha1.PolicyEndpoint {
	pods = slices.Clone(pods)
	for i := range pods {
		pods[i].Namespace = ns // a PolicyEndpoint selects pods of its own namespace
	}
	return &v1alpha1.PolicyEndpoint{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.PolicyEndpointSpec{
			PolicyRef:            v1alpha1.PolicyReference{Name: name, Namespace: ns},
			PodIsolation:         []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			PodSelectorEndpoints: pods,
			Ingress:              []v1alpha1.EndpointInfo{{CIDR: v1alpha1.NetworkAddress(cidr), Ports: []v1alpha1.Port{{Port: ptr(port)}}}},
		},
	}
}

// TestIntegration runs the loop against a real kube-apiserver with the in-memory
// dataplane. Each subtest uses its own node IP, so the others' objects are not local.
func TestIntegration(t *testing.T) {
	cp := sharedCP(t)

	t.Run("lifecycle", func(t *testing.T) { testLifecycle(t, cp) })
	t.Run("no local pods", func(t *testing.T) { testNoLocalPods(t, cp) })
	t.Run("interface appears later", func(t *testing.T) { testInterfaceLater(t, cp) })
	t.Run("failed commits retried", func(t *testing.T) { testFailedCommits(t, cp) })
	t.Run("bad input", func(t *testing.T) { testBadInput(t, cp) })
	t.Run("two nodes", func(t *testing.T) { testTwoNodes(t, cp) })
	t.Run("resync", func(t *testing.T) { testResync(t, cp) })
	t.Run("agent restart", func(t *testing.T) { testAgentRestart(t, cp) })
}

// testLifecycle: create, update, merge with a second PE and a CPE, delete.
func testLifecycle(t *testing.T, cp *testenv.ControlPlane) {
	const node = "192.0.2.1"
	createNamespace(t, cp, "life")
	resolver := newLookupTableResolver("10.1.0.1", 11, "10.1.0.2", 12)
	mem := bpfmaps.NewMemory()
	a := startAgent(t, cp, agentOptions{nodeIP: node, dp: mem, resolver: resolver})

	pods := []v1alpha1.PodEndpoint{pod(node, "10.1.0.1"), pod(node, "10.1.0.2"), pod("192.0.2.99", "10.1.9.9")}
	web := ingressPE("life", "web", pods, "10.2.0.0/16", 80)
	t1 := create(t, cp, web)
	testenv.Eventually(t, 20*time.Second, "record for the create", func() bool { return len(a.sink.recordsFor(string(web.UID))) == 1 })

	rec := a.sink.recordsFor(string(web.UID))[0]
	if !rec.Trigger.Equal(t1) || rec.Kind != report.KindPolicyEndpoint || rec.Namespace != "life" || rec.Name != "web" ||
		rec.PolicyRef != "web" || rec.Pods != 2 || rec.Entries == 0 || len(rec.Attempts) != 1 || rec.Attempts[0].Err != "" ||
		rec.ResourceVersion == "" {
		t.Errorf("record = %+v", rec)
	}
	if rec.Received.Before(rec.Trigger) || rec.WorkerStart.Before(rec.Received) || rec.ComputeEnd.Before(rec.ComputeStart) ||
		rec.Attempts[0].End.Before(rec.Attempts[0].Start) {
		t.Errorf("record times out of order: %+v", rec)
	}
	for _, ifindex := range []int{11, 12} {
		if !mem.Verdict(ifindex, bpfmaps.Ingress, addr("10.2.3.4"), tcp, 80) || mem.Verdict(ifindex, bpfmaps.Ingress, addr("10.2.3.4"), tcp, 81) ||
			mem.Verdict(ifindex, bpfmaps.Ingress, addr("10.3.0.1"), tcp, 80) {
			t.Errorf("pod ifindex %d: web policy not in force", ifindex)
		}
	}
	if got := mem.Pods(); len(got) != 2 {
		t.Errorf("dataplane pods = %v, want the two local pods", got)
	}

	// Update: port 80 → 8080, and pod 10.1.0.2 leaves the policy.
	t2 := update(t, cp, web, func(pe *v1alpha1.PolicyEndpoint) {
		pe.Spec.Ingress[0].Ports[0].Port = ptr[int32](8080)
		pe.Spec.PodSelectorEndpoints = pe.Spec.PodSelectorEndpoints[:1]
	})
	testenv.Eventually(t, 20*time.Second, "record for the update", func() bool { return len(a.sink.recordsFor(string(web.UID))) == 2 })
	if got := triggersOf(a.sink.recordsFor(string(web.UID))); !sameTimes(got, []time.Time{t1, t2}) {
		t.Errorf("reported triggers %v, want %v and %v", got, t1, t2)
	}
	if mem.Verdict(11, bpfmaps.Ingress, addr("10.2.3.4"), tcp, 80) || !mem.Verdict(11, bpfmaps.Ingress, addr("10.2.3.4"), tcp, 8080) {
		t.Errorf("pod 11: updated policy not in force")
	}
	if got := mem.Pods(); len(got) != 1 || got[0] != 11 {
		t.Errorf("dataplane pods = %v: the pod no policy selects must be removed", got)
	}

	// A second PE on pod 11 merges with the first: union of allow rules.
	metrics := ingressPE("life", "metrics", pods[:1], "10.3.0.0/16", 9090)
	create(t, cp, metrics)
	testenv.Eventually(t, 20*time.Second, "record for the second PE", func() bool { return len(a.sink.recordsFor(string(metrics.UID))) == 1 })
	if !mem.Verdict(11, bpfmaps.Ingress, addr("10.2.3.4"), tcp, 8080) || !mem.Verdict(11, bpfmaps.Ingress, addr("10.3.0.1"), tcp, 9090) ||
		mem.Verdict(11, bpfmaps.Ingress, addr("10.3.0.1"), tcp, 8080) {
		t.Errorf("pod 11: merged policy of web and metrics not in force")
	}

	// An admin-tier CPE deny beats the namespaced allow.
	deny := &v1alpha1.ClusterPolicyEndpoint{
		ObjectMeta: metav1.ObjectMeta{Name: "life-deny-scanner"},
		Spec: v1alpha1.ClusterPolicyEndpointSpec{
			PolicyRef: v1alpha1.ClusterPolicyReference{Name: "deny-scanner"}, Tier: v1alpha1.TierAdmin, Priority: 5,
			Subject:              v1alpha1.ClusterPolicySubject{Namespaces: &metav1.LabelSelector{}},
			PodSelectorEndpoints: pods,
			Ingress:              []v1alpha1.ClusterEndpointInfo{{Action: v1alpha1.ClusterRuleActionDeny, CIDR: "10.2.66.0/24"}},
		},
	}
	create(t, cp, deny)
	testenv.Eventually(t, 20*time.Second, "record for the CPE", func() bool { return len(a.sink.recordsFor(string(deny.UID))) == 1 })
	if r := a.sink.recordsFor(string(deny.UID))[0]; r.Kind != report.KindClusterPolicyEndpoint || r.Namespace != "" || r.Pods != 2 {
		t.Errorf("CPE record = %+v (pods: both local pods)", r)
	}
	if mem.Verdict(11, bpfmaps.Ingress, addr("10.2.66.1"), tcp, 8080) || !mem.Verdict(11, bpfmaps.Ingress, addr("10.2.3.4"), tcp, 8080) {
		t.Errorf("pod 11: admin deny not merged in")
	}
	if mem.Verdict(12, bpfmaps.Ingress, addr("10.2.66.1"), tcp, 8080) || !mem.Verdict(12, bpfmaps.Ingress, addr("10.9.9.9"), tcp, 1) {
		t.Errorf("pod 12: only the CPE selects it: deny from the scanner, otherwise open")
	}

	// Delete web: pod 11 keeps metrics and the CPE; web's seen-set entry is forgotten.
	remove(t, cp, web)
	testenv.Eventually(t, 20*time.Second, "web's rule gone from pod 11", func() bool {
		return !mem.Verdict(11, bpfmaps.Ingress, addr("10.2.3.4"), tcp, 8080)
	})
	if !mem.Verdict(11, bpfmaps.Ingress, addr("10.3.0.1"), tcp, 9090) {
		t.Errorf("pod 11: metrics policy lost with web's delete")
	}
	remove(t, cp, metrics)
	remove(t, cp, deny)
	testenv.Eventually(t, 20*time.Second, "every pod removed", func() bool { return len(mem.Pods()) == 0 })

	// Every genuine write's trigger was reported exactly once: web's create and
	// update, metrics' and the CPE's creates. Deletes report nothing.
	if n := len(a.sink.recordsFor(string(web.UID))); n != 2 {
		t.Errorf("web: %d records, want 2", n)
	}
	time.Sleep(200 * time.Millisecond)
	if n := a.sink.recordCount(); n != 4 {
		t.Errorf("%d records in all, want 4", n)
	}
	if st := a.seen.Stats(); st.Pending != 0 {
		t.Errorf("seen-set still holds %d pending triggers after every delete", st.Pending)
	}
	s := a.c.Stats()
	if s.Delivered(report.KindPolicyEndpoint, report.CauseAdd) < 2 || s.Delivered(report.KindPolicyEndpoint, report.CauseUpdate) < 1 || s.Delivered(report.KindPolicyEndpoint, report.CauseDelete) != 2 ||
		s.Delivered(report.KindClusterPolicyEndpoint, report.CauseDelete) != 1 {
		t.Errorf("deliveries = %+v", s.Deliveries)
	}
}

// testNoLocalPods: an object selecting only other nodes' pods commits nothing and
// reports nothing; its trigger is consumed as no_local_pods.
func testNoLocalPods(t *testing.T, cp *testenv.ControlPlane) {
	const node = "192.0.2.2"
	createNamespace(t, cp, "remote")
	mem := bpfmaps.NewMemory()
	a := startAgent(t, cp, agentOptions{nodeIP: node, dp: mem, resolver: newLookupTableResolver()})
	before := a.c.Stats()
	pe := ingressPE("remote", "elsewhere", []v1alpha1.PodEndpoint{pod("192.0.2.98", "10.1.8.1")}, "10.0.0.0/8", 80)
	create(t, cp, pe)
	testenv.Eventually(t, 20*time.Second, "no-local-work counted", func() bool {
		// Both counters: the worker bumps the seen-set's, then its own.
		return a.seen.Stats().Suppressed[report.NoLocalPods] >= 1 && a.c.Stats().NoLocalWork > before.NoLocalWork
	})
	s := a.c.Stats()
	if s.NoLocalWork == before.NoLocalWork || s.Commits != before.Commits || len(mem.Pods()) != 0 {
		t.Errorf("stats %+v (before %+v), dataplane pods %v: want no commit", s, before, mem.Pods())
	}
	if n := len(a.sink.recordsFor(string(pe.UID))); n != 0 {
		t.Errorf("%d records for an object with no local pods", n)
	}
}

// testInterfaceLater: a local pod whose interface is not there yet is retried; when
// the resolver finds it, the pod is programmed and the trigger reported once, with the
// wait in its latency.
func testInterfaceLater(t *testing.T, cp *testenv.ControlPlane) {
	const node = "192.0.2.3"
	createNamespace(t, cp, "late")
	mem := bpfmaps.NewMemory()
	resolver := newLookupTableResolver()
	a := startAgent(t, cp, agentOptions{nodeIP: node, dp: mem, resolver: resolver})
	pe := ingressPE("late", "web", []v1alpha1.PodEndpoint{pod(node, "10.1.3.1")}, "10.2.0.0/16", 80)
	trigger := create(t, cp, pe)
	testenv.Eventually(t, 20*time.Second, "the loop waits for the interface", func() bool { return a.c.Stats().InterfaceWaits >= 2 })
	if len(mem.Pods()) != 0 || len(a.sink.recordsFor(string(pe.UID))) != 0 {
		t.Fatalf("nothing may be committed or reported before the interface exists")
	}
	if newest, ok := a.seen.Pending(string(pe.UID)); !ok || !newest.Equal(trigger) {
		t.Errorf("trigger not pending while waiting: %v %v", newest, ok)
	}
	appeared := time.Now()
	resolver.set("10.1.3.1", 31)
	testenv.Eventually(t, 20*time.Second, "record once the interface exists", func() bool { return len(a.sink.recordsFor(string(pe.UID))) == 1 })
	rec := a.sink.recordsFor(string(pe.UID))[0]
	if rec.Committed().Before(appeared) || !rec.Trigger.Equal(trigger) || len(rec.Attempts) != 1 {
		t.Errorf("record = %+v: want the commit after the interface appeared, one attempt", rec)
	}
	if !mem.Verdict(31, bpfmaps.Ingress, addr("10.2.0.1"), tcp, 80) || mem.Verdict(31, bpfmaps.Ingress, addr("10.3.0.1"), tcp, 80) {
		t.Errorf("policy not in force on the late pod")
	}
}

// testFailedCommits: a dataplane that fails twice then succeeds yields one record with
// three attempts, the first two failed.
func testFailedCommits(t *testing.T, cp *testenv.ControlPlane) {
	const node = "192.0.2.4"
	createNamespace(t, cp, "flaky")
	mem := bpfmaps.NewMemory()
	dp := &failingDataplane{Dataplane: mem}
	a := startAgent(t, cp, agentOptions{nodeIP: node, dp: dp, resolver: newLookupTableResolver("10.1.4.1", 41)})
	dp.failures.Store(2)
	pe := ingressPE("flaky", "web", []v1alpha1.PodEndpoint{pod(node, "10.1.4.1")}, "10.2.0.0/16", 80)
	trigger := create(t, cp, pe)
	testenv.Eventually(t, 20*time.Second, "record after retries", func() bool { return len(a.sink.recordsFor(string(pe.UID))) == 1 })
	rec := a.sink.recordsFor(string(pe.UID))[0]
	if !rec.Trigger.Equal(trigger) || len(rec.Attempts) != 3 {
		t.Fatalf("record = %+v, want 3 attempts", rec)
	}
	for i, at := range rec.Attempts {
		if failed := at.Err != ""; failed != (i < 2) {
			t.Errorf("attempt %d: err %q; want the first two failed", i, at.Err)
		}
		if i > 0 && at.Start.Before(rec.Attempts[i-1].End) {
			t.Errorf("attempt %d starts before attempt %d ended", i, i-1)
		}
	}
	if rec.Latency() < rec.Attempts[2].End.Sub(rec.Attempts[0].Start) {
		t.Errorf("latency %v does not cover the retries", rec.Latency())
	}
	s := a.c.Stats()
	if s.CommitFailures != 2 || s.Delivered(report.KindPolicyEndpoint, report.CauseRequeue) < 2 {
		t.Errorf("stats = %+v: want 2 failures, ≥2 requeues", s)
	}
	if s.PodsIsolated != 1 {
		t.Errorf("pods isolated = %d: the new pod must be isolated while its commit fails", s.PodsIsolated)
	}
	if a.sink.commitErrs != 2 {
		t.Errorf("sink saw %d failed commits, want 2", a.sink.commitErrs)
	}
	time.Sleep(300 * time.Millisecond)
	if n := len(a.sink.recordsFor(string(pe.UID))); n != 1 {
		t.Errorf("%d records, want exactly one", n)
	}
}

// testBadInput: an invalid object is not programmed and not retried; a good one next to
// it is programmed; fixing the bad one programs it.
func testBadInput(t *testing.T, cp *testenv.ControlPlane) {
	const node = "192.0.2.5"
	createNamespace(t, cp, "bad")
	mem := bpfmaps.NewMemory()
	a := startAgent(t, cp, agentOptions{nodeIP: node, dp: mem, resolver: newLookupTableResolver("10.1.5.1", 51, "10.1.5.2", 52)})

	bad := ingressPE("bad", "broken", []v1alpha1.PodEndpoint{pod(node, "10.1.5.1")}, "10.2.0.0/33", 80)
	badPort := ingressPE("bad", "port", []v1alpha1.PodEndpoint{pod(node, "10.1.5.1")}, "10.2.0.0/16", 70000)
	badHost := ingressPE("bad", "host", []v1alpha1.PodEndpoint{pod("node-5", "10.1.5.1")}, "10.2.0.0/16", 80)
	good := ingressPE("bad", "good", []v1alpha1.PodEndpoint{pod(node, "10.1.5.2")}, "10.3.0.0/16", 443)
	create(t, cp, bad)
	create(t, cp, badPort)
	create(t, cp, badHost)
	create(t, cp, good)
	testenv.Eventually(t, 20*time.Second, "good object reported", func() bool { return len(a.sink.recordsFor(string(good.UID))) == 1 })
	// The isolation counts follow the invalid-object count within one rejection.
	testenv.Eventually(t, 20*time.Second, "three invalid objects counted, their pods isolated", func() bool {
		s := a.c.Stats()
		return s.InvalidObjects == 3 && s.PodsIsolated == 2 && s.PodsUnisolable == 1
	})
	for field, want := range map[string]uint64{
		"spec.ingress.cidr":                1,
		"spec.ingress.ports.port":          1,
		"spec.podSelectorEndpoints.hostIP": 1,
	} {
		if got := invalidCount(a.c, report.KindPolicyEndpoint, field); got != want {
			t.Errorf("InvalidObject %s = %d, want %d", field, got, want)
		}
	}
	// The bad objects have no valid version: their pod is isolated (ingress, as they
	// name), never programmed with their rules; the unreadable one isolates nothing.
	if got := mem.Pods(); !slices.Equal(got, []int{51, 52}) {
		t.Errorf("dataplane pods = %v: want the good object's pod 52 and the bad objects' pod 51 isolated", got)
	}
	if mem.Verdict(51, bpfmaps.Ingress, addr("10.2.0.1"), tcp, 80) || !mem.Verdict(51, bpfmaps.Egress, addr("10.2.0.1"), tcp, 80) {
		t.Errorf("pod 51: want its ingress isolated with no rule, its egress open")
	}
	if s := a.c.Stats(); s.PodsIsolated != 2 || s.PodsUnisolable != 1 {
		t.Errorf("pods isolated %d, unisolable %d: want 2 (pod 51, once per object) and 1 (the endpoint with hostIP node-5)", s.PodsIsolated, s.PodsUnisolable)
	}
	// No hot retry loop: the syncs settle (counted once the earlier subtests'
	// objects had their first sync).
	waitInitialSync(t, a)
	syncs := a.c.Stats().Syncs
	time.Sleep(time.Second)
	if again := a.c.Stats().Syncs; again != syncs {
		t.Errorf("%d syncs in a second with nothing changing: invalid objects are retried", again-syncs)
	}
	// Fixing the object programs it; both its triggers are reported then (the broken
	// version's change reached the dataplane with the fix, like coalesced writes).
	fix := update(t, cp, bad, func(pe *v1alpha1.PolicyEndpoint) { pe.Spec.Ingress[0].CIDR = "10.2.0.0/16" })
	testenv.Eventually(t, 20*time.Second, "fixed object reported", func() bool {
		recs := a.sink.recordsFor(string(bad.UID))
		return len(recs) > 0 && recs[len(recs)-1].Trigger.Equal(fix)
	})
	if !mem.Verdict(51, bpfmaps.Ingress, addr("10.2.0.1"), tcp, 80) {
		t.Errorf("fixed object not in force")
	}
}

// testTwoNodes: two agents with different node IPs on one apiserver each program and
// report only their own pods.
func testTwoNodes(t *testing.T, cp *testenv.ControlPlane) {
	const nodeA, nodeB = "192.0.2.6", "192.0.2.7"
	createNamespace(t, cp, "two")
	memA, memB := bpfmaps.NewMemory(), bpfmaps.NewMemory()
	a := startAgent(t, cp, agentOptions{nodeIP: nodeA, dp: memA, resolver: newLookupTableResolver("10.1.6.1", 61)})
	b := startAgent(t, cp, agentOptions{nodeIP: nodeB, dp: memB, resolver: newLookupTableResolver("10.1.7.1", 71)})

	both := ingressPE("two", "both", []v1alpha1.PodEndpoint{pod(nodeA, "10.1.6.1"), pod(nodeB, "10.1.7.1")}, "10.2.0.0/16", 80)
	onlyA := ingressPE("two", "only-a", []v1alpha1.PodEndpoint{pod(nodeA, "10.1.6.1")}, "10.3.0.0/16", 80)
	create(t, cp, both)
	create(t, cp, onlyA)
	testenv.Eventually(t, 20*time.Second, "A reports both objects", func() bool {
		return len(a.sink.recordsFor(string(both.UID))) == 1 && len(a.sink.recordsFor(string(onlyA.UID))) == 1
	})
	testenv.Eventually(t, 20*time.Second, "B reports its object", func() bool { return len(b.sink.recordsFor(string(both.UID))) == 1 })
	testenv.Eventually(t, 20*time.Second, "B consumed only-a without work", func() bool { return b.seen.Stats().Suppressed[report.NoLocalPods] >= 1 })
	if n := len(b.sink.recordsFor(string(onlyA.UID))); n != 0 {
		t.Errorf("B reported %d records for an object without pods on B", n)
	}
	if got := memA.Pods(); len(got) != 1 || got[0] != 61 {
		t.Errorf("A's dataplane pods = %v", got)
	}
	if got := memB.Pods(); len(got) != 1 || got[0] != 71 {
		t.Errorf("B's dataplane pods = %v", got)
	}
	if ra, rb := a.sink.recordsFor(string(both.UID))[0], b.sink.recordsFor(string(both.UID))[0]; ra.Pods != 1 || rb.Pods != 1 {
		t.Errorf("each node commits its own pod: A %d pods, B %d pods", ra.Pods, rb.Pods)
	}
}

// testResync: resyncs re-deliver every object each period; they are counted and yield
// no record and no dataplane write.
func testResync(t *testing.T, cp *testenv.ControlPlane) {
	const node = "192.0.2.8"
	createNamespace(t, cp, "resync")
	mem := bpfmaps.NewMemory()
	a := startAgent(t, cp, agentOptions{nodeIP: node, dp: mem, resolver: newLookupTableResolver("10.1.8.1", 81), resync: time.Second})
	pe := ingressPE("resync", "web", []v1alpha1.PodEndpoint{pod(node, "10.1.8.1")}, "10.2.0.0/16", 80)
	create(t, cp, pe)
	testenv.Eventually(t, 20*time.Second, "record for the create", func() bool { return len(a.sink.recordsFor(string(pe.UID))) == 1 })
	// The earlier subtests' objects are synced once at the start too, and the create's
	// record may come before they are: the counts start once that work is done.
	waitInitialSync(t, a)
	records, before := a.sink.recordCount(), a.c.Stats()
	time.Sleep(3500 * time.Millisecond)
	s := a.c.Stats()
	if resyncs := s.Delivered(report.KindPolicyEndpoint, report.CauseResync) - before.Delivered(report.KindPolicyEndpoint, report.CauseResync); resyncs < 2 {
		t.Errorf("%d resync deliveries of PolicyEndpoints in 3.5s with a 1s period, want ≥2", resyncs)
	}
	if n := a.sink.recordCount(); n != records {
		t.Errorf("resyncs produced %d records", n-records)
	}
	if s.DataplaneWrites() != before.DataplaneWrites() || s.Syncs != before.Syncs {
		t.Errorf("resyncs caused work: writes %d→%d, syncs %d→%d", before.DataplaneWrites(), s.DataplaneWrites(), before.Syncs, s.Syncs)
	}
	if a.seen.Stats().Suppressed[report.Redelivered] == 0 {
		t.Errorf("resyncs not counted as redelivered")
	}
	if s.Delivered(report.KindPolicyEndpoint, report.CauseRelist) != before.Delivered(report.KindPolicyEndpoint, report.CauseRelist) {
		t.Errorf("resyncs counted as relists")
	}
}

// TestRelist restarts the apiserver: the informers relist every object unchanged. The
// relist is counted, reports nothing and writes nothing.
func TestRelist(t *testing.T) {
	cp := testenv.Start(t)
	const node = "192.0.2.9"
	createNamespace(t, cp, "relist")
	mem := bpfmaps.NewMemory()
	a := startAgent(t, cp, agentOptions{nodeIP: node, dp: mem, resolver: newLookupTableResolver("10.1.9.1", 91)})
	var pes []*v1alpha1.PolicyEndpoint
	for i, name := range []string{"a", "b", "c"} {
		pe := ingressPE("relist", name, []v1alpha1.PodEndpoint{pod(node, "10.1.9.1")}, "10.2.0.0/16", int32(80+i))
		create(t, cp, pe)
		pes = append(pes, pe)
	}
	remote := ingressPE("relist", "remote", []v1alpha1.PodEndpoint{pod("192.0.2.250", "10.9.9.9")}, "10.2.0.0/16", 80)
	create(t, cp, remote)
	testenv.Eventually(t, 20*time.Second, "three records", func() bool { return a.sink.recordCount() == 3 })
	testenv.Eventually(t, 20*time.Second, "remote consumed", func() bool { return a.seen.Stats().Suppressed[report.NoLocalPods] == 1 })
	before := a.c.Stats()

	cp.RestartAPIServer(t)
	testenv.Eventually(t, 60*time.Second, "relist of the 4 PolicyEndpoints counted", func() bool {
		return a.c.Stats().Delivered(report.KindPolicyEndpoint, report.CauseRelist)-before.Delivered(report.KindPolicyEndpoint, report.CauseRelist) >= 4
	})
	// Let anything the relist might have queued run.
	time.Sleep(time.Second)
	s := a.c.Stats()
	if n := a.sink.recordCount(); n != 3 {
		t.Errorf("relist produced %d records", n-3)
	}
	if s.DataplaneWrites() != before.DataplaneWrites() {
		t.Errorf("relist wrote to the dataplane: %d → %d", before.DataplaneWrites(), s.DataplaneWrites())
	}
	// One per object and list: a restarted apiserver may refuse the reopened watch
	// once more (its watch cache behind the list), and the ListWatch then lists again.
	if got := s.Delivered(report.KindPolicyEndpoint, report.CauseRelist) - before.Delivered(report.KindPolicyEndpoint, report.CauseRelist); got < 4 || got%4 != 0 {
		t.Errorf("%d relist deliveries, want 4 per list (one per object)", got)
	}
	if s.Delivered(report.KindPolicyEndpoint, report.CauseUpdate) != before.Delivered(report.KindPolicyEndpoint, report.CauseUpdate) ||
		s.Delivered(report.KindPolicyEndpoint, report.CauseResync) != before.Delivered(report.KindPolicyEndpoint, report.CauseResync) {
		t.Errorf("relist counted as update or resync: before %v after %v", before.Deliveries, s.Deliveries)
	}
	// The loop still works after the relist.
	trigger := update(t, cp, pes[0], func(pe *v1alpha1.PolicyEndpoint) { pe.Spec.Ingress[0].Ports[0].Port = ptr[int32](90) })
	testenv.Eventually(t, 20*time.Second, "record after the relist", func() bool {
		recs := a.sink.recordsFor(string(pes[0].UID))
		return len(recs) == 2 && recs[1].Trigger.Equal(trigger)
	})
}

// testAgentRestart: a new agent process with the previous one's seen-set state and
// (pinned, here in-memory) dataplane lists every object again: nothing is reported and
// nothing written; a change made while it was down is reported once.
func testAgentRestart(t *testing.T, cp *testenv.ControlPlane) {
	const node = "192.0.2.12"
	createNamespace(t, cp, "restart")
	state := t.TempDir() + "/seen.state"
	mem := bpfmaps.NewMemory()
	resolver := newLookupTableResolver("10.1.12.1", 121, "10.1.12.2", 122)
	first := startAgent(t, cp, agentOptions{nodeIP: node, dp: mem, resolver: resolver, state: state})
	kept := ingressPE("restart", "kept", []v1alpha1.PodEndpoint{pod(node, "10.1.12.1")}, "10.2.0.0/16", 80)
	changed := ingressPE("restart", "changed", []v1alpha1.PodEndpoint{pod(node, "10.1.12.1")}, "10.3.0.0/16", 80)
	// gone selects a pod of its own: when it is deleted while the agent is down, only
	// the initial sync's garbage collection can clear that pod's pinned state.
	gone := ingressPE("restart", "gone", []v1alpha1.PodEndpoint{pod(node, "10.1.12.2")}, "10.4.0.0/16", 80)
	create(t, cp, kept)
	create(t, cp, changed)
	create(t, cp, gone)
	testenv.Eventually(t, 20*time.Second, "all three reported", func() bool { return first.sink.recordCount() == 3 })
	first.stop()

	downtime := update(t, cp, changed, func(pe *v1alpha1.PolicyEndpoint) { pe.Spec.Ingress[0].Ports[0].Port = ptr[int32](81) })
	remove(t, cp, gone)
	second := startAgent(t, cp, agentOptions{nodeIP: node, dp: mem, resolver: resolver, state: state})
	// The restored entry of the object deleted during the downtime is pruned once the
	// caches sync: the seen-set tracks no more objects than the caches hold.
	live := 0
	for _, inf := range second.c.informers {
		live += len(inf.GetStore().ListKeys())
	}
	testenv.Eventually(t, 10*time.Second, "deleted objects pruned from the seen-set", func() bool { return second.seen.Stats().Objects <= live })
	testenv.Eventually(t, 20*time.Second, "the change made during the downtime reported", func() bool {
		return len(second.sink.recordsFor(string(changed.UID))) == 1
	})
	if r := second.sink.recordsFor(string(changed.UID))[0]; !r.Trigger.Equal(downtime) {
		t.Errorf("reported trigger %v, want the downtime change %v", r.Trigger, downtime)
	}
	time.Sleep(300 * time.Millisecond)
	if n := len(second.sink.recordsFor(string(kept.UID))); n != 0 {
		t.Errorf("the unchanged object was reported %d times after the restart", n)
	}
	if s := second.c.Stats(); s.Delivered(report.KindPolicyEndpoint, report.CauseAdd) < 2 {
		t.Errorf("initial list not counted as adds: %+v", s.Deliveries)
	}
	if !mem.Verdict(121, bpfmaps.Ingress, addr("10.3.0.1"), tcp, 81) || mem.Verdict(121, bpfmaps.Ingress, addr("10.3.0.1"), tcp, 80) {
		t.Errorf("the downtime change is not in force")
	}
	testenv.Eventually(t, 20*time.Second, "the state of the pod only the deleted object selected removed", func() bool {
		pods := mem.Pods()
		return len(pods) == 1 && pods[0] == 121
	})
}
