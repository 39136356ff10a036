package reconcile

import (
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/testenv"
	"github.com/npagent/npagent/internal/testenv/netlab"
	"github.com/npagent/npagent/internal/testenv/skip"
	"github.com/npagent/npagent/internal/translate"
)

// initialSyncDone reports whether the controller collected the dataplane's leftovers
// (every key of the initial list was synced once).
func initialSyncDone(c *Controller) bool {
	c.initial.mu.Lock()
	defer c.initial.mu.Unlock()
	return c.initial.begun && c.initial.pending == nil
}

// TestEBPFRestartKeepsEnforcementOfInvalidObject: a pod whose only policy object's
// current version is invalid keeps its pinned enforcement across an agent restart
// (issue 10: the post-sync leftover cleanup removed it and the pod was open). Real
// apiserver, real eBPF, real packets; the dataplane is closed and re-opened from its
// pins as a new process would.
func TestEBPFRestartKeepsEnforcementOfInvalidObject(t *testing.T) {
	l := newPodLab(t)
	l.serve(t, 8080)
	l.serve(t, 8081)
	for _, port := range []int{8080, 8081} {
		testenv.Eventually(t, 10*time.Second, "port reachable before any policy", func() bool { return l.reach(port) == nil })
	}
	dp := openKernelDataplane(t, "restart-invalid")
	cp := sharedCP(t)
	const node = "192.0.2.21"
	createNamespace(t, cp, "keep")
	state := t.TempDir() + "/seen.state"
	first := startAgent(t, cp, agentOptions{nodeIP: node, dp: dp, state: state})
	pe := ingressPE("keep", "web", []v1alpha1.PodEndpoint{pod(node, l.podIP)}, l.hostIP+"/32", 8080)
	create(t, cp, pe)
	testenv.Eventually(t, 20*time.Second, "record for the create", func() bool { return len(first.sink.recordsFor(string(pe.UID))) == 1 })
	if err := l.reach(8081); err == nil {
		t.Fatalf("port 8081 reachable: the policy is not enforced")
	}

	// The object's current version becomes invalid: the valid one stays in force.
	update(t, cp, pe, func(pe *v1alpha1.PolicyEndpoint) { pe.Spec.Ingress[0].CIDR = "10.2.0.0/33" })
	testenv.Eventually(t, 20*time.Second, "invalid version counted", func() bool {
		return invalidCount(first.c, report.KindPolicyEndpoint, "spec.ingress.cidr") == 1
	})
	first.stop()
	if err := dp.Close(); err != nil {
		t.Fatal(err)
	}

	dp = openKernelDataplane(t, "restart-invalid")
	if got := dp.Pods(); !slices.Contains(got, l.hostIndex) {
		t.Fatalf("adopted pods = %v, want the veth %d", got, l.hostIndex)
	}
	second := startAgent(t, cp, agentOptions{nodeIP: node, dp: dp, state: state})
	testenv.Eventually(t, 20*time.Second, "initial sync done", func() bool { return initialSyncDone(second.c) })
	if n := invalidCount(second.c, report.KindPolicyEndpoint, "spec.ingress.cidr"); n != 1 {
		t.Errorf("the new process counted %d invalid versions, want 1", n)
	}
	if got := dp.Pods(); !slices.Contains(got, l.hostIndex) {
		t.Errorf("dataplane pods after the restart = %v: the pod's pinned enforcement was removed", got)
	}
	if s := second.c.Stats(); s.Removes != 0 {
		t.Errorf("%d pods removed after the restart, want 0", s.Removes)
	}
	if err := l.reach(8080); err != nil {
		t.Errorf("allowed port 8080 after the restart: %v", err)
	}
	if err := l.reach(8081); err == nil {
		t.Errorf("port 8081 reachable after the restart: the pod was left open")
	}

	// Deleting the object is what ends the pod's enforcement, in this process too.
	remove(t, cp, pe)
	testenv.Eventually(t, 20*time.Second, "pod state removed after the delete", func() bool { return !slices.Contains(dp.Pods(), l.hostIndex) })
	if err := l.reach(8081); err != nil {
		t.Errorf("after the delete the pod must be open again: %v", err)
	}
}

// logBuffer collects log lines, for tests that check what was logged.
type logBuffer struct{ testenv.LogBuffer }

// lines returns the lines holding every one of words.
func (b *logBuffer) lines(words ...string) []string {
	var out []string
	for line := range strings.Lines(b.String()) {
		if !slices.ContainsFunc(words, func(w string) bool { return !strings.Contains(line, w) }) {
			out = append(out, line)
		}
	}
	return out
}

