package reconcile

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/kubewatch"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/testenv"
	"github.com/npagent/npagent/internal/testenv/fixture"
)

// memPE is a PolicyEndpoint shaped like the AWS controller's for a mid-size policy,
// about 1.5 KB as JSON: the pods it selects (podSelectorEndpoints), and its peers as
// bare /32 addresses with the policy's ports. local: its first pod runs on benchNode.
func memPE(i int, local bool) *v1alpha1.PolicyEndpoint {
	pe := &v1alpha1.PolicyEndpoint{
		ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: fmt.Sprintf("np-%05d-x7k2q", i)},
		Spec: v1alpha1.PolicyEndpointSpec{
			PolicyRef:    v1alpha1.PolicyReference{Name: fmt.Sprintf("np-%05d", i), Namespace: "bench"},
			PodSelector:  &metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app-%d", i%50)}},
			PodIsolation: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
		},
	}
	for j := range 3 {
		host := "192.0.2.99"
		if local && j == 0 {
			host = benchNode
		}
		pe.Spec.PodSelectorEndpoints = append(pe.Spec.PodSelectorEndpoints, v1alpha1.PodEndpoint{
			HostIP: v1alpha1.NetworkAddress(host), PodIP: v1alpha1.NetworkAddress(fmt.Sprintf("10.%d.%d.%d", 60+j, i/250%250, i%250+1)),
			Name: fmt.Sprintf("app-%d-7d9f8c6b5-%05d", i%50, j), Namespace: "bench",
		})
	}
	ports := []v1alpha1.Port{{Protocol: ptr(corev1.ProtocolTCP), Port: ptr[int32](8080)}}
	for j := range 10 {
		pe.Spec.Ingress = append(pe.Spec.Ingress, v1alpha1.EndpointInfo{
			CIDR: v1alpha1.NetworkAddress(fmt.Sprintf("10.%d.%d.%d", 100+j, i/250%250, i%250+1)), Ports: ports,
		})
	}
	for j := range 3 {
		pe.Spec.Egress = append(pe.Spec.Egress, v1alpha1.EndpointInfo{
			CIDR: v1alpha1.NetworkAddress(fmt.Sprintf("10.%d.%d.%d", 120+j, i/250%250, i%250+1)), Ports: ports,
		})
	}
	return pe
}

// agentHeapProfile, when set, is where BenchmarkNodeLocalMemory10k and 50k write a heap
// profile of the synced agent (go tool pprof -sample_index=inuse_space).
var agentHeapProfile = flag.String("agentheapprofile", "", "write a heap profile of BenchmarkNodeLocalMemory*'s synced agent to this file")

func writeAgentHeapProfile(b *testing.B) {
	if *agentHeapProfile == "" {
		return
	}
	f, err := os.Create(*agentHeapProfile)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := pprof.WriteHeapProfile(f); err != nil {
		b.Fatal(err)
	}
}

// liveHeap is the heap in use by live objects, after two collections.
func liveHeap() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// rss is the process's resident set (VmRSS), after returning freed memory to the OS.
func rss(b *testing.B) int64 {
	debug.FreeOSMemory()
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(string(status)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return int64(kb) << 10
		}
	}
	b.Fatal("no VmRSS in /proc/self/status")
	return 0
}

// BenchmarkNodeLocalMemory10k is the agent's memory with 10,000 PolicyEndpoints of
// about 1.5 KB in the cluster (real apiserver), 1 % of them selecting a pod on this
// node, against the informer cache's own: first a plain client-go informer holding
// the same objects (client-go's ListWatch, the same managedFields-dropping transform)
// is synced and measured, then dropped; then the whole agent (informers, pod table,
// version table, seen-set with a state file, last valid versions, explain log) is
// started, synced and measured, and measured again after an in-place relist, with the
// process's peak heap and RSS while the relist ran (absolute: for the chart's memory
// limit, docs/explanation/scale.md). The rest are live heap after GC, as a delta over
// the process before; RSS deltas are reported too (after FreeOSMemory; coarser: the Go
// runtime keeps some freed pages). The state file and last valid versions go to
// $TMPDIR (ext4 here, a real disk).
func BenchmarkNodeLocalMemory10k(b *testing.B) { benchNodeLocalMemory(b, 10000) }

// BenchmarkNodeLocalMemory50k is BenchmarkNodeLocalMemory10k with 50,000 objects.
func BenchmarkNodeLocalMemory50k(b *testing.B) { benchNodeLocalMemory(b, 50000) }

