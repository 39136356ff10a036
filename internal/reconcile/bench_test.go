package reconcile

import (
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/podif"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/seen"
	"github.com/npagent/npagent/internal/testenv"
	"github.com/npagent/npagent/internal/testenv/fixture"
	"github.com/npagent/npagent/internal/testenv/netlab"
)

const benchNode = fixture.BenchNode

// benchPE is fixture.BenchPE: the objects kubewatch's list benchmarks decode too.
func benchPE(i int, localPods int) *v1alpha1.PolicyEndpoint { return fixture.BenchPE(i, localPods) }

// offlineController builds a Controller whose informers never run: benchmarks feed its
// caches and handlers directly. The REST config points nowhere; New dials nothing.
func offlineController(tb testing.TB, dp bpfmaps.Dataplane, resolver podif.Resolver, sink report.Sink) *Controller {
	tb.Helper()
	set, _ := seen.New(time.Now().Add(-time.Hour))
	c, err := New(&rest.Config{Host: "https://127.0.0.1:1"}, Config{
		NodeIP: netip.MustParseAddr(benchNode), Dataplane: dp, Seen: set, Resolver: resolver, Sink: sink, Logger: testLogger(tb),
	})
	if err != nil {
		tb.Fatal(err)
	}
	// Objects fed to the handlers come after the (empty) initial list: a uid seen first
	// is a new object, as in a running agent.
	c.versions.synced.Store(true)
	return c
}

// BenchmarkRedelivery is npagent's own cost per re-delivered, unchanged object, on
// objects client-go already decoded: a resync's OnUpdate, and a relist's re-delivery
// as kubewatch reports it (relistObserver: version-table mark, seen-set answer, counting). Compare with BenchmarkDecodeList, client-go's
// cost of decoding each object of a list.
func BenchmarkRedelivery(b *testing.B) {
	const objects = 10000
	c := offlineController(b, bpfmaps.NewMemory(), newLookupTableResolver(), nil)
	pes := make([]*v1alpha1.PolicyEndpoint, objects)
	store := c.informers[report.KindPolicyEndpoint].GetIndexer()
	h := c.handler(report.KindPolicyEndpoint)
	for i := range pes {
		pes[i] = benchPE(i, 100)
		if err := store.Add(pes[i]); err != nil {
			b.Fatal(err)
		}
		h.OnAdd(pes[i], true) // observed once: later deliveries are redelivered
	}
	accepted := c.cfg.Seen.Stats().Accepted
	b.Run("resync", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			pe := pes[i%objects]
			h.OnUpdate(pe, pe)
			i++
		}
	})
	b.Run("relist", func(b *testing.B) {
		relisted := relistObserver{c, report.KindPolicyEndpoint}
		c.relists[report.KindPolicyEndpoint].begin()
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if i%objects == 0 {
				c.relists[report.KindPolicyEndpoint].begin() // a new relist every 10,000 objects
			}
			relisted.Unchanged(pes[i%objects])
			i++
		}
	})
	if st := c.cfg.Seen.Stats(); st.Accepted != accepted {
		b.Fatalf("%d re-deliveries were accepted", st.Accepted-accepted)
	}
}

// BenchmarkDecodeList is client-go's side of a relist: decoding a PolicyEndpointList
// response (JSON, as custom resources are served) with the scheme's codec. Reported
// per object, to set next to BenchmarkRedelivery.
func BenchmarkDecodeList(b *testing.B) {
	const objects = 1000
	list := &v1alpha1.PolicyEndpointList{TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: "PolicyEndpointList"}}
	for i := range objects {
		list.Items = append(list.Items, *benchPE(i, 100))
	}
	data, err := json.Marshal(list)
	if err != nil {
		b.Fatal(err)
	}
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		b.Fatal(err)
	}
	decoder := serializer.NewCodecFactory(scheme).UniversalDeserializer()
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		obj, _, err := decoder.Decode(data, nil, nil)
		if err != nil {
			b.Fatal(err)
		}
		if n := len(obj.(*v1alpha1.PolicyEndpointList).Items); n != objects {
			b.Fatalf("decoded %d items", n)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*objects), "ns/object")
}

// BenchmarkSync is the worker's throughput for genuine updates: each iteration writes
// a new version of one of 100 objects (a changed port, a new resourceVersion) into the
// cache and syncs it — compile, merge the pod's 10 objects, commit. Each pod's policy
// changes, so every commit writes.
func BenchmarkSync(b *testing.B) {
	b.Run("memory", func(b *testing.B) {
		benchSync(b, bpfmaps.NewMemory(), nil)
	})
	b.Run("ebpf", func(b *testing.B) {
		benchSync(b, openBenchEBPF(b), benchInterfaces(b, "", 10))
	})
}