// TestEBPFUncommittablePodIsolated: a pod whose policy cannot be committed (here: it
// needs more trie entries than the maps hold) and which holds no state is isolated,
// never left open: a peer the policy would allow is dropped, the node still reaches
// the pod, and the isolation is counted and logged naming the pod and the object.
// Once a version fits, the real policy replaces the isolation. Real apiserver, eBPF
// with small maps, TCP.
func TestEBPFUncommittablePodIsolated(t *testing.T) {
	l := newPodLab(t)
	subnet := strings.TrimSuffix(l.hostIP, ".1")
	peer := subnet + ".3" // not a node address
	netlab.Run(t, "ip", "addr", "add", peer+"/32", "dev", l.hostIf)
	l.serve(t, 8080)
	podAddr := l.podIP + ":8080"
	testenv.Eventually(t, 10*time.Second, "peer reaches the pod before any policy", func() bool { return exchangeFrom(peer, podAddr) == nil })
	testenv.Eventually(t, 10*time.Second, "node reaches the pod before any policy", func() bool { return exchangeFrom(l.hostIP, podAddr) == nil })

	dp := openKernelDataplaneWith(t, "isolate", bpfmaps.EBPFOptions{Limits: bpfmaps.Limits{EntriesV4: 8}})
	if err := dp.SetNodeAddrs([]netip.Prefix{netip.MustParsePrefix(l.hostIP + "/32")}); err != nil {
		t.Fatal(err)
	}
	cp := sharedCP(t)
	const node = "192.0.2.22"
	createNamespace(t, cp, "isolate")
	logs := &logBuffer{}
	a := startAgent(t, cp, agentOptions{nodeIP: node, dp: dp, logger: slog.New(slog.NewTextHandler(logs, nil))})
	// 16 peers, the allowed one among them: 16 entries do not fit a trie of 8.
	pe := ingressPE("isolate", "wide", []v1alpha1.PodEndpoint{pod(node, l.podIP)}, peer+"/32", 8080)
	for i := range 15 {
		pe.Spec.Ingress = append(pe.Spec.Ingress, v1alpha1.EndpointInfo{CIDR: v1alpha1.NetworkAddress(fmt.Sprintf("10.77.%d.0/24", i))})
	}
	create(t, cp, pe)
	testenv.Eventually(t, 20*time.Second, "commit failed", func() bool { return a.c.Stats().CommitFailures >= 1 })
	if err := exchangeFrom(peer, podAddr); err == nil {
		t.Errorf("peer reached the pod whose policy could not be committed: left open")
	}
	if err := exchangeFrom(l.hostIP, podAddr); err != nil {
		t.Errorf("node to the isolated pod: %v, want the node exemption to hold", err)
	}
	if n := a.c.Stats().PodsIsolated; n != 1 {
		t.Errorf("pods isolated = %d, want 1", n)
	}
	if got := dp.Pods(); !slices.Contains(got, l.hostIndex) {
		t.Errorf("dataplane pods = %v, want the isolated veth %d", got, l.hostIndex)
	}
	if got := logs.lines("pod isolated", l.podIP, "isolate/wide"); len(got) == 0 {
		t.Errorf("no log line naming the isolated pod %s and object isolate/wide; logs:\n%s", l.podIP, logs.String())
	}
	if n := len(a.sink.recordsFor(string(pe.UID))); n != 0 {
		t.Errorf("%d records for a policy never committed", n)
	}
	// Retries fail alike and do not isolate again.
	failures := a.c.Stats().CommitFailures
	testenv.Eventually(t, 10*time.Second, "commit retried", func() bool { return a.c.Stats().CommitFailures > failures })
	if n := a.c.Stats().PodsIsolated; n != 1 {
		t.Errorf("pods isolated = %d after retries, want 1", n)
	}

	// A version that fits replaces the isolation.
	update(t, cp, pe, func(pe *v1alpha1.PolicyEndpoint) { pe.Spec.Ingress = pe.Spec.Ingress[:1] })
	testenv.Eventually(t, 20*time.Second, "record once the policy fits", func() bool { return len(a.sink.recordsFor(string(pe.UID))) >= 1 })
	if err := exchangeFrom(peer, podAddr); err != nil {
		t.Errorf("allowed peer once the policy is committed: %v", err)
	}
}

// openKernelDataplaneWith is openKernelDataplane with options (the pin path is set).
func openKernelDataplaneWith(t *testing.T, name string, opts bpfmaps.EBPFOptions) *bpfmaps.EBPF {
	t.Helper()
	netlab.HostBPFFS(t)
	opts.PinPath = filepath.Join("/sys/fs/bpf", fmt.Sprintf("npagent-reconcile-%s-%d", name, os.Getpid()))
	t.Cleanup(func() { _ = os.RemoveAll(opts.PinPath) })
	dp, err := bpfmaps.OpenEBPF(opts)
	if err != nil {
		if strings.Contains(err.Error(), "not supported") {
			skip.Unmet(t, "kernel lacks a needed eBPF feature: %v", err)
		}
		t.Fatalf("OpenEBPF: %v", err)
	}
	t.Cleanup(func() { _ = dp.Close() })
	return dp
}

