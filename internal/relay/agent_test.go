package relay

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/podif"
	"github.com/npagent/npagent/internal/reconcile"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/seen"
	"github.com/npagent/npagent/internal/testenv"
)

// restart stops the relay and starts a new one on the same address.
func (tr *testRelay) restart() {
	tr.t.Helper()
	tr.stop()
	tr.startAgain()
}

// startAgain starts a stopped relay on its address.
func (tr *testRelay) startAgain() {
	tr.t.Helper()
	var l net.Listener
	var err error
	testenv.Eventually(tr.t, 10*time.Second, "relay address free again", func() bool {
		l, err = net.Listen("tcp", tr.addr)
		return err == nil
	})
	tr.start(l)
}

func (tr *testRelay) current() *Relay {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.relay
}

// apiConfig is the agent's own rest.Config for the apiserver: its token, no client
// certificate.
func apiConfig(cp *testenv.ControlPlane, id agentIdentity) *rest.Config {
	cfg := rest.AnonymousClientConfig(cp.Config)
	cfg.BearerToken = id.token
	return cfg
}

// triggerSink counts each (uid, trigger) reported: the seen-set's promise is once.
type triggerSink struct {
	mu       sync.Mutex
	reported map[string]int
}

func (s *triggerSink) Report(r *report.Record) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reported == nil {
		s.reported = map[string]int{}
	}
	s.reported[r.UID+"@"+r.Trigger.UTC().Format(time.RFC3339Nano)]++
}
func (s *triggerSink) Committed(report.Kind, *report.Attempt) {}

func (s *triggerSink) count(uid string, trigger time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reported[uid+"@"+trigger.UTC().Format(time.RFC3339Nano)]
}

func (s *triggerSink) total() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.reported {
		n += c
	}
	return n
}

type resolver map[netip.Addr]int

func (r resolver) Resolve(ip netip.Addr) (int, error) {
	if i, ok := r[ip]; ok {
		return i, nil
	}
	return 0, podif.ErrInterfaceNotFound
}

type testAgent struct {
	mem  *bpfmaps.Memory
	sink *triggerSink
	c    *reconcile.Controller
}

// runAgent runs a reconcile loop with the in-memory dataplane for nodeIP until the
// test ends; endpoints (nil: api) is where it reads the policy endpoint objects.
func runAgent(t *testing.T, api, endpoints *rest.Config, nodeIP string, pods resolver) *testAgent {
	t.Helper()
	return runAgentLogging(t, api, endpoints, nodeIP, pods, testLogger(t).With("agent", nodeIP))
}