// openBenchEBPF opens the kernel dataplane under a temporary pin path, or skips.
func openBenchEBPF(b *testing.B) bpfmaps.Dataplane {
	b.Helper()
	if os.Geteuid() != 0 {
		b.Skip("needs root to load eBPF programs, pin maps under /sys/fs/bpf and create veth interfaces")
	}
	netlab.HostBPFFS(b)
	pin := filepath.Join("/sys/fs/bpf", fmt.Sprintf("npagent-reconcile-bench-%d", os.Getpid()))
	b.Cleanup(func() { _ = os.RemoveAll(pin) })
	dp, err := bpfmaps.OpenEBPF(bpfmaps.EBPFOptions{PinPath: pin})
	if err != nil {
		b.Skipf("eBPF dataplane unavailable: %v", err)
	}
	b.Cleanup(func() { _ = dp.Close() })
	return dp
}

// benchInterfaces creates n veth pairs (host ends in this namespace) for the eBPF
// dataplane to attach to, named with tag so several sets can coexist, and maps the
// bench objects' local pod IPs (10.60.0.1…) to them.
func benchInterfaces(b *testing.B, tag string, n int) *lookupTableResolver {
	b.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		b.Skip("needs the ip command (iproute2) to create veth interfaces")
	}
	r := newLookupTableResolver()
	for i := range n {
		name := fmt.Sprintf("nprb%d%s-%d", os.Getpid()%10000, tag, i)
		if out, err := exec.Command("ip", "link", "add", name, "type", "veth", "peer", "name", name+"p").CombinedOutput(); err != nil {
			b.Skipf("create veth %s: %v: %s", name, err, out)
		}
		b.Cleanup(func() { _ = exec.Command("ip", "link", "del", name).Run() })
		ifc, err := net.InterfaceByName(name)
		if err != nil {
			b.Fatal(err)
		}
		r.set(fmt.Sprintf("10.60.0.%d", i+1), ifc.Index)
	}
	return r
}

func benchSync(b *testing.B, dp bpfmaps.Dataplane, resolver podif.Resolver) {
	const objects, pods = 100, 10
	if resolver == nil {
		r := newLookupTableResolver()
		for i := range pods {
			r.set(fmt.Sprintf("10.60.0.%d", i+1), 100+i)
		}
		resolver = r
	}
	c := offlineController(b, dp, resolver, nil)
	store := c.informers[report.KindPolicyEndpoint].GetIndexer()
	pes := make([]*v1alpha1.PolicyEndpoint, objects)
	for i := range pes {
		pes[i] = benchPE(i, pods)
		if err := store.Add(pes[i]); err != nil {
			b.Fatal(err)
		}
		if c.sync(keyOf(report.KindPolicyEndpoint, pes[i]), time.Now()) != outcomeDone {
			b.Fatalf("initial sync of %s failed", pes[i].Name)
		}
	}
	before := c.Stats()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		pe := pes[i%objects].DeepCopy()
		pe.ResourceVersion = strconv.Itoa(100000 + i)
		pe.Spec.Ingress[0].Ports[0].Port = ptr(int32(1000 + i%20000))
		if err := store.Update(pe); err != nil {
			b.Fatal(err)
		}
		pes[i%objects] = pe
		if c.sync(keyOf(report.KindPolicyEndpoint, pe), time.Now()) != outcomeDone {
			b.Fatalf("sync of %s failed", pe.Name)
		}
		i++
	}
	s := c.Stats()
	if writes := s.DataplaneWrites() - before.DataplaneWrites(); writes < uint64(b.N) {
		b.Fatalf("%d dataplane writes for %d genuine updates", writes, b.N)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "updates/s")
}