// TestMergeOverflowBlamesOnlyItsObject: an object whose rules, merged with another
// object's on the same pod, need more port rules for one prefix than a map value
// holds is rejected alone — a field error naming it, counted, its previous version in
// force — and the other objects on that pod keep being programmed (issue 10: it
// stayed indexed and every later commit of the pod failed and was blamed). Real
// apiserver; the in-memory dataplane, which validates as the kernel one does.
func TestMergeOverflowBlamesOnlyItsObject(t *testing.T) {
	cp := sharedCP(t)
	const node = "192.0.2.23"
	createNamespace(t, cp, "overflow")
	mem := bpfmaps.NewMemory()
	logs := &logBuffer{}
	a := startAgent(t, cp, agentOptions{nodeIP: node, dp: mem, resolver: newLookupTableResolver("10.1.23.1", 231),
		logger: slog.New(slog.NewTextHandler(logs, nil))})
	pods := []v1alpha1.PodEndpoint{pod(node, "10.1.23.1")}
	// ports spaced apart, so the union cannot merge them into ranges.
	ports := func(first, n int) []v1alpha1.Port {
		var out []v1alpha1.Port
		for i := range n {
			out = append(out, v1alpha1.Port{Port: ptr(int32(first + 2*i))})
		}
		return out
	}
	wide := ingressPE("overflow", "wide", pods, "10.2.0.0/16", 1)
	wide.Spec.Ingress[0].Ports = ports(1000, 20)
	grow := ingressPE("overflow", "grow", pods, "10.2.0.0/16", 1)
	grow.Spec.Ingress[0].Ports = ports(2000, 2) // 22 together: fits
	create(t, cp, wide)
	create(t, cp, grow)
	testenv.Eventually(t, 20*time.Second, "both reported", func() bool {
		return len(a.sink.recordsFor(string(wide.UID))) == 1 && len(a.sink.recordsFor(string(grow.UID))) == 1
	})

	// 25 port rules for 10.2.0.0/16 together with wide's: more than a value holds.
	update(t, cp, grow, func(pe *v1alpha1.PolicyEndpoint) { pe.Spec.Ingress[0].Ports = ports(2000, 5) })
	testenv.Eventually(t, 20*time.Second, "the overflowing version counted invalid", func() bool {
		return invalidCount(a.c, report.KindPolicyEndpoint, "spec") == 1
	})
	// The count comes just before the log line.
	testenv.Eventually(t, 5*time.Second, "a rejection logged naming grow", func() bool { return len(logs.lines("policy object rejected", "name=grow")) == 1 })
	v := addr("10.2.0.1")
	if !mem.Verdict(231, bpfmaps.Ingress, v, tcp, 2002) || mem.Verdict(231, bpfmaps.Ingress, v, tcp, 2004) {
		t.Errorf("grow's previous version (ports 2000, 2002) must stay in force, its rejected one (up to 2008) not")
	}

	// Another object on the same pod is programmed and reported, not blamed.
	other := ingressPE("overflow", "other", pods, "10.3.0.0/16", 443)
	create(t, cp, other)
	testenv.Eventually(t, 20*time.Second, "the other object reported", func() bool { return len(a.sink.recordsFor(string(other.UID))) == 1 })
	if !mem.Verdict(231, bpfmaps.Ingress, addr("10.3.0.1"), tcp, 443) || !mem.Verdict(231, bpfmaps.Ingress, v, tcp, 1038) {
		t.Errorf("pod 231: other's and wide's rules must be in force")
	}
	// wide's own update is programmed too.
	update(t, cp, wide, func(pe *v1alpha1.PolicyEndpoint) { pe.Spec.Ingress[0].Ports = ports(1000, 19) })
	testenv.Eventually(t, 20*time.Second, "wide's update reported", func() bool { return len(a.sink.recordsFor(string(wide.UID))) == 2 })
	if n := a.c.Stats().InvalidObjects; n != 1 {
		t.Errorf("invalid objects = %d, want 1 (grow's one version)", n)
	}
	if n := a.c.Stats().PodsIsolated; n != 0 {
		t.Errorf("pods isolated = %d: a refused merge drops the object, it does not isolate the pod", n)
	}
	// No retry loop on the rejected version.
	syncs := a.c.Stats().Syncs
	time.Sleep(time.Second)
	if again := a.c.Stats().Syncs; again != syncs {
		t.Errorf("%d syncs in a second with nothing changing", again-syncs)
	}
}

