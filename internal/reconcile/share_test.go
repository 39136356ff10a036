package reconcile

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/testenv"
)

// withCIDRs adds n ingress peers 10.<second>.i.0/24 (all ports) to pe.
func withCIDRs(pe *v1alpha1.PolicyEndpoint, second, n int) {
	for i := range n {
		pe.Spec.Ingress = append(pe.Spec.Ingress, v1alpha1.EndpointInfo{CIDR: v1alpha1.NetworkAddress(fmt.Sprintf("10.%d.%d.0/24", second, i))})
	}
}

// TestNamespaceShareKeepsRoomForOthers: one namespace's object that would take its
// namespace's pods over their share of a trie is rejected as bad input — a field
// error naming the object, the namespace, the trie and the counts, counted, not
// retried — and its previous version stays in force; another namespace's new pod is
// then still programmed, where without the share the first namespace's replicas
// would have filled the trie and the new pod been isolated (issue 24, finding 9).
// Replicas of one policy are charged once: they share their entries.
// Shrinking the object again is accepted. Real apiserver; the in-memory dataplane
// with a 100-entry IPv4 and a 40-entry IPv6 trie per direction, a namespace's
// share 50%; the IPv6 egress trie is bounded as the IPv4 ingress one.
func TestNamespaceShareKeepsRoomForOthers(t *testing.T) {
	cp := sharedCP(t)
	const node = "192.0.2.28"
	createNamespace(t, cp, "crowd")
	createNamespace(t, cp, "quiet")
	mem := bpfmaps.NewMemoryWithLimits(bpfmaps.Limits{EntriesV4: 100, EntriesV6: 40})
	logs := &logBuffer{}
	a := startAgent(t, cp, agentOptions{nodeIP: node, dp: mem, share: 0.5,
		resolver: newLookupTableResolver("10.1.28.1", 281, "10.1.28.2", 282, "10.1.28.3", 283, "10.1.28.9", 289),
		logger:   slog.New(slog.NewTextHandler(logs, nil))})

	// Three replicas of one policy: 5 peers each (with 10.2.0.0/16), 18 entries.
	replicas := []v1alpha1.PodEndpoint{pod(node, "10.1.28.1"), pod(node, "10.1.28.2"), pod(node, "10.1.28.3")}
	big := ingressPE("crowd", "big", replicas, "10.2.0.0/16", 80)
	withCIDRs(big, 50, 5)
	create(t, cp, big)
	testenv.Eventually(t, 20*time.Second, "crowd/big reported", func() bool { return len(a.sink.recordsFor(string(big.UID))) == 1 })

	// 21 peers on three pods: 21 entries, charged once (the replicas share one copy
	// of their entries); before entry groups, 63: over the namespace's 50.
	update(t, cp, big, func(pe *v1alpha1.PolicyEndpoint) { withCIDRs(pe, 51, 15) })
	testenv.Eventually(t, 20*time.Second, "crowd/big's growth reported", func() bool {
		return invalidCount(a.c, report.KindPolicyEndpoint, "spec.namespaceShare") == 1 || len(a.sink.recordsFor(string(big.UID))) == 2
	})
	if n := invalidCount(a.c, report.KindPolicyEndpoint, "spec.namespaceShare"); n != 0 {
		t.Fatalf("crowd/big's 21 entries on three replicas rejected: replicas charged once each (invalid versions at spec.namespaceShare = %d)", n)
	}
	if got, err := mem.Usage(); err != nil || got.Entries[bpfmaps.Ingress][0].Used != 21 {
		t.Fatalf("three replicas of 21 entries: the IPv4 ingress trie holds %+v (%v), want one copy (21)", got.Entries[bpfmaps.Ingress][0], err)
	}

	// 51 peers: over the namespace's 50 (the trie of 100 would take them).
	update(t, cp, big, func(pe *v1alpha1.PolicyEndpoint) { withCIDRs(pe, 52, 30) })
	testenv.Eventually(t, 20*time.Second, "crowd/big's second growth synced", func() bool {
		return invalidCount(a.c, report.KindPolicyEndpoint, "spec.namespaceShare") == 1 || len(a.sink.recordsFor(string(big.UID))) == 3
	})
	if n := invalidCount(a.c, report.KindPolicyEndpoint, "spec.namespaceShare"); n != 1 {
		t.Errorf("invalid crowd/big versions at spec.namespaceShare = %d, want 1 (records: %d)", n, len(a.sink.recordsFor(string(big.UID))))
	}
	// The count comes just before the log line.
	const msg = "namespace crowd would hold 51 of the IPv4 ingress trie's 100 entries, its share is 50"
	if !within(5*time.Second, func() bool { return len(logs.lines("policy object rejected", "name=big", msg)) == 1 }) {
		t.Errorf("no rejection logged naming object, namespace, trie and counts (%q); logs:\n%s", msg, logs.String())
	}
	for _, ifindex := range []int{281, 282, 283} {
		if !mem.Verdict(ifindex, bpfmaps.Ingress, addr("10.51.4.1"), tcp, 443) || mem.Verdict(ifindex, bpfmaps.Ingress, addr("10.52.0.1"), tcp, 443) {
			t.Errorf("pod %d: crowd/big's previous version must stay in force, the rejected one not", ifindex)
		}
	}

	// Another namespace's new pod, 45 peers: fits beside crowd's 21, not beside the
	// 63 of three copies.
	quiet := ingressPE("quiet", "web", []v1alpha1.PodEndpoint{pod(node, "10.1.28.9")}, "10.3.0.0/16", 80)
	withCIDRs(quiet, 60, 44)
	create(t, cp, quiet)
	if !within(20*time.Second, func() bool { return len(a.sink.recordsFor(string(quiet.UID))) == 1 }) {
		s := a.c.Stats()
		t.Fatalf("quiet/web's pod not programmed: commit failures %d, pods isolated %d", s.CommitFailures, s.PodsIsolated)
	}
	if !mem.Verdict(289, bpfmaps.Ingress, addr("10.60.43.1"), tcp, 443) || mem.Verdict(289, bpfmaps.Ingress, addr("10.61.0.1"), tcp, 443) {
		t.Errorf("pod 289: quiet/web not in force")
	}
	if s := a.c.Stats(); s.CommitFailures != 0 || s.PodsIsolated != 0 {
		t.Errorf("commit failures %d, pods isolated %d: want 0 and 0", s.CommitFailures, s.PodsIsolated)
	}

	// crowd/big shrinks: accepted.
	update(t, cp, big, func(pe *v1alpha1.PolicyEndpoint) { pe.Spec.Ingress = pe.Spec.Ingress[:4] })
	// Its pending growth's trigger is reported with it.
	testenv.Eventually(t, 20*time.Second, "crowd/big's shrink reported", func() bool { return len(a.sink.recordsFor(string(big.UID))) > 2 })
	if !mem.Verdict(283, bpfmaps.Ingress, addr("10.50.2.1"), tcp, 443) || mem.Verdict(283, bpfmaps.Ingress, addr("10.50.3.1"), tcp, 443) {
		t.Errorf("pod 283: crowd/big's shrunk version not in force")
	}
	// IPv6 egress: quiet's pod may send to 20 peers, not 21.
	out := ingressPE("quiet", "out", []v1alpha1.PodEndpoint{pod(node, "10.1.28.9")}, "fd00:70::/64", 443)
	for i := range 19 {
		out.Spec.Ingress = append(out.Spec.Ingress, v1alpha1.EndpointInfo{CIDR: v1alpha1.NetworkAddress(fmt.Sprintf("fd00:71:%x::/48", i))})
	}
	out.Spec.PodIsolation = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	out.Spec.Egress, out.Spec.Ingress = out.Spec.Ingress, nil
	create(t, cp, out)
	testenv.Eventually(t, 20*time.Second, "quiet/out reported", func() bool { return len(a.sink.recordsFor(string(out.UID))) == 1 })
	update(t, cp, out, func(pe *v1alpha1.PolicyEndpoint) {
		pe.Spec.Egress = append(pe.Spec.Egress, v1alpha1.EndpointInfo{CIDR: "fd00:72::/48"})
	})
	const msg6 = "namespace quiet would hold 21 of the IPv6 egress trie's 40 entries, its share is 20"
	if !within(20*time.Second, func() bool { return len(logs.lines("policy object rejected", "name=out", msg6)) == 1 }) {
		t.Errorf("no rejection logged naming object, namespace, trie and counts (%q)", msg6)
	}
	if !mem.Verdict(289, bpfmaps.Egress, addr("fd00:71:12::1"), tcp, 443) || mem.Verdict(289, bpfmaps.Egress, addr("fd00:72::1"), tcp, 443) {
		t.Errorf("pod 289: quiet/out's previous version must stay in force, the rejected one not")
	}

	if n := invalidCount(a.c, report.KindPolicyEndpoint, "spec.namespaceShare"); n != 2 {
		t.Errorf("invalid versions at spec.namespaceShare = %d, want 2 (crowd/big's and quiet/out's growth)", n)
	}
	syncs := a.c.Stats().Syncs
	time.Sleep(time.Second)
	if again := a.c.Stats().Syncs; again != syncs {
		t.Errorf("%d syncs in a second with nothing changing: a rejected version is retried", again-syncs)
	}
}

// within polls cond until it holds or d has passed; it reports whether it held.
func within(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); ; time.Sleep(20 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}