// BenchmarkRelist10k is the whole relist on a real apiserver: 10,000 PolicyEndpoints
// (100 local pods among them) are programmed, then the apiserver restarts and the
// informer lists them all again. It reports the relist's wall time from its list
// request to the last re-delivery, this process's CPU per object over that window
// (transport, client-go's decode of the list, the informer's FIFO and store,
// npagent's transform and handlers), and checks that nothing was written or
// reported. Run with -benchtime=Nx: one iteration is one restart and one whole relist.
func BenchmarkRelist10k(b *testing.B) {
	const objects = 10000
	cp := testenv.Start(b)
	createNamespace(b, cp, "bench")
	resolver := newLookupTableResolver()
	for i := range 100 {
		resolver.set(fmt.Sprintf("10.60.%d.%d", i/250, i%250+1), 1000+i)
	}
	created := time.Now()
	testenv.CreateEach(b, cp.Client, objects, func(i int) client.Object {
		pe := benchPE(i, 100)
		pe.UID, pe.ResourceVersion = "", ""
		return pe
	})
	b.Logf("created %d PolicyEndpoints in %v", objects, time.Since(created).Round(time.Millisecond))

	mem := bpfmaps.NewMemory()
	start := time.Now()
	a := startAgent(b, cp, agentOptions{nodeIP: benchNode, dp: mem, resolver: resolver})
	testenv.Eventually(b, 5*time.Minute, "initial sync of every object", func() bool {
		s := a.c.Stats()
		return s.Delivered(report.KindPolicyEndpoint, report.CauseAdd) == objects && a.c.queue.Len() == 0 && s.Syncs >= objects
	})
	b.Logf("initial list and sync of %d objects: %v, %d dataplane writes", objects, time.Since(start).Round(time.Millisecond), a.c.Stats().DataplaneWrites())

	iteration := 0
	var cpuSum, wallSum time.Duration
	for b.Loop() {
		before := a.c.Stats()
		relistsBefore := relistsBegun(a.c)
		cp.RestartAPIServer(b)
		restarted := time.Now()
		// The ListWatch reopens its watch while the apiserver comes back; the restarted
		// apiserver answers the old resourceVersion with 410 and the ListWatch lists
		// again. Time the relist from the moment it begins (its list request: the
		// decode of the list is part of its cost) to the last re-delivery.
		for relistsBegun(a.c) == relistsBefore {
			if time.Since(restarted) > 5*time.Minute {
				b.Fatal("timed out waiting for the relist to begin")
			}
			time.Sleep(time.Millisecond)
		}
		first, cpu0 := time.Now(), cpuTime()
		stopProfile := startRelistProfile(b, iteration)
		iteration++
		relisted := func() uint64 {
			return a.c.Stats().Delivered(report.KindPolicyEndpoint, report.CauseRelist) - before.Delivered(report.KindPolicyEndpoint, report.CauseRelist)
		}
		testenv.Eventually(b, 5*time.Minute, "relist of every object", func() bool { return relisted() >= objects })
		wall, cpu := time.Since(first), cpuTime()-cpu0
		stopProfile()
		b.Logf("relist began %v after the restart; %d objects re-delivered in %v, %v CPU",
			first.Sub(restarted).Round(time.Millisecond), relisted(), wall.Round(time.Millisecond), cpu.Round(time.Millisecond))
		time.Sleep(500 * time.Millisecond) // anything the relist queued runs now
		s := a.c.Stats()
		if w := s.DataplaneWrites() - before.DataplaneWrites(); w != 0 {
			b.Errorf("relist wrote to the dataplane %d times", w)
		}
		if r := s.Reports - before.Reports; r != 0 {
			b.Errorf("relist produced %d reports", r)
		}
		cpuSum += cpu
		wallSum += wall
		b.ReportMetric(float64(s.DataplaneWrites()-before.DataplaneWrites()), "dataplane-writes")
		b.ReportMetric(float64(s.Syncs-before.Syncs), "syncs")
	}
	// Means over the iterations (ReportMetric keeps the last value it is given).
	b.ReportMetric(wallSum.Seconds()/float64(iteration), "relist-s")
	b.ReportMetric(float64(cpuSum.Nanoseconds())/float64(iteration*objects), "cpu-ns/object")
}

// relistProfile, when set, is where BenchmarkRelist10k writes a CPU profile of each
// relist alone (FILE.0, FILE.1, … one per iteration; go tool pprof merges them): from
// its list request to the last re-delivery. go test's -cpuprofile would also hold the
// creation of the objects, the initial list and the apiserver's restart.
var relistProfile = flag.String("relistprofile", "", "write a CPU profile of BenchmarkRelist10k's relist window to this file")

// startRelistProfile starts the relist window's CPU profile, if asked; the returned
// func stops it.
func startRelistProfile(b *testing.B, iteration int) func() {
	b.Helper()
	if *relistProfile == "" {
		return func() {}
	}
	f, err := os.Create(fmt.Sprintf("%s.%d", *relistProfile, iteration))
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			b.Error(err)
		}
	}
}

// relistsBegun is how many relists the PolicyEndpoint ListWatch has begun.
func relistsBegun(c *Controller) uint64 {
	var n uint64
	for _, r := range c.watch[report.KindPolicyEndpoint].Snapshot(time.Now(), 0).Relists {
		n += r
	}
	return n
}

// cpuTime is this process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