// TestPolicyEndpointSelectsOnlyItsNamespace: a PolicyEndpoint naming a pod of another
// namespace is a field error naming the object and the field, counted; its last valid
// version stays in force and the other namespace's pod is not touched. Real apiserver,
// in-memory dataplane.
func TestPolicyEndpointSelectsOnlyItsNamespace(t *testing.T) {
	cp := sharedCP(t)
	const node = "192.0.2.24"
	createNamespace(t, cp, "tenant")
	mem := bpfmaps.NewMemory()
	logs := &logBuffer{}
	a := startAgent(t, cp, agentOptions{nodeIP: node, dp: mem, resolver: newLookupTableResolver("10.1.24.1", 241, "10.1.24.2", 242),
		logger: slog.New(slog.NewTextHandler(logs, nil))})
	pe := ingressPE("tenant", "web", []v1alpha1.PodEndpoint{pod(node, "10.1.24.1")}, "10.2.0.0/16", 80)
	create(t, cp, pe)
	testenv.Eventually(t, 20*time.Second, "record for the create", func() bool { return len(a.sink.recordsFor(string(pe.UID))) == 1 })

	// The same object now also names kube-system's pod 10.1.24.2, on this node.
	update(t, cp, pe, func(pe *v1alpha1.PolicyEndpoint) {
		victim := pod(node, "10.1.24.2")
		victim.Namespace = "kube-system"
		pe.Spec.PodSelectorEndpoints = append(pe.Spec.PodSelectorEndpoints, victim)
		pe.Spec.Ingress[0].Ports[0].Port = ptr[int32](81)
	})
	testenv.Eventually(t, 20*time.Second, "the version counted invalid", func() bool {
		return invalidCount(a.c, report.KindPolicyEndpoint, "spec.podSelectorEndpoints.namespace") == 1
	})
	testenv.Eventually(t, 5*time.Second, "a rejection logged naming the object and the field", func() bool {
		return len(logs.lines("policy object rejected", "name=web", "spec.podSelectorEndpoints[1].namespace", "kube-system")) == 1
	})
	if got := mem.Pods(); len(got) != 1 || got[0] != 241 {
		t.Errorf("dataplane pods = %v: only the object's own pod (241) may hold state", got)
	}
	if !mem.Verdict(241, bpfmaps.Ingress, addr("10.2.0.1"), tcp, 80) || mem.Verdict(241, bpfmaps.Ingress, addr("10.2.0.1"), tcp, 81) {
		t.Errorf("pod 241: the last valid version (port 80) must stay in force")
	}
	if n := len(a.sink.recordsFor(string(pe.UID))); n != 1 {
		t.Errorf("%d records, want 1: the rejected version is not programmed", n)
	}
}

// TestEntryBudgetRejectsObject: a version needing more map entries than
// --max-entries-per-object is bad input at compile time: counted, logged naming the
// object and the count, not retried, its previous version in force, and the other
// objects on its pod still programmed. Real apiserver, in-memory dataplane.
func TestEntryBudgetRejectsObject(t *testing.T) {
	cp := sharedCP(t)
	const node = "192.0.2.25"
	createNamespace(t, cp, "budget")
	mem := bpfmaps.NewMemory()
	logs := &logBuffer{}
	a := startAgent(t, cp, agentOptions{nodeIP: node, dp: mem, resolver: newLookupTableResolver("10.1.25.1", 251),
		logger: slog.New(slog.NewTextHandler(logs, nil)), compile: translate.Options{MaxEntriesPerObject: 4}})
	pods := []v1alpha1.PodEndpoint{pod(node, "10.1.25.1")}
	pe := ingressPE("budget", "big", pods, "10.2.0.0/16", 80)
	create(t, cp, pe)
	testenv.Eventually(t, 20*time.Second, "record for the create", func() bool { return len(a.sink.recordsFor(string(pe.UID))) == 1 })

	update(t, cp, pe, func(pe *v1alpha1.PolicyEndpoint) {
		for i := range 4 {
			pe.Spec.Ingress = append(pe.Spec.Ingress, v1alpha1.EndpointInfo{CIDR: v1alpha1.NetworkAddress(fmt.Sprintf("10.3.%d.0/24", i))})
		}
	})
	testenv.Eventually(t, 20*time.Second, "the version over budget counted invalid", func() bool {
		return invalidCount(a.c, report.KindPolicyEndpoint, "spec") == 1
	})
	testenv.Eventually(t, 5*time.Second, "a rejection logged naming the object and the count", func() bool {
		return len(logs.lines("policy object rejected", "name=big", "needs 5 map entries", "--max-entries-per-object")) == 1
	})
	if !mem.Verdict(251, bpfmaps.Ingress, addr("10.2.0.1"), tcp, 80) || mem.Verdict(251, bpfmaps.Ingress, addr("10.3.0.1"), tcp, 80) {
		t.Errorf("pod 251: the previous version must stay in force, the rejected one not")
	}
	other := ingressPE("budget", "other", pods, "10.4.0.0/16", 443)
	create(t, cp, other)
	testenv.Eventually(t, 20*time.Second, "the other object reported", func() bool { return len(a.sink.recordsFor(string(other.UID))) == 1 })
	if s := a.c.Stats(); s.CommitFailures != 0 || s.InvalidObjects != 1 {
		t.Errorf("commit failures %d, invalid objects %d: want 0 and 1 (rejected before any commit)", s.CommitFailures, s.InvalidObjects)
	}
	syncs := a.c.Stats().Syncs
	time.Sleep(time.Second)
	if again := a.c.Stats().Syncs; again != syncs {
		t.Errorf("%d syncs in a second with nothing changing: the rejected version is retried", again-syncs)
	}
}