// runAgentLogging is runAgent logging to log.
func runAgentLogging(t *testing.T, api, endpoints *rest.Config, nodeIP string, pods resolver, log *slog.Logger) *testAgent {
	t.Helper()
	set, err := seen.New(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	a := &testAgent{mem: bpfmaps.NewMemory(), sink: &triggerSink{}}
	a.c, err = reconcile.New(api, reconcile.Config{
		NodeIP: netip.MustParseAddr(nodeIP), Dataplane: a.mem, Seen: set, Sink: a.sink, Resolver: pods,
		MaxRetryDelay: 500 * time.Millisecond, Logger: log,
		EndpointsConfig: endpoints,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := a.c.Run(ctx); err != nil {
			t.Errorf("agent Run: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	testenv.Eventually(t, 30*time.Second, "agent caches synced", a.c.HasSynced)
	return a
}

// stamped sets a new trigger time on obj and returns it.
func stamped(obj metav1.Object) time.Time {
	now := time.Now().UTC()
	ann := obj.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	ann[v1alpha1.AnnotationLastChangeTriggerTime] = now.Format(time.RFC3339Nano)
	obj.SetAnnotations(ann)
	return now
}

// verdicts is what a dataplane decides for a fixed set of probes on the pods.
func verdicts(m *bpfmaps.Memory, ifindexes []int) string {
	out := fmt.Sprint(m.Pods())
	for _, i := range ifindexes {
		for _, peer := range []string{"10.50.0.1", "10.60.0.1", "10.70.0.1", "10.80.0.1"} {
			for _, port := range []uint16{80, 443, 8080, 9090} {
				out += fmt.Sprintf(" %d/%s/%d=%v", i, peer, port, m.Verdict(i, bpfmaps.Ingress, netip.MustParseAddr(peer), bpfmaps.ProtocolTCP, port))
			}
		}
	}
	return out
}

// TestAgentThroughRelay: an agent reading its policy endpoint objects through the
// relay programs the same rules as one reading the apiserver; a relay restart is an
// ordinary relist (no trigger reported twice, none lost); with the relay down the
// agent falls back to the apiserver and keeps programming, and moves back when the
// relay returns.
func TestAgentThroughRelay(t *testing.T) {
	cp := testenv.Shared(t)
	ns := cp.Namespace(t)
	n1 := newNode(t, cp, ns, ns+"-n1", "198.51.103.1")
	n2 := newNode(t, cp, ns, ns+"-n2", "198.51.103.2")
	tr := startRelay(t, cp, Config{BookmarkInterval: time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	viaRelay, err := ClientConfig(ctx, apiConfig(cp, n1), tr.url, ClientOptions{CAFile: tr.caFile, RetryAfter: time.Second,
		Logger: testLogger(t).With("component", "relay-client")})
	if err != nil {
		t.Fatal(err)
	}
	pods := resolver{netip.MustParseAddr("10.3.0.1"): 11, netip.MustParseAddr("10.3.0.2"): 12}
	ifindexes := []int{11, 12}
	relayed := runAgent(t, apiConfig(cp, n1), viaRelay, n1.ip, pods)
	direct := runAgent(t, cp.Config, nil, n1.ip, pods)

	type written struct {
		obj     client.Object
		trigger time.Time
	}
	var local []written // writes whose objects have a pod on node 1: each reported once by each agent
	create := func(obj client.Object, isLocal bool) {
		t.Helper()
		tr := stamped(obj)
		if err := cp.Client.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
		if isLocal {
			local = append(local, written{obj, tr})
		}
	}
	update := func(obj *v1alpha1.PolicyEndpoint, change func(*v1alpha1.PolicyEndpoint)) {
		t.Helper()
		var trigger time.Time
		write(t, cp, obj, func(p *v1alpha1.PolicyEndpoint) { change(p); trigger = stamped(p) })
		local = append(local, written{obj, trigger})
	}
	web := pe(ns, "web", "web", "10.50.0.0/16", 80, [2]string{n1.ip, "10.3.0.1"}, [2]string{n2.ip, "10.4.0.1"})
	webSibling := pe(ns, "web-2", "web", "10.60.0.0/16", 443)
	api := pe(ns, "api", "api", "10.70.0.0/16", 8080, [2]string{n1.ip, "10.3.0.2"})
	remote := pe(ns, "remote", "remote", "10.80.0.0/16", 9090, [2]string{n2.ip, "10.4.0.2"})
	create(web, true)
	create(webSibling, false) // no pod of its own: merged into web's pods, no report of its own
	create(api, true)
	create(remote, false)

	check := func(what string) {
		t.Helper()
		testenv.Eventually(t, 30*time.Second, what+": both agents report every local trigger", func() bool {
			for _, w := range local {
				if relayed.sink.count(string(w.obj.GetUID()), w.trigger) == 0 || direct.sink.count(string(w.obj.GetUID()), w.trigger) == 0 {
					return false
				}
			}
			return true
		})
		testenv.Eventually(t, 10*time.Second, what+": the same rules", func() bool {
			return verdicts(relayed.mem, ifindexes) == verdicts(direct.mem, ifindexes)
		})
		if a, b := verdicts(relayed.mem, ifindexes), verdicts(direct.mem, ifindexes); a != b {
			t.Fatalf("%s: through the relay:\n%s\nfrom the apiserver:\n%s", what, a, b)
		}
		for _, w := range local {
			if n := relayed.sink.count(string(w.obj.GetUID()), w.trigger); n != 1 {
				t.Errorf("%s: %s@%s reported %d times through the relay, want once", what, w.obj.GetName(), w.trigger.Format(time.RFC3339Nano), n)
			}
		}
		if a, b := relayed.sink.total(), direct.sink.total(); a != b {
			t.Errorf("%s: %d triggers reported through the relay, %d from the apiserver", what, a, b)
		}
	}
	check("created")
	if !relayed.mem.Verdict(11, bpfmaps.Ingress, netip.MustParseAddr("10.60.0.1"), bpfmaps.ProtocolTCP, 443) {
		t.Errorf("the sibling's rule is not in force through the relay")
	}

	// Restart the relay: the agent's watch ends, it lists the relay again, nothing is
	// reported twice; writes after the restart arrive.
	tr.restart()
	update(web, func(p *v1alpha1.PolicyEndpoint) { p.Spec.Ingress[0].Ports[0].Port = ptr[int32](8080) })
	check("after a relay restart")
	// Policy remote gains a pod on node 1: it enters the relay's view.
	update(remote, func(p *v1alpha1.PolicyEndpoint) {
		p.Spec.PodSelectorEndpoints = append(p.Spec.PodSelectorEndpoints, v1alpha1.PodEndpoint{HostIP: v1alpha1.NetworkAddress(n1.ip), PodIP: "10.3.0.2", Namespace: ns})
	})
	check("entering the view")

	// The relay goes away: the agent falls back to the apiserver.
	tr.stop()
	update(api, func(p *v1alpha1.PolicyEndpoint) { p.Spec.Ingress[0].Ports[0].Port = ptr[int32](9090) })
	check("relay down")
	// It comes back: the agent's watches move back to it.
	tr.startAgain()
	testenv.Eventually(t, 30*time.Second, "the agent's watches back on the relay", func() bool {
		return tr.current().stats.watchers.Load() == 2
	})
	update(web, func(p *v1alpha1.PolicyEndpoint) { p.Spec.Ingress[0].Ports[0].Port = ptr[int32](80) })
	check("relay back")
}

// TestAgentThroughRelayAPIServerRestart: an apiserver restart behind the relay is an
// ordinary relist for an agent reading through it — a write after it is reported
// once, the agent stays on the relay, and it logs nothing at ERROR (client-go's
// reflector errors included: the agent's informers log through kubewatch's
// ErrorHandler).
func TestAgentThroughRelayAPIServerRestart(t *testing.T) {
	cp := testenv.Start(t)
	ctx := context.Background()
	const ns = "restart"
	if err := cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	n1 := newNode(t, cp, ns, "restart-n1", "198.51.104.1")
	tr := startRelay(t, cp, Config{BookmarkInterval: time.Second})
	var logs testenv.LogBuffer
	viaRelay, err := ClientConfig(ctx, apiConfig(cp, n1), tr.url, ClientOptions{CAFile: tr.caFile,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)).With("component", "relay-client")})
	if err != nil {
		t.Fatal(err)
	}
	a := runAgentLogging(t, apiConfig(cp, n1), viaRelay, n1.ip, resolver{netip.MustParseAddr("10.4.0.1"): 21},
		slog.New(slog.NewTextHandler(&logs, nil)))
	web := pe(ns, "web", "web", "10.50.0.0/16", 80, [2]string{n1.ip, "10.4.0.1"})
	first := stamped(web)
	if err := cp.Client.Create(ctx, web); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the first write reported", func() bool { return a.sink.count(string(web.UID), first) == 1 })

	cp.RestartAPIServer(t)
	var second time.Time
	write(t, cp, web, func(p *v1alpha1.PolicyEndpoint) {
		p.Spec.Ingress[0].Ports[0].Port = ptr[int32](8080)
		second = stamped(p)
	})
	testenv.Eventually(t, time.Minute, "the write after the restart reported", func() bool { return a.sink.count(string(web.UID), second) >= 1 })
	time.Sleep(2 * time.Second) // a second report, or a late error, would come by now
	if n, m := a.sink.count(string(web.UID), first), a.sink.count(string(web.UID), second); n != 1 || m != 1 {
		t.Errorf("reported %d and %d times, want each trigger once", n, m)
	}
	if got := tr.current().stats.watchers.Load(); got != 2 {
		t.Errorf("relay watchers after the restart: %d, want the agent's 2 (it stayed on the relay)", got)
	}
	var errorLines []string
	for line := range strings.SplitSeq(logs.String(), "\n") {
		if strings.Contains(line, " level=ERROR ") {
			errorLines = append(errorLines, line)
		}
	}
	if len(errorLines) > 0 {
		t.Errorf("the agent logged %d lines at ERROR across the restart:\n%s", len(errorLines), strings.Join(errorLines, "\n"))
	}
}
