package main

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/testenv"
	"github.com/npagent/npagent/internal/testenv/netlab"
	"github.com/npagent/npagent/internal/testenv/otlptest"
)

// e2eNode is one agent of BenchmarkEndToEndTwoAgents: a node of its own (name, IP,
// pin directory) on this machine, with the local pods its objects select.
type e2eNode struct {
	name, ip string
	pods     []localPod
	agent    *agentProcess
}

// controllerPE is a PolicyEndpoint as the AWS controller writes one for a policy
// selecting pod on node: ingress from peers /32 peers on TCP 8080, egress to one
// CIDR on TCP 443, two more selected pods on other nodes.
func controllerPE(name, hostIP, podIP string, peers []string, trigger time.Time) *v1alpha1.PolicyEndpoint {
	tcp := corev1.ProtocolTCP
	p8080, p443 := int32(8080), int32(443)
	in := make([]v1alpha1.EndpointInfo, len(peers))
	for i, ip := range peers {
		in[i] = v1alpha1.EndpointInfo{CIDR: v1alpha1.NetworkAddress(ip), Ports: []v1alpha1.Port{{Protocol: &tcp, Port: &p8080}}}
	}
	return &v1alpha1.PolicyEndpoint{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "default",
			Annotations: map[string]string{v1alpha1.AnnotationLastChangeTriggerTime: trigger.UTC().Format(time.RFC3339Nano)},
		},
		Spec: v1alpha1.PolicyEndpointSpec{
			PolicyRef:    v1alpha1.PolicyReference{Name: name, Namespace: "default"},
			PodIsolation: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			PodSelectorEndpoints: []v1alpha1.PodEndpoint{
				{HostIP: v1alpha1.NetworkAddress(hostIP), PodIP: v1alpha1.NetworkAddress(podIP), Name: name + "-pod", Namespace: "default"},
				{HostIP: "198.51.100.1", PodIP: "198.51.100.10", Name: name + "-r1", Namespace: "default"},
				{HostIP: "198.51.100.2", PodIP: "198.51.100.11", Name: name + "-r2", Namespace: "default"},
			},
			Ingress: in,
			Egress:  []v1alpha1.EndpointInfo{{CIDR: "172.16.0.0/12", Ports: []v1alpha1.Port{{Protocol: &tcp, Port: &p443}}}},
		},
	}
}

// peerIP is the n-th /32 peer of the cluster (100.64.0.0/10).
func peerIP(n int) string {
	return fmt.Sprintf("100.%d.%d.%d", 64+n>>16&63, n>>8&255, n&255)
}

// BenchmarkEndToEndTwoAgents is issue 12's end-to-end row: a real apiserver, two
// agents (two nodes on this machine, each with the eBPF dataplane and its own local
// pods), 1,000 controller-shaped PolicyEndpoints and 50 writes/s among them; the
// second sub-benchmark adds one object of 10,000 /32 peers, selecting a pod on each
// node, gaining or losing one peer once a second. Every trigger is traced (the
// default threshold 0) and exported through a real collector, and every trigger
// written in the window must be reported. The figures are the agents' own reports,
// annotation → commit (p50/p99), and npagent's part of each (npagent-p99-ms: from
// the event's arrival to the commit, the latency less its delivery span, which is
// the apiserver storing the write and its watch bringing it); for the large object
// also its apiserver Update round trip and its mean span durations. One op is one
// window (-benchtime=1x): NPAGENT_E2E_WINDOW (default 30s) long.
//
//	NPAGENT_E2E_WINDOW=60s go test -run '^$' -bench EndToEndTwoAgents -benchtime 1x -timeout 20m ./cmd/npagent/
func BenchmarkEndToEndTwoAgents(b *testing.B) {
	b.Run("1000-objects", func(b *testing.B) { endToEndTwoAgents(b, false) })
	b.Run("1000-objects+10000-peer-object", func(b *testing.B) { endToEndTwoAgents(b, true) })
}

