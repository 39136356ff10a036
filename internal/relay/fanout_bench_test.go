package relay

import (
	"bufio"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/npagent/npagent/api/v1alpha1"
)

// benchRelay is a Relay with no upstream: its feeds are fed by the benchmark, its
// nodes and token reviews filled in, so what is measured is the fan-out alone.
func benchRelay(b *testing.B, nodes int, window int) (*Relay, []string) {
	b.Helper()
	r := &Relay{cfg: Config{BookmarkInterval: time.Hour, SyncWait: time.Second}, feeds: map[string]*feed{}, nodes: newNodeAddrs(),
		auth: newReviewer(nil, time.Hour)}
	gv := v1alpha1.SchemeGroupVersion
	r.pe = newFeed(v1alpha1.ResourcePolicyEndpoints, gv.WithKind("PolicyEndpoint"), true, window)
	r.feeds[v1alpha1.ResourcePolicyEndpoints] = r.pe
	r.pe.endReset(1)
	r.nodesSynced.Store(true)
	var tokens []string
	for i := range nodes {
		name := fmt.Sprintf("node-%d", i)
		tok := "token-" + name
		tokens = append(tokens, tok)
		r.nodes.nodes[name] = nodeEntry{addrs: []netip.Addr{nodeIP(i)}}
		r.auth.cache[sha256.Sum256([]byte(tok))] = &review{expires: time.Now().Add(time.Hour), node: name,
			user: authenticationv1.UserInfo{Username: name}, allowed: map[string]*apierrors.StatusError{"watch/policyendpoints": nil}}
	}
	return r, tokens
}

func nodeIP(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 255, byte(i >> 8), byte(i)}) }

// benchPE is a PolicyEndpoint as the controller writes them: ten pods (or one on
// each host given, if more: about 1.7 KB with ten), three ingress rules.
func benchPE(name string, rv int, hosts ...netip.Addr) *v1alpha1.PolicyEndpoint {
	p := pe("bench", name, name, "10.0.0.0/8", 80)
	p.ResourceVersion = strconv.Itoa(rv)
	p.UID = types.UID("00000000-0000-0000-0000-" + fmt.Sprintf("%012d", len(name)))
	p.Annotations = map[string]string{v1alpha1.AnnotationLastChangeTriggerTime: "2026-12-05T10:00:00.123456789Z"}
	for i := range max(10, len(hosts)) {
		h := hosts[i%len(hosts)]
		p.Spec.PodSelectorEndpoints = append(p.Spec.PodSelectorEndpoints, v1alpha1.PodEndpoint{HostIP: v1alpha1.NetworkAddress(h.String()),
			PodIP: v1alpha1.NetworkAddress(fmt.Sprintf("10.%d.%d.%d", i, rv%250, 7)), Name: fmt.Sprintf("web-7f9c8d6b5-%05d", i), Namespace: "bench"})
	}
	for i := range 3 {
		p.Spec.Ingress = append(p.Spec.Ingress, v1alpha1.EndpointInfo{CIDR: v1alpha1.NetworkAddress(fmt.Sprintf("10.%d.0.0/16", 100+i)),
			Ports: []v1alpha1.Port{{Port: ptr(int32(8000 + i))}}})
	}
	return p
}

// BenchmarkFanOut is the relay's cost per event and watcher: 40 agents watch over
// HTTP (loopback, no TLS), and each event is one PolicyEndpoint written. "all": the
// object has pods on every node, each watcher gets it (ns and bytes per
// watcher-event; the object has 40 pods, ~4.6 KB); "one": it has pods on one node
// (~1.7 KB), the other 39 watchers filter it out (ns per event).
func BenchmarkFanOut(b *testing.B) {
	const watchers = 40
	for _, tc := range []struct {
		name    string
		hosts   func(i int) []netip.Addr
		receive int // watchers that get each event
	}{
		{"all", func(int) []netip.Addr {
			var out []netip.Addr
			for n := range watchers {
				out = append(out, nodeIP(n))
			}
			return out
		}, watchers},
		{"one", func(i int) []netip.Addr { return []netip.Addr{nodeIP(i % watchers)} }, 1},
	} {
		b.Run(tc.name, func(b *testing.B) {
			r, tokens := benchRelay(b, watchers, b.N+16)
			srv := httptest.NewServer(r.Handler())
			defer func() { srv.CloseClientConnections(); srv.Close() }()
			var lines, bytes atomic.Int64
			var wg sync.WaitGroup
			bodies := make([]io.Closer, 0, watchers)
			for _, tok := range tokens {
				req, _ := http.NewRequest(http.MethodGet, srv.URL+apiPrefix+"policyendpoints?watch=1&resourceVersion=1", nil)
				req.Header.Set("Authorization", "Bearer "+tok)
				resp, err := http.DefaultClient.Do(req)
				if err != nil || resp.StatusCode != http.StatusOK {
					b.Fatalf("watch: %v %v", err, resp)
				}
				bodies = append(bodies, resp.Body)
				wg.Go(func() {
					s := bufio.NewScanner(resp.Body)
					s.Buffer(make([]byte, 64<<10), 1<<20)
					for s.Scan() {
						lines.Add(1)
						bytes.Add(int64(len(s.Bytes()) + 1))
					}
				})
			}
			objs := make([]*v1alpha1.PolicyEndpoint, b.N)
			for i := range objs {
				objs[i] = benchPE(fmt.Sprintf("pe-%d", i%1000), 2+i, tc.hosts(i)...)
			}
			want := int64(b.N * tc.receive)
			b.ReportAllocs()
			b.ResetTimer()
			t0 := time.Now()
			for i := range objs {
				if err := r.pe.ingest(watch.Modified, objs[i]); err != nil {
					b.Fatal(err)
				}
			}
			for lines.Load() < want {
				time.Sleep(100 * time.Microsecond)
				if time.Since(t0) > time.Minute {
					b.Fatalf("after a minute the watchers got %d events, want %d", lines.Load(), want)
				}
			}
			b.StopTimer()
			for _, body := range bodies {
				body.Close()
			}
			wg.Wait()
			if tc.receive == watchers {
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(want), "ns/watcher-event")
			}
			b.ReportMetric(float64(bytes.Load())/float64(want), "B-sent/watcher-event")
		})
	}
}