func benchNodeLocalMemory(b *testing.B, n int) {
	const every = 100     // every 100th object has a local pod
	objects := float64(n) // for the per-object metrics; n for counts
	cp := testenv.Start(b)
	resolver := createMemPEs(b, cp, n, every)
	sample := memPE(1, false)
	sample.TypeMeta = metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: "PolicyEndpoint"}
	sample.UID, sample.ResourceVersion, sample.Generation = "00000000-0000-4000-8000-000000000001", "123456", 1
	sample.CreationTimestamp = metav1.Now()
	encoded, err := json.Marshal(sample)
	if err != nil {
		b.Fatal(err)
	}

	for b.Loop() {
		// (a) The informer cache's own size: a plain client-go informer.
		cacheHeap, cacheRSS := plainInformerMemory(b, cp, n)

		// (b) The whole agent after its initial sync.
		dir := b.TempDir()
		heap1, rss1 := liveHeap(), rss(b)
		// The start's peaks, measured as the relist's below: with the relist paged, the
		// start may be the larger (the chart's limit must cover both).
		startPeak := startPeakSampler(b)
		a := startAgent(b, cp, agentOptions{nodeIP: benchNode, dp: bpfmaps.NewMemory(), resolver: resolver,
			state: filepath.Join(dir, "seen.state"), lastValid: filepath.Join(dir, "lastvalid")})
		testenv.Eventually(b, 5*time.Minute, "agent's initial sync of every object", func() bool {
			s := a.c.Stats()
			return s.Delivered(report.KindPolicyEndpoint, report.CauseAdd) == uint64(n) && a.c.queue.Len() == 0 && s.Syncs >= uint64(n)
		})
		time.Sleep(time.Second) // retries and persists settle
		startPeakHeap, startPeakRSS := startPeak.stop()
		agentHeap, agentRSS := liveHeap()-heap1, rss(b)-rss1
		writeAgentHeapProfile(b)
		objs, pods, _ := a.c.pods.size()
		if pods != n/every {
			b.Errorf("agent programmed %d pods, want %d", pods, n/every)
		}
		b.Logf("object %d B as JSON; informer %d KB heap, %d KB RSS; agent %d KB heap, %d KB RSS (%d objects, %d pods)",
			len(encoded), cacheHeap>>10, cacheRSS>>10, agentHeap>>10, agentRSS>>10, objs, pods)
		b.ReportMetric(float64(len(encoded)), "object-B")
		b.ReportMetric(float64(cacheHeap)/objects, "informer-heap-B/object")
		b.ReportMetric(float64(agentHeap)/objects, "agent-heap-B/object")
		b.ReportMetric(float64(agentHeap)/float64(cacheHeap), "heap-ratio")
		b.ReportMetric(float64(cacheRSS)/objects, "informer-rss-B/object")
		b.ReportMetric(float64(agentRSS)/objects, "agent-rss-B/object")
		b.ReportMetric(float64(startPeakHeap)/(1<<20), "start-peak-heap-MB")
		b.ReportMetric(float64(startPeakRSS)/(1<<20), "start-peak-rss-MB")

		// (c) The same after an in-place relist of the unchanged objects (the apiserver
		// restarts; the ListWatch lists again after 410): nothing the relist decoded
		// may stay alive beside the cache.
		// Its peaks are the process's: VmHWM (reset first) and the heap sampled every
		// 5 ms while the relist runs, both absolute (the test binary's own included).
		steadyRSS := rss(b)
		before, relists := a.c.Stats(), relistsBegun(a.c)
		peak := startPeakSampler(b)
		cp.RestartAPIServer(b)
		testenv.Eventually(b, 5*time.Minute, "relist of every object", func() bool {
			return relistsBegun(a.c) > relists &&
				a.c.Stats().Delivered(report.KindPolicyEndpoint, report.CauseRelist)-before.Delivered(report.KindPolicyEndpoint, report.CauseRelist) >= uint64(n)
		})
		time.Sleep(time.Second)
		peakHeap, peakRSS := peak.stop()
		relistHeap := liveHeap() - heap1
		b.Logf("after a relist: agent %d KB heap; during it: peak heap %d MB, peak RSS %d MB (steady RSS %d MB)",
			relistHeap>>10, peakHeap>>20, peakRSS>>20, steadyRSS>>20)
		b.ReportMetric(float64(relistHeap)/objects, "agent-heap-after-relist-B/object")
		b.ReportMetric(float64(steadyRSS)/(1<<20), "steady-rss-MB")
		b.ReportMetric(float64(peakHeap)/(1<<20), "relist-peak-heap-MB")
		b.ReportMetric(float64(peakRSS)/(1<<20), "relist-peak-rss-MB")
		runtime.KeepAlive(a)
		a.stop()
	}
}