func endToEndTwoAgents(b *testing.B, withBig bool) {
	const (
		objects   = 1000
		bigPeers  = 10000
		writesPS  = 50
		podsEach  = 8
		nodeCount = 2
	)
	window := 30 * time.Second
	if s := os.Getenv("NPAGENT_E2E_WINDOW"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			b.Fatalf("NPAGENT_E2E_WINDOW: %v", err)
		}
		window = d
	}
	netlab.HostBPFFS(b)
	cp, kubeconfig, _ := startControlPlane(b)
	sink := newSpanSink(b)
	col := otlptest.StartCollector(b, sink.URL)
	pods := addLocalPods(b, nodeCount*podsEach)
	nodes := make([]*e2eNode, nodeCount)
	for i := range nodes {
		n := &e2eNode{name: fmt.Sprintf("e2e-node-%d", i), ip: fmt.Sprintf("192.0.2.%d", 20+i), pods: pods[i*podsEach : (i+1)*podsEach]}
		pin := fmt.Sprintf("/sys/fs/bpf/npagent-e2e-%d-%d", os.Getpid(), i)
		b.Cleanup(func() { _ = os.RemoveAll(pin) })
		n.agent = startAgentEnv(b, otlpEnv(col), kubeconfig, filepath.Join(b.TempDir(), "seen.state"),
			"--node-name="+n.name, "--node-ip="+n.ip, "--dataplane=ebpf", "--bpffs-path="+pin,
			"--resync-period=10m", "--log-level=info")
		nodes[i] = n
	}
	for _, n := range nodes {
		testenv.Eventually(b, 60*time.Second, n.name+" /readyz 200", func() bool { code, _ := n.agent.get(b, "/readyz"); return code == http.StatusOK })
	}

	ctx := context.Background()
	c := cp.Client
	rng := rand.New(rand.NewPCG(12, 34))
	// The writers keep each object as their last write returned it: an update
	// needs no read first (each object has one writer).
	pes := make([]*v1alpha1.PolicyEndpoint, objects)
	b.Logf("creating %d PolicyEndpoints and one of %d peers", objects, bigPeers)
	for i := range pes {
		n := nodes[i%nodeCount]
		peers := make([]string, 1+rng.IntN(8))
		for j := range peers {
			peers[j] = peerIP(rng.IntN(bigPeers))
		}
		pes[i] = controllerPE(fmt.Sprintf("pe-%d", i), n.ip, n.pods[i/nodeCount%podsEach].ip, peers, time.Now())
		if err := c.Create(ctx, pes[i]); err != nil {
			b.Fatal(err)
		}
	}
	bigPeerList := make([]string, bigPeers)
	for i := range bigPeerList {
		bigPeerList[i] = peerIP(i)
	}
	big := controllerPE("big", nodes[0].ip, nodes[0].pods[0].ip, bigPeerList, time.Now())
	big.Spec.PodSelectorEndpoints = append(big.Spec.PodSelectorEndpoints,
		v1alpha1.PodEndpoint{HostIP: v1alpha1.NetworkAddress(nodes[1].ip), PodIP: v1alpha1.NetworkAddress(nodes[1].pods[0].ip), Name: "big-pod-1", Namespace: "default"})
	if withBig {
		if err := c.Create(ctx, big); err != nil {
			b.Fatal(err)
		}
	}
	// Settle: every agent has programmed what was created.
	time.Sleep(5 * time.Second)

	type write struct {
		uid, trigger string
		took         time.Duration // the Update call, trigger stamp to response
	}
	var (
		mu              sync.Mutex
		writes, bigWrts []write
	)
	// update stamps pe with a new trigger after change and writes it; the write
	// is recorded in *to.
	update := func(pe *v1alpha1.PolicyEndpoint, to *[]write, change func(*v1alpha1.PolicyEndpoint)) error {
		change(pe)
		at := time.Now()
		trig := at.UTC().Format(time.RFC3339Nano)
		pe.Annotations[v1alpha1.AnnotationLastChangeTriggerTime] = trig
		if err := c.Update(ctx, pe); err != nil {
			return fmt.Errorf("update %s: %w", pe.Name, err)
		}
		took := time.Since(at)
		mu.Lock()
		*to = append(*to, write{string(pe.UID), trig, took})
		mu.Unlock()
		return nil
	}
	for b.Loop() {
		writes, bigWrts = nil, nil
		start := time.Now()
		stop := start.Add(window)
		g, _ := errgroup.WithContext(ctx)
		g.Go(func() error { // the large object: one peer more, then one fewer, once a second
			for k := 0; withBig && time.Now().Before(stop); k++ {
				err := update(big, &bigWrts, func(pe *v1alpha1.PolicyEndpoint) {
					if k%2 == 0 {
						pe.Spec.Ingress = append(pe.Spec.Ingress, pe.Spec.Ingress[0])
						pe.Spec.Ingress[len(pe.Spec.Ingress)-1].CIDR = v1alpha1.NetworkAddress(peerIP(bigPeers + k))
					} else {
						pe.Spec.Ingress = pe.Spec.Ingress[:len(pe.Spec.Ingress)-1]
					}
				})
				if err != nil {
					return err
				}
				time.Sleep(time.Until(start.Add(time.Duration(k+1) * time.Second)))
			}
			return nil
		})
		// The others: 50 writes/s from writers that each own a share of the
		// objects, one peer replaced in a random object of theirs per write.
		const writers = 5
		for w := range writers {
			wrng := rand.New(rand.NewPCG(uint64(w), 56))
			g.Go(func() error {
				tick := time.NewTicker(writers * time.Second / writesPS)
				defer tick.Stop()
				for time.Now().Before(stop) {
					<-tick.C
					pe := pes[w+writers*wrng.IntN(objects/writers)]
					err := update(pe, &writes, func(pe *v1alpha1.PolicyEndpoint) {
						pe.Spec.Ingress[wrng.IntN(len(pe.Spec.Ingress))].CIDR = v1alpha1.NetworkAddress(peerIP(wrng.IntN(bigPeers)))
					})
					if err != nil {
						return err
					}
				}
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			b.Fatal(err)
		}
		// Every trigger written reaches the sink (exported within a few seconds).
		key := func(w write) string { return w.uid + " " + w.trigger }
		want := map[string]bool{}
		isBig := map[string]bool{}
		for _, w := range writes {
			want[key(w)] = true
		}
		for _, w := range bigWrts {
			want[key(w)] = true
			isBig[key(w)] = true
		}
		var reports []programReport
		testenv.Eventually(b, 60*time.Second, "every trigger written in the window reported", func() bool {
			reports = reports[:0]
			seen := map[string]bool{}
			var big int
			for _, r := range sink.snapshot() {
				if k := r.key(); want[k] {
					seen[k] = true
					reports = append(reports, r)
					if isBig[k] {
						big++
					}
				}
			}
			// The large object selects a pod on each node: two reports per trigger.
			return len(seen) == len(want) && big == 2*len(bigWrts)
		})
		// Each report's latency, and npagent's own part of it: from the event's
		// arrival to the commit (the latency less its delivery span, which is the
		// apiserver storing the write and the watch bringing it).
		var all, own, bigLat, bigOwn []float64
		phases := map[string]time.Duration{}
		for _, r := range reports {
			ph := sink.phasesOf(r.trace)
			o := r.latency - ph["delivery"].Seconds()
			all, own = append(all, r.latency), append(own, o)
			if isBig[r.key()] {
				bigLat, bigOwn = append(bigLat, r.latency), append(bigOwn, o)
				for name, d := range ph {
					phases[name] += d
				}
			}
		}
		for _, xs := range [][]float64{all, own, bigLat, bigOwn} {
			slices.Sort(xs)
		}
		q := func(xs []float64, p float64) float64 {
			if len(xs) == 0 {
				return 0
			}
			return xs[min(len(xs)-1, int(p*float64(len(xs))))] * 1e3
		}
		b.ReportMetric(q(all, 0.50), "p50-ms")
		b.ReportMetric(q(all, 0.99), "p99-ms")
		b.ReportMetric(q(own, 0.99), "npagent-p99-ms")
		b.ReportMetric(float64(len(writes))/window.Seconds(), "writes/s")
		var tookAll, tookBig []float64
		for _, w := range writes {
			tookAll = append(tookAll, w.took.Seconds())
		}
		for _, w := range bigWrts {
			tookBig = append(tookBig, w.took.Seconds())
		}
		slices.Sort(tookAll)
		slices.Sort(tookBig)
		b.Logf("%d reports of %d triggers: latency p50 %.2f ms, p90 %.2f ms, p99 %.2f ms, max %.2f ms; npagent's part (event to commit) p50 %.2f ms, p99 %.2f ms, max %.2f ms",
			len(all), len(want), q(all, 0.5), q(all, 0.9), q(all, 0.99), q(all, 1), q(own, 0.5), q(own, 0.99), q(own, 1))
		b.Logf("apiserver Update round trip (trigger stamp to response): p50 %.2f ms, p99 %.2f ms", q(tookAll, 0.5), q(tookAll, 0.99))
		if withBig {
			b.ReportMetric(q(bigLat, 0.50), "big-p50-ms")
			b.ReportMetric(q(bigOwn, 1), "big-npagent-max-ms")
			b.ReportMetric(q(tookBig, 0.5), "big-update-p50-ms")
			var parts []string
			for _, name := range slices.Sorted(maps.Keys(phases)) {
				parts = append(parts, fmt.Sprintf("%s %.1f ms", name, float64(phases[name].Microseconds())/1e3/float64(len(bigLat))))
			}
			b.Logf("large object (%d triggers, two reports each): latency p50 %.2f ms, max %.2f ms; npagent's part p50 %.2f ms, max %.2f ms; its Update round trip p50 %.2f ms, max %.2f ms; mean spans per report: %s",
				len(bigWrts), q(bigLat, 0.5), q(bigLat, 1), q(bigOwn, 0.5), q(bigOwn, 1), q(tookBig, 0.5), q(tookBig, 1), strings.Join(parts, ", "))
		}
	}
	for _, n := range nodes {
		if errs := strings.Count(n.agent.logs(), `"level":"ERROR"`); errs > 0 {
			b.Errorf("%s logged %d errors:\n%s", n.name, errs, lastLines(n.agent.logs(), 20))
		}
	}
}
