package relay

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/reconcile"
	"github.com/npagent/npagent/internal/seen"
	"github.com/npagent/npagent/internal/testenv"
	"github.com/npagent/npagent/internal/testenv/fixture"
)

// BenchmarkColdStartSource10k is a fresh agent's cold start (memory dataplane, no
// state) with 10,000 PolicyEndpoints of ~1.7 KB (fixture.BenchPE) in 100 namespaces,
// 1 % of them with a pod on the agent's node, spread over the namespaces as on a
// cluster: from the loop's start to its caches synced (synced-s), to every local pod
// holding its policy in the dataplane (programmed-s), and to ready (/readyz: synced
// and every local object of the initial list programmed; ready-s). Two sources on the
// same apiserver and objects, one after the other: the apiserver (every object), and
// a relay (the node's view; the relay itself started and synced before the agent, as
// a Deployment runs before a node joins). Figures, no assertion: the apiserver and
// the relay share the machine's cores with the agent.
func BenchmarkColdStartSource10k(b *testing.B) { benchColdStartSource(b, 10000) }

// BenchmarkColdStartSource50k is BenchmarkColdStartSource10k with 50,000 objects.
func BenchmarkColdStartSource50k(b *testing.B) { benchColdStartSource(b, 50000) }

func benchColdStartSource(b *testing.B, n int) {
	const every, namespaces = 100, 100
	cp := testenv.Start(b)
	const ns = "npagent-system"
	if err := cp.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		b.Fatal(err)
	}
	id := newNode(b, cp, ns, "bench-node", fixture.BenchNode)
	pods := createSpread(b, cp, n, every, namespaces)
	began := time.Now()
	tr := startRelay(b, cp, Config{})
	b.Logf("relay ready %v after its start (%d objects)", time.Since(began).Round(time.Millisecond), n)
	viaRelay, err := ClientConfig(b.Context(), apiConfig(cp, id), tr.url, ClientOptions{CAFile: tr.caFile,
		Logger: testLogger(b).With("component", "relay-client")})
	if err != nil {
		b.Fatal(err)
	}
	for _, src := range []struct {
		name      string
		endpoints *rest.Config
	}{{"apiserver", nil}, {"relay", viaRelay}} {
		b.Run(src.name, func(b *testing.B) {
			for b.Loop() {
				coldStartOnce(b, apiConfig(cp, id), src.endpoints, pods)
			}
		})
	}
}

// coldStartOnce starts an agent, reports its cold start's figures and stops it.
func coldStartOnce(b *testing.B, api, endpoints *rest.Config, pods resolver) {
	set, err := seen.New(time.Now())
	if err != nil {
		b.Fatal(err)
	}
	mem := bpfmaps.NewMemory()
	c, err := reconcile.New(api, reconcile.Config{
		NodeIP: netip.MustParseAddr(fixture.BenchNode), Dataplane: mem, Seen: set, Sink: &triggerSink{}, Resolver: pods,
		MaxRetryDelay: 500 * time.Millisecond, Logger: testLogger(b), EndpointsConfig: endpoints,
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		if err := c.Run(ctx); err != nil {
			b.Errorf("agent Run: %v", err)
		}
	}()
	defer func() { cancel(); <-done }()
	var synced, programmed, ready time.Duration
	for synced == 0 || programmed == 0 || ready == 0 {
		if time.Since(start) > 5*time.Minute {
			b.Fatalf("after 5 minutes: synced %v, %d of %d pods programmed, %d local objects pending",
				c.HasSynced(), len(mem.Pods()), len(pods), c.LocalPending())
		}
		now := time.Since(start)
		if synced == 0 && c.HasSynced() {
			synced = now
		}
		if programmed == 0 && len(mem.Pods()) >= len(pods) {
			programmed = now
		}
		if ready == 0 && synced != 0 && c.LocalPending() == 0 {
			ready = now
		}
		time.Sleep(5 * time.Millisecond)
	}
	b.Logf("synced after %v, %d pods programmed after %v, ready after %v", synced, len(pods), programmed, ready)
	b.ReportMetric(synced.Seconds(), "synced-s")
	b.ReportMetric(programmed.Seconds(), "programmed-s")
	b.ReportMetric(ready.Seconds(), "ready-s")
}

// createSpread creates n BenchPE objects over namespaces namespaces, object i in
// namespace (i + i/every) mod namespaces, every every-th one with a pod on
// fixture.BenchNode (the others' pods all elsewhere), and returns the local pods.
func createSpread(b *testing.B, cp *testenv.ControlPlane, n, every, namespaces int) resolver {
	nsOf := func(i int) string { return fmt.Sprintf("bench-%03d", (i+i/every)%namespaces) }
	for i := range namespaces {
		if err := cp.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-%03d", i)}}); err != nil {
			b.Fatal(err)
		}
	}
	pods := resolver{}
	var mu sync.Mutex
	testenv.CreateEach(b, cp.Client, n, func(i int) client.Object {
		pe := fixture.InNamespace(fixture.BenchPE(i, n/every), nsOf(i))
		pe.ResourceVersion, pe.UID = "", ""
		if i%every == 0 {
			pe.Spec.PodSelectorEndpoints[0].PodIP = v1alpha1.NetworkAddress(fmt.Sprintf("10.60.%d.%d", (i/every)/250, (i/every)%250+1))
			mu.Lock()
			pods[netip.MustParseAddr(string(pe.Spec.PodSelectorEndpoints[0].PodIP))] = 1000 + i/every
			mu.Unlock()
		} else {
			pe.Spec.PodSelectorEndpoints[0].HostIP = "192.0.2.99"
		}
		return pe
	})
	return pods
}