// TestRestartRestoresLastValidVersion: a pod selected by a valid object and by one
// whose current version is invalid keeps, after a restart, the invalid object's last
// valid rules, merged with the other's, before and after the other changes. Without
// them the pod's egress, which only the invalid object isolates, would be open. Real
// apiserver; the in-memory dataplane kept across the restart, as pins are.
func TestRestartRestoresLastValidVersion(t *testing.T) {
	cp := sharedCP(t)
	const node = "192.0.2.26"
	createNamespace(t, cp, "lastvalid")
	mem := bpfmaps.NewMemory()
	resolver := newLookupTableResolver("10.1.26.1", 261)
	dir, state := t.TempDir(), t.TempDir()+"/seen.state"
	first := startAgent(t, cp, agentOptions{nodeIP: node, dp: mem, resolver: resolver, state: state, lastValid: dir})
	pods := []v1alpha1.PodEndpoint{pod(node, "10.1.26.1")}
	web := ingressPE("lastvalid", "web", pods, "10.2.0.0/16", 80)
	dns := ingressPE("lastvalid", "dns-only", pods, "10.9.0.0/16", 53)
	dns.Spec.PodIsolation = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	dns.Spec.Egress, dns.Spec.Ingress = dns.Spec.Ingress, nil
	create(t, cp, web)
	create(t, cp, dns)
	testenv.Eventually(t, 20*time.Second, "both reported", func() bool { return first.sink.recordCount() == 2 })
	inForce := func(when string, ingressPort int) {
		t.Helper()
		if !mem.Verdict(261, bpfmaps.Ingress, addr("10.2.0.1"), tcp, uint16(ingressPort)) || mem.Verdict(261, bpfmaps.Ingress, addr("10.3.0.1"), tcp, 80) {
			t.Errorf("%s: web's ingress (port %d from 10.2/16 only) not in force", when, ingressPort)
		}
		if !mem.Verdict(261, bpfmaps.Egress, addr("10.9.0.1"), tcp, 53) || mem.Verdict(261, bpfmaps.Egress, addr("10.8.0.1"), tcp, 443) {
			t.Errorf("%s: dns-only's last valid egress isolation not in force", when)
		}
	}
	inForce("before", 80)
	update(t, cp, dns, func(pe *v1alpha1.PolicyEndpoint) { pe.Spec.Egress[0].CIDR = "10.9.0.0/33" })
	testenv.Eventually(t, 20*time.Second, "invalid version counted", func() bool {
		return invalidCount(first.c, report.KindPolicyEndpoint, "spec.egress.cidr") == 1
	})
	first.stop()

	second := startAgent(t, cp, agentOptions{nodeIP: node, dp: mem, resolver: resolver, state: state, lastValid: dir})
	testenv.Eventually(t, 20*time.Second, "initial sync done", func() bool { return initialSyncDone(second.c) })
	testenv.Eventually(t, 20*time.Second, "invalid version counted again", func() bool {
		return invalidCount(second.c, report.KindPolicyEndpoint, "spec.egress.cidr") == 1
	})
	inForce("after the restart", 80)
	update(t, cp, web, func(pe *v1alpha1.PolicyEndpoint) { pe.Spec.Ingress[0].Ports[0].Port = ptr[int32](81) })
	testenv.Eventually(t, 20*time.Second, "web's update reported", func() bool { return len(second.sink.recordsFor(string(web.UID))) == 1 })
	inForce("after web changed", 81)

	// Deleting the object forgets its saved version.
	remove(t, cp, dns)
	testenv.Eventually(t, 20*time.Second, "egress open once dns-only is deleted", func() bool {
		return mem.Verdict(261, bpfmaps.Egress, addr("10.8.0.1"), tcp, 443)
	})
	testenv.Eventually(t, 5*time.Second, "only web's version saved after the delete", func() bool {
		ents, _ := os.ReadDir(dir)
		return len(ents) == 1 && strings.Contains(ents[0].Name(), "_web.json")
	})
}