// plainInformerMemory syncs a plain client-go informer of PolicyEndpoints (client-go's
// ListWatch; a transform dropping managedFields, as the agent's) and returns its live
// heap and RSS once synced, over the process's before it started. It is stopped after.
func plainInformerMemory(b *testing.B, cp *testenv.ControlPlane, objects int) (heap, resident int64) {
	heap0, rss0 := liveHeap(), rss(b)
	scheme := kruntime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		b.Fatal(err)
	}
	rc, err := kubewatch.NewRESTClient(cp.Config, scheme, v1alpha1.SchemeGroupVersion)
	if err != nil {
		b.Fatal(err)
	}
	inf := cache.NewSharedIndexInformer(cache.NewListWatchFromClient(rc, v1alpha1.ResourcePolicyEndpoints, metav1.NamespaceAll, fields.Everything()),
		&v1alpha1.PolicyEndpoint{}, 0, cache.Indexers{})
	if err := inf.SetTransform(func(obj any) (any, error) {
		if m, err := meta.Accessor(obj); err == nil {
			m.SetManagedFields(nil)
		}
		return obj, nil
	}); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go inf.Run(ctx.Done())
	testenv.Eventually(b, 5*time.Minute, "plain informer synced", func() bool {
		return inf.HasSynced() && len(inf.GetStore().ListKeys()) == objects
	})
	heap, resident = liveHeap()-heap0, rss(b)-rss0
	runtime.KeepAlive(inf)
	return heap, resident
}

// peakSampler follows the process's peak heap (sampled) and resident set (VmHWM).
type peakSampler struct {
	b    *testing.B
	done chan struct{}
	heap chan int64
}

// startPeakSampler resets the kernel's VmHWM (clear_refs 5) and samples the heap in
// use every 5 ms until stop.
func startPeakSampler(b *testing.B) *peakSampler {
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		b.Fatalf("reset VmHWM: %v", err)
	}
	p := &peakSampler{b: b, done: make(chan struct{}), heap: make(chan int64, 1)}
	go func() {
		sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		var peak int64
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			metrics.Read(sample)
			peak = max(peak, int64(sample[0].Value.Uint64()))
			select {
			case <-p.done:
				p.heap <- peak
				return
			case <-t.C:
			}
		}
	}()
	return p
}

// stop returns the peak heap sampled and the peak resident set since the start.
func (p *peakSampler) stop() (heap, resident int64) {
	close(p.done)
	return <-p.heap, procStatusKB(p.b, "VmHWM:") << 10
}

// procStatusKB reads one kB field of /proc/self/status.
func procStatusKB(b *testing.B, field string) int64 {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(string(status)) {
		if rest, ok := strings.CutPrefix(line, field); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb
		}
	}
	b.Fatalf("no %s in /proc/self/status", field)
	return 0
}

// createMemPEs creates n memPE objects in namespace bench, every every-th one with a
// pod on benchNode, and returns a resolver that knows those pods' interfaces.
func createMemPEs(b *testing.B, cp *testenv.ControlPlane, n, every int) *lookupTableResolver {
	return createMemPEsIn(b, cp, n, every, 1)
}

// createMemPEsIn is createMemPEs over namespaces namespaces (bench-000, bench-001, …)
// when more than one, object i in namespace i mod namespaces.
func createMemPEsIn(b *testing.B, cp *testenv.ControlPlane, n, every, namespaces int) *lookupTableResolver {
	nsOf := func(i int) string {
		if namespaces <= 1 {
			return "bench"
		}
		// Object i's namespace is (i + i/every) mod namespaces: each namespace holds
		// its share of the objects and the objects with a pod here are spread over
		// them as evenly (object k*every in namespace k mod namespaces), as on a
		// cluster, where a node's pods are not all in the first namespace listed.
		return fmt.Sprintf("bench-%03d", (i+i/every)%namespaces)
	}
	for i := range max(namespaces, 1) {
		createNamespace(b, cp, nsOf(i))
	}
	resolver := newLookupTableResolver()
	testenv.CreateEach(b, cp.Client, n, func(i int) client.Object {
		pe := fixture.InNamespace(memPE(i, i%every == 0), nsOf(i))
		if i%every == 0 {
			resolver.set(string(pe.Spec.PodSelectorEndpoints[0].PodIP), 1000+i)
		}
		return pe
	})
	return resolver
}
