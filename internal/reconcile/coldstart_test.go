package reconcile

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/testenv"
)

// firstCommit is wholeChunks that also remembers when the interface was first
// committed, and checks every commit denies one peer (an admin Deny).
type firstCommit struct {
	wholeChunks
	denied netip.AddrPort
	at     time.Time
	open   int // commits that allowed the denied peer
}

func (d *firstCommit) Commit(ifindex int, p bpfmaps.PodPolicy) (bpfmaps.CommitResult, error) {
	res, err := d.wholeChunks.Commit(ifindex, p)
	if err != nil || ifindex != d.ifindex {
		return res, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.at.IsZero() {
		d.at = time.Now()
	}
	if d.Verdict(ifindex, bpfmaps.Ingress, d.denied.Addr(), bpfmaps.ProtocolTCP, d.denied.Port()) {
		d.open++
	}
	return res, nil
}

// TestColdStartBeforeSync: at agent start, with 3,000 objects of other nodes in 30
// namespaces listed after it, a pod of the first namespace is programmed before the
// caches synced — and every commit of it holds both chunks of its policy (the chunk
// with no pod here listed first, so fetched) and the ClusterPolicyEndpoint's admin
// Deny: an early commit is never made from part of the pod's objects. Real apiserver.
func TestColdStartBeforeSync(t *testing.T) {
	cp := sharedCP(t)
	const node = "192.0.2.61"
	const namespaces, perNamespace = 30, 100
	ctx := context.Background()
	createNamespace(t, cp, "cold-a")
	remote := []v1alpha1.PodEndpoint{pod("192.0.2.99", "10.61.9.1")}
	create(t, cp, chunkOf("cold-a", "np-c-a", "np-c", remote, "10.80.0.0/16", 9000))
	create(t, cp, chunkOf("cold-a", "np-c-b", "np-c", []v1alpha1.PodEndpoint{pod(node, "10.61.0.1")}, "10.90.0.0/16", 9100))
	deny := &v1alpha1.ClusterPolicyEndpoint{
		ObjectMeta: metav1.ObjectMeta{Name: "cold-deny"},
		Spec: v1alpha1.ClusterPolicyEndpointSpec{
			PolicyRef: v1alpha1.ClusterPolicyReference{Name: "cold-deny"}, Tier: v1alpha1.TierAdmin, Priority: 5,
			Subject:              v1alpha1.ClusterPolicySubject{Namespaces: &metav1.LabelSelector{}},
			PodSelectorEndpoints: []v1alpha1.PodEndpoint{{HostIP: node, PodIP: "10.61.0.1", Name: "p", Namespace: "cold-a"}},
			Ingress: []v1alpha1.ClusterEndpointInfo{{Action: v1alpha1.ClusterRuleActionDeny, CIDR: "10.90.9.0/24",
				Ports: []v1alpha1.Port{{Port: ptr[int32](9100)}}}},
		},
	}
	create(t, cp, deny)
	nsOf := func(n int) string { return fmt.Sprintf("cold-z%02d", n) }
	for n := range namespaces {
		ns := nsOf(n)
		createNamespace(t, cp, ns)
		// One request per namespace: the next test's sharedCP deletes one by one.
		t.Cleanup(func() { _ = cp.Client.DeleteAllOf(ctx, &v1alpha1.PolicyEndpoint{}, client.InNamespace(ns)) })
	}
	testenv.CreateEach(t, cp.Client, namespaces*perNamespace, func(i int) client.Object {
		return ingressPE(nsOf(i/perNamespace), fmt.Sprintf("np-%03d", i%perNamespace), remote, "10.70.0.0/16", 80)
	})
	dp := &firstCommit{wholeChunks: wholeChunks{Memory: bpfmaps.NewMemory(), ifindex: 61,
		peers: []netip.AddrPort{netip.MustParseAddrPort("10.80.0.9:9000"), netip.MustParseAddrPort("10.90.0.9:9100")}},
		denied: netip.MustParseAddrPort("10.90.9.9:9100")}
	a := startAgent(t, cp, agentOptions{nodeIP: node, dp: dp, resolver: newLookupTableResolver("10.61.0.1", 61)})
	testenv.Eventually(t, time.Minute, "ready", func() bool { return a.c.LocalPending() == 0 })
	syncedAt := time.Unix(0, a.c.cold.syncedAt.Load())
	dp.mu.Lock()
	first, open := dp.at, dp.open
	dp.mu.Unlock()
	t.Logf("pod first committed %v before the caches synced; %d early batches", syncedAt.Sub(first), a.c.cold.batches.Load())
	if first.IsZero() || !first.Before(syncedAt) {
		t.Errorf("pod first committed at %v, caches synced at %v: want it programmed before they synced", first, syncedAt)
	}
	if commits, partial := dp.result(); commits == 0 || len(partial) > 0 {
		t.Errorf("%d commits of the pod; peers missing from some: %v (a commit from part of its objects)", commits, partial)
	}
	if open > 0 {
		t.Errorf("%d commits of the pod allowed the peer the admin Deny denies", open)
	}
	if got := a.sink.recordCount(); got != 0 {
		t.Errorf("%d records: objects created before the agent started are before_start, none is reported", got)
	}
	if a.c.Stats().Delivered(report.KindPolicyEndpoint, report.CauseAdd) != namespaces*perNamespace+2 {
		t.Errorf("delivered %d adds, want every object once", a.c.Stats().Delivered(report.KindPolicyEndpoint, report.CauseAdd))
	}
}

// TestColdStartBatches: a namespace becomes a batch once the list is past it, with
// its objects with a pod here and their policies' other chunks (not the rest);
// batches wait for the gate; a namespace listed again (not in key order) ends early
// starts, and the last namespace is not a batch before the list ends.
func TestColdStartBatches(t *testing.T) {
	node := netip.MustParseAddr("192.0.2.62")
	s := newColdStart(node)
	pe := func(ns, name, policy, host string) *v1alpha1.PolicyEndpoint {
		p := chunkOf(ns, name, policy, []v1alpha1.PodEndpoint{pod(host, "10.62.0.1")}, "10.80.0.0/16", 80)
		p.UID = types.UID("uid-" + ns + "-" + name)
		return p
	}
	s.listed(pe("a", "np-x-1", "np-x", "192.0.2.99"))
	s.listed(pe("a", "np-x-2", "np-x", node.String()))
	s.listed(pe("a", "np-y", "np-y", "192.0.2.99"))
	s.listed(pe("b", "np-z", "np-z", node.String()))
	if s.queue.Len() != 0 || len(s.held) != 1 {
		t.Fatalf("before the gate: %d queued, %d held; want namespace a held", s.queue.Len(), len(s.held))
	}
	s.openGate()
	b, _ := s.queue.Get()
	var names []string
	for _, it := range b.items {
		names = append(names, it.name)
		if it.local != (it.name == "np-x-2") || (it.full != nil) != it.local {
			t.Errorf("%s: local %v, copied %v", it.name, it.local, it.full != nil)
		}
	}
	if b.namespace != "a" || fmt.Sprint(names) != "[np-x-1 np-x-2]" {
		t.Errorf("batch %s %v, want namespace a with both chunks of np-x and not np-y", b.namespace, names)
	}
	s.queue.Done(b)
	s.listed(pe("a", "np-late", "np-late", node.String())) // a again: out of order
	if s.isActive() || s.queue.Len() != 0 {
		t.Errorf("a namespace listed again: active %v, %d queued; want early starts ended, namespace b never released", s.isActive(), s.queue.Len())
	}
}

// TestColdStartListEnd: the end of the list completes its last namespace, which
// becomes a batch then, not when the caches sync; an object listed after the end
// ends early starts.
func TestColdStartListEnd(t *testing.T) {
	node := netip.MustParseAddr("192.0.2.63")
	s := newColdStart(node)
	s.openGate()
	pe := func(ns, name, host string) *v1alpha1.PolicyEndpoint {
		p := chunkOf(ns, name, name, []v1alpha1.PodEndpoint{pod(host, "10.63.0.1")}, "10.80.0.0/16", 80)
		p.UID = types.UID("uid-" + ns + "-" + name)
		return p
	}
	s.listed(pe("a", "np-a", node.String()))
	s.listed(pe("z", "np-z", node.String()))
	if s.queue.Len() != 1 {
		t.Fatalf("%d batches queued before the end, want namespace a's", s.queue.Len())
	}
	b, _ := s.queue.Get()
	s.queue.Done(b)
	s.ended()
	if s.queue.Len() != 1 {
		t.Fatalf("%d batches queued after the list ended, want namespace z's", s.queue.Len())
	}
	if b, _ := s.queue.Get(); b.namespace != "z" || len(b.items) != 1 || b.items[0].name != "np-z" {
		t.Errorf("batch at the end: %s %+v, want namespace z with np-z", b.namespace, b.items)
	}
	s.listed(pe("z", "np-z2", node.String()))
	if s.isActive() {
		t.Error("an object listed after the end: early starts still active")
	}
}