// TestHeldPodReleasedByAValidVersion: without a saved last valid version, a pod named
// only by an object whose current version is invalid keeps its pinned state across a
// restart; a later valid version that no longer selects it removes that state (pinned
// by the previous process, never committed by this one), and programs the pod it
// selects now. Real apiserver; the in-memory dataplane kept across the restart.
func TestHeldPodReleasedByAValidVersion(t *testing.T) {
	cp := sharedCP(t)
	const node = "192.0.2.27"
	createNamespace(t, cp, "held")
	mem := bpfmaps.NewMemory()
	resolver := newLookupTableResolver("10.1.27.1", 271, "10.1.27.2", 272)
	first := startAgent(t, cp, agentOptions{nodeIP: node, dp: mem, resolver: resolver})
	pe := ingressPE("held", "web", []v1alpha1.PodEndpoint{pod(node, "10.1.27.1")}, "10.2.0.0/16", 80)
	create(t, cp, pe)
	testenv.Eventually(t, 20*time.Second, "record for the create", func() bool { return len(first.sink.recordsFor(string(pe.UID))) == 1 })
	update(t, cp, pe, func(pe *v1alpha1.PolicyEndpoint) { pe.Spec.Ingress[0].CIDR = "10.2.0.0/33" })
	testenv.Eventually(t, 20*time.Second, "invalid version counted", func() bool { return first.c.Stats().InvalidObjects == 1 })
	first.stop()

	second := startAgent(t, cp, agentOptions{nodeIP: node, dp: mem, resolver: resolver})
	testenv.Eventually(t, 20*time.Second, "initial sync done", func() bool { return initialSyncDone(second.c) })
	if got := mem.Pods(); len(got) != 1 || got[0] != 271 {
		t.Fatalf("dataplane pods after the restart = %v, want the held pod 271", got)
	}
	if mem.Verdict(271, bpfmaps.Ingress, addr("10.3.0.1"), tcp, 80) {
		t.Errorf("held pod 271 open after the restart")
	}
	update(t, cp, pe, func(pe *v1alpha1.PolicyEndpoint) {
		pe.Spec.Ingress[0].CIDR = "10.2.0.0/16"
		pe.Spec.PodSelectorEndpoints = []v1alpha1.PodEndpoint{pod(node, "10.1.27.2")}
		pe.Spec.PodSelectorEndpoints[0].Namespace = "held"
	})
	testenv.Eventually(t, 20*time.Second, "the held pod released, the new one programmed", func() bool {
		got := mem.Pods()
		return len(got) == 1 && got[0] == 272
	})
	if !mem.Verdict(272, bpfmaps.Ingress, addr("10.2.0.1"), tcp, 80) || mem.Verdict(272, bpfmaps.Ingress, addr("10.3.0.1"), tcp, 80) {
		t.Errorf("pod 272: the valid version not in force")
	}
}

// TestEBPFRejectedObjectIsolatesItsPods: a PolicyEndpoint that has never had a valid
// version (here: one domainName rule, rejected by default) isolates its pod in the
// directions its podIsolation names, both families, node traffic still allowed,
// counted and logged naming pod and object (finding 10 of issue 24: the pod stayed
// open). A valid object on the same pod keeps its allows; the rejected object adds
// none. Its first valid version replaces the isolation with its rules; deleting both
// opens the pod. Real apiserver, real eBPF, real packets.
func TestEBPFRejectedObjectIsolatesItsPods(t *testing.T) {
	l := newStrictLab(t, "r")
	// Services the pod dials out to: on the node, on the allowed and the denied peer.
	for _, a := range []string{l.hostIP, l.allowed[0], l.denied[0]} {
		netlab.ServeEcho(t, "", "tcp4", a+":8090")
	}
	for _, a := range []string{l.hostIP6, l.allowed[1], l.denied[1]} {
		netlab.ServeEcho(t, "", "tcp6", "["+a+"]:8090")
	}
	out := func(dst string) error {
		if strings.Contains(dst, ":") {
			return netlab.Exchange(l.ns, "tcp6", "["+dst+"]:8090", 400*time.Millisecond)
		}
		return netlab.Exchange(l.ns, "tcp4", dst+":8090", 400*time.Millisecond)
	}
	egressTo := []string{l.hostIP, l.hostIP6, l.allowed[0], l.allowed[1], l.denied[0], l.denied[1]}
	for _, dst := range egressTo {
		testenv.Eventually(t, 10*time.Second, "pod reaches "+dst+" before any policy", func() bool { return out(dst) == nil })
	}
	expectOut := func(when string, pass ...string) {
		t.Helper()
		for _, dst := range egressTo {
			err := out(dst)
			switch want := slices.Contains(pass, dst); {
			case want && err != nil:
				t.Errorf("%s: pod to %s: %v, want it to connect", when, dst, err)
			case !want && err == nil:
				t.Errorf("%s: pod connected to %s, want it dropped", when, dst)
			}
		}
	}
	dp := openKernelDataplane(t, "rejected")
	if err := dp.SetNodeAddrs(l.nodeAddrs); err != nil {
		t.Fatal(err)
	}
	cp := sharedCP(t)
	const node = "192.0.2.28"
	createNamespace(t, cp, "rejected")
	logs := &logBuffer{}
	a := startAgent(t, cp, agentOptions{nodeIP: node, dp: dp, logger: slog.New(slog.NewTextHandler(logs, nil))})

	// Both directions isolated, each allowing the allowed peers, plus one FQDN rule.
	fqdn := l.strictPE("rejected", node)
	fqdn.Name, fqdn.Spec.PolicyRef.Name = "fqdn", "fqdn"
	fqdn.Spec.PodIsolation = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
	for _, peer := range []string{l.allowed[0] + "/32", l.allowed[1] + "/128"} {
		fqdn.Spec.Egress = append(fqdn.Spec.Egress, v1alpha1.EndpointInfo{CIDR: v1alpha1.NetworkAddress(peer), Ports: []v1alpha1.Port{{Port: ptr[int32](8090)}}})
	}
	fqdn.Spec.Egress = append(fqdn.Spec.Egress, v1alpha1.EndpointInfo{DomainName: "api.example.com", Ports: []v1alpha1.Port{{Port: ptr[int32](443)}}})
	create(t, cp, fqdn)
	testenv.Eventually(t, 20*time.Second, "the FQDN object counted invalid", func() bool {
		return invalidCount(a.c, report.KindPolicyEndpoint, "spec.egress.domainName") == 1
	})
	// Counted after its commit: the isolation is in force now.
	l.expect(t, "rejected object, no valid version", l.hostIP, l.hostIP6)
	expectOut("rejected object, no valid version", l.hostIP, l.hostIP6)
	testenv.Eventually(t, 5*time.Second, "pod isolated", func() bool { return a.c.Stats().PodsIsolated == 2 }) // its two addresses
	for _, ip := range []string{l.podIP, l.podIP6} {
		if got := logs.lines("pod isolated", "pod="+ip, "name=fqdn", "ingressDenied=true", "egressDenied=true"); len(got) != 1 {
			t.Errorf("want one log line naming the isolated pod %s and object fqdn; logs:\n%s", ip, logs.String())
		}
	}

	// A valid object next to it: its allows work; the rejected one adds none.
	web := l.strictPE("rejected", node)
	create(t, cp, web)
	testenv.Eventually(t, 20*time.Second, "record for the valid object", func() bool { return len(a.sink.recordsFor(string(web.UID))) == 1 })
	l.expect(t, "valid object beside the rejected one", l.hostIP, l.hostIP6, l.allowed[0], l.allowed[1])
	expectOut("valid object beside the rejected one", l.hostIP, l.hostIP6)
	if n := a.c.Stats().PodsIsolated; n != 2 {
		t.Errorf("pods isolated = %d after another object's commit, want still 2", n)
	}

	// Its first valid version replaces the isolation with its rules.
	fix := update(t, cp, fqdn, func(pe *v1alpha1.PolicyEndpoint) { pe.Spec.Egress = pe.Spec.Egress[:2] })
	testenv.Eventually(t, 20*time.Second, "record for the valid version", func() bool { return reported(a, fqdn, fix) })
	l.expect(t, "valid version", l.hostIP, l.hostIP6, l.allowed[0], l.allowed[1])
	expectOut("valid version", l.hostIP, l.hostIP6, l.allowed[0], l.allowed[1])

	remove(t, cp, fqdn)
	remove(t, cp, web)
	testenv.Eventually(t, 20*time.Second, "pod state removed", func() bool { return len(dp.Pods()) == 0 })
	l.expect(t, "objects deleted", l.sources()...)
	expectOut("objects deleted", egressTo...)
}

