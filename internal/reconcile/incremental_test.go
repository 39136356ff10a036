package reconcile

import (
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/testenv"
)

// resultsDataplane records the result of every Commit.
type resultsDataplane struct {
	bpfmaps.Dataplane
	mu      sync.Mutex
	results map[int][]bpfmaps.CommitResult
}

func (d *resultsDataplane) Commit(ifindex int, p bpfmaps.PodPolicy) (bpfmaps.CommitResult, error) {
	res, err := d.Dataplane.Commit(ifindex, p)
	if err == nil {
		d.mu.Lock()
		d.results[ifindex] = append(d.results[ifindex], res)
		d.mu.Unlock()
	}
	return res, err
}

// Verdict is the in-memory dataplane's.
func (d *resultsDataplane) Verdict(ifindex int, dir bpfmaps.Direction, peer netip.Addr, proto bpfmaps.Protocol, port uint16) bool {
	return d.Dataplane.(*bpfmaps.Memory).Verdict(ifindex, dir, peer, proto, port)
}

func (d *resultsDataplane) last(ifindex int) (bpfmaps.CommitResult, int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	rs := d.results[ifindex]
	if len(rs) == 0 {
		return bpfmaps.CommitResult{}, 0
	}
	return rs[len(rs)-1], len(rs)
}

// TestIncrementalCommitThroughController: the controller's usual change to a large
// PolicyEndpoint — one pod peer more or fewer — reaches the dataplane as an
// incremental commit (the object's rules are a rule set built from its previous
// version), while a change of a broad rule is compiled in full.
func TestIncrementalCommitThroughController(t *testing.T) {
	cp := sharedCP(t)
	const node, local = "192.0.2.13", "10.1.13.1"
	createNamespace(t, cp, "incremental")
	dp := &resultsDataplane{Dataplane: bpfmaps.NewMemory(), results: map[int][]bpfmaps.CommitResult{}}
	startAgent(t, cp, agentOptions{nodeIP: node, dp: dp, resolver: newLookupTableResolver(local, 131)})
	pe := ingressPE("incremental", "peers", []v1alpha1.PodEndpoint{pod(node, local)}, "10.5.0.0/16", 443)
	for i := range 500 {
		pe.Spec.Ingress = append(pe.Spec.Ingress, v1alpha1.EndpointInfo{CIDR: v1alpha1.NetworkAddress(fmt.Sprintf("10.6.%d.%d", i/250, i%250+1)), Ports: []v1alpha1.Port{{Port: ptr[int32](80)}}})
	}
	create(t, cp, pe)
	testenv.Eventually(t, 20*time.Second, "first commit", func() bool { _, n := dp.last(131); return n == 1 })

	commits := 1
	step := func(what string, change func(*v1alpha1.PolicyEndpoint), peer string, port uint16, incremental bool) {
		t.Helper()
		update(t, cp, pe, change)
		commits++
		testenv.Eventually(t, 20*time.Second, what+" committed", func() bool { _, n := dp.last(131); return n == commits })
		res, _ := dp.last(131)
		if res.Incremental != incremental {
			t.Fatalf("%s: incremental %v, want %v (%+v)", what, res.Incremental, incremental, res)
		}
		if !dp.Verdict(131, bpfmaps.Ingress, addr(peer), tcp, port) {
			t.Fatalf("%s: %s not allowed on port %d", what, peer, port)
		}
	}
	newPeer := v1alpha1.EndpointInfo{CIDR: "10.7.0.1", Ports: []v1alpha1.Port{{Port: ptr[int32](80)}}}
	step("a peer added", func(pe *v1alpha1.PolicyEndpoint) { pe.Spec.Ingress = append(pe.Spec.Ingress, newPeer) }, "10.7.0.1", 80, true)
	step("a peer removed", func(pe *v1alpha1.PolicyEndpoint) { pe.Spec.Ingress = pe.Spec.Ingress[:len(pe.Spec.Ingress)-2] }, "10.6.0.1", 80, true)
	if dp.Verdict(131, bpfmaps.Ingress, addr("10.7.0.1"), tcp, 80) {
		t.Fatal("the removed peer is still allowed")
	}
	step("a broad rule's port changed", func(pe *v1alpha1.PolicyEndpoint) { pe.Spec.Ingress[0].Ports[0].Port = ptr[int32](8443) }, "10.5.1.1", 8443, false)
}
