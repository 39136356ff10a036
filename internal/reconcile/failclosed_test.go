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

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/testenv"
	"github.com/npagent/npagent/internal/testenv/netlab"
	"github.com/npagent/npagent/internal/testenv/skip"
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
	cp := testenv.Start(t)
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
	cp := testenv.Start(t)
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
	cp := testenv.Start(t)
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
	cp := testenv.Start(t)
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
	cp := testenv.Start(t)
	const node = "192.0.2.25"
	createNamespace(t, cp, "budget")
	mem := bpfmaps.NewMemory()
	logs := &logBuffer{}
	a := startAgent(t, cp, agentOptions{nodeIP: node, dp: mem, resolver: newLookupTableResolver("10.1.25.1", 251),
		logger: slog.New(slog.NewTextHandler(logs, nil)), compile: CompileOptions{MaxEntriesPerObject: 4}})
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
	cp := testenv.Start(t)
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
	cp := testenv.Start(t)
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