// TestRejectedObjectIsolation: which pods a rejected object with no valid version
// isolates, and what it cannot. Its pods of its own namespace are isolated in the
// directions it names (podIsolation empty: Ingress, plus Egress with egress rules),
// both families; a pod of another namespace it names is not touched; endpoints whose
// addresses do not parse cannot be isolated (counted, logged); a rejected
// ClusterPolicyEndpoint isolates nothing (the admin and baseline tiers have no
// isolation to fall back to); a rejected object whose merge the dataplane refuses
// isolates like one that does not compile; deleting the rejected object releases the
// pod. Real apiserver, in-memory dataplane.
func TestRejectedObjectIsolation(t *testing.T) {
	cp := sharedCP(t)
	const node = "192.0.2.29"
	createNamespace(t, cp, "closed")
	mem := bpfmaps.NewMemory()
	logs := &logBuffer{}
	a := startAgent(t, cp, agentOptions{nodeIP: node, dp: mem,
		resolver: newLookupTableResolver("10.1.29.1", 291, "fd00:29::1", 291, "10.1.29.2", 292, "10.1.29.3", 293, "10.1.29.4", 294),
		logger:   slog.New(slog.NewTextHandler(logs, nil))})

	fqdn := ingressPE("closed", "fqdn", []v1alpha1.PodEndpoint{pod(node, "10.1.29.1"), pod(node, "fd00:29::1")}, "10.2.0.0/16", 80)
	fqdn.Spec.PodIsolation = nil
	fqdn.Spec.Egress = []v1alpha1.EndpointInfo{{DomainName: "api.example.com"}}
	victim := pod(node, "10.1.29.2")
	victim.Namespace = "kube-system"
	fqdn.Spec.PodSelectorEndpoints = append(fqdn.Spec.PodSelectorEndpoints, victim)
	create(t, cp, fqdn)
	unreadable := ingressPE("closed", "unreadable", []v1alpha1.PodEndpoint{pod("node-29", "10.1.29.4")}, "10.2.0.0/16", 80)
	create(t, cp, unreadable)
	cpe := &v1alpha1.ClusterPolicyEndpoint{
		ObjectMeta: metav1.ObjectMeta{Name: "closed-deny-fqdn"},
		Spec: v1alpha1.ClusterPolicyEndpointSpec{
			PolicyRef: v1alpha1.ClusterPolicyReference{Name: "deny-fqdn"}, Tier: v1alpha1.TierAdmin, Priority: 5,
			Subject:              v1alpha1.ClusterPolicySubject{Namespaces: &metav1.LabelSelector{}},
			PodSelectorEndpoints: []v1alpha1.PodEndpoint{pod(node, "10.1.29.3")},
			Egress:               []v1alpha1.ClusterEndpointInfo{{Action: v1alpha1.ClusterRuleActionDeny, DomainName: "evil.example.com"}},
		},
	}
	create(t, cp, cpe)
	testenv.Eventually(t, 20*time.Second, "three invalid objects counted", func() bool { return a.c.Stats().InvalidObjects == 3 })
	// Counted after their commits: what they commit is in force now.
	if got := mem.Pods(); !slices.Equal(got, []int{291}) {
		t.Errorf("dataplane pods = %v, want only 291: another namespace's pod (292), a cluster policy's (293) and an unreadable one (294) are not isolated", got)
	}
	for _, peer := range []string{"10.2.0.1", "fd00:2::1"} {
		if mem.Verdict(291, bpfmaps.Ingress, addr(peer), tcp, 80) || mem.Verdict(291, bpfmaps.Egress, addr(peer), tcp, 443) {
			t.Errorf("pod 291: %s passes a direction the rejected object isolates", peer)
		}
	}
	testenv.Eventually(t, 5*time.Second, "pod 291 isolated", func() bool { return a.c.Stats().PodsIsolated == 2 })
	if n := a.c.Stats().PodsUnisolable; n != 1 {
		t.Errorf("pods unisolable = %d, want 1 (the endpoint with hostIP node-29)", n)
	}
	if got := logs.lines("cannot be isolated", "name=unreadable", "endpoints=1"); len(got) != 1 {
		t.Errorf("want one log line naming the object whose pods cannot be read; logs:\n%s", logs.String())
	}

	// A new object whose merge with fqdn's isolation and another object's rules the
	// dataplane refuses isolates too (nothing to add here: 291 is isolated both
	// ways); on 293, where only the cluster policy is rejected, it is what isolates.
	ports := func(first, n int) []v1alpha1.Port {
		var out []v1alpha1.Port
		for i := range n {
			out = append(out, v1alpha1.Port{Port: ptr(int32(first + 2*i))})
		}
		return out
	}
	wide := ingressPE("closed", "wide", []v1alpha1.PodEndpoint{pod(node, "10.1.29.3")}, "10.5.0.0/16", 1)
	wide.Spec.Ingress[0].Ports = ports(1000, 20)
	create(t, cp, wide)
	testenv.Eventually(t, 20*time.Second, "wide reported", func() bool { return len(a.sink.recordsFor(string(wide.UID))) == 1 })
	grow := ingressPE("closed", "grow", []v1alpha1.PodEndpoint{pod(node, "10.1.29.3")}, "10.5.0.0/16", 1)
	grow.Spec.PodIsolation = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
	grow.Spec.Ingress[0].Ports = ports(2000, 5)
	create(t, cp, grow)
	testenv.Eventually(t, 20*time.Second, "the refused object isolates 293's egress", func() bool { return a.c.Stats().PodsIsolated == 3 })
	if !mem.Verdict(293, bpfmaps.Ingress, addr("10.5.0.1"), tcp, 1002) || mem.Verdict(293, bpfmaps.Ingress, addr("10.5.0.1"), tcp, 2002) {
		t.Errorf("pod 293: wide's rules must be in force, grow's refused ones not")
	}
	if mem.Verdict(293, bpfmaps.Egress, addr("10.9.0.1"), tcp, 443) {
		t.Errorf("pod 293: egress open, want it isolated by the refused object")
	}

	// fqdn's first valid version replaces the isolation: its ingress rule, its
	// egress (no egress rule any more) open.
	fix := update(t, cp, fqdn, func(pe *v1alpha1.PolicyEndpoint) {
		pe.Spec.Egress = nil
		pe.Spec.PodSelectorEndpoints = pe.Spec.PodSelectorEndpoints[:2]
	})
	testenv.Eventually(t, 20*time.Second, "record for the valid version", func() bool { return reported(a, fqdn, fix) })
	if !mem.Verdict(291, bpfmaps.Ingress, addr("10.2.0.1"), tcp, 80) || mem.Verdict(291, bpfmaps.Ingress, addr("10.3.0.1"), tcp, 80) {
		t.Errorf("pod 291: the valid version's ingress not in force")
	}
	if !mem.Verdict(291, bpfmaps.Egress, addr("10.9.0.1"), tcp, 443) {
		t.Errorf("pod 291: egress still isolated after a valid version that does not isolate it")
	}

	// Deleting the refused object releases 293's egress.
	remove(t, cp, grow)
	testenv.Eventually(t, 20*time.Second, "293's egress open once grow is deleted", func() bool {
		return mem.Verdict(293, bpfmaps.Egress, addr("10.9.0.1"), tcp, 443)
	})
}

// reported tells whether the object's trigger was reported (the rejected versions'
// triggers are reported with the first valid one, like coalesced writes).
func reported(a *agent, obj *v1alpha1.PolicyEndpoint, trigger time.Time) bool {
	recs := a.sink.recordsFor(string(obj.UID))
	return len(recs) > 0 && recs[len(recs)-1].Trigger.Equal(trigger)
}
