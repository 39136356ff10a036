package main

// Helpers of the fault tests (faults_test.go): the profile, a TCP proxy that cuts the
// agent off its apiserver, local pods, a real OpenTelemetry Collector in front of an
// OTLP sink inside the test, a writer that records every trigger it stamps, and the
// agent's resident memory.

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/encoding/protodelim"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vishvananda/netlink"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/testenv"
	"github.com/npagent/npagent/internal/testenv/otlptest"
	"github.com/npagent/npagent/internal/testenv/skip"
)

// EnvE2E selects the full profile of the fault tests (make e2e-full); unset, they run
// the short one (make test).
const EnvE2E = "NPAGENT_E2E"

// faultProfile is how hard the fault tests push.
type faultProfile struct {
	name   string
	kills  int           // SIGKILLs mid-churn (TestFaultSIGKILLMidChurn)
	outage time.Duration // collector down (TestFaultCollectorOutage)
	window time.Duration // latency windows with the collector up, before and after
	// shutdown is the agent's --shutdown-timeout for the SIGTERM during an
	// outage: zero leaves the default (10s).
	shutdown time.Duration
	restart  bool // also restart the apiserver during the 410 gap
}

func profile(t *testing.T) faultProfile {
	p := faultProfile{name: "short", kills: 3, outage: 10 * time.Second, window: 6 * time.Second, shutdown: 3 * time.Second}
	if os.Getenv(EnvE2E) == "1" {
		p = faultProfile{name: "full", kills: 10, outage: 30 * time.Second, window: 30 * time.Second, restart: true}
	}
	t.Logf("fault profile %s (%s=1 selects the full one): %+v", p.name, EnvE2E, p)
	return p
}

// cutProxy forwards TCP to addr's target (TLS passes through, so the agent keeps
// the apiserver's credentials) until cut: then it stops listening and closes every
// open connection, so the agent's watches end and its retries are refused, as when
// the apiserver is down. restore listens on the same address again.
type cutProxy struct {
	t      *testing.T
	addr   string
	target string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]struct{}
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{t: t, addr: ln.Addr().String(), target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	go p.serve(ln)
	t.Cleanup(p.cut)
	return p
}

func (p *cutProxy) serve(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go p.forward(ln, c)
	}
}

func (p *cutProxy) forward(ln net.Listener, c net.Conn) {
	s, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	if p.ln != ln { // cut meanwhile
		p.mu.Unlock()
		c.Close()
		s.Close()
		return
	}
	p.conns[c], p.conns[s] = struct{}{}, struct{}{}
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { io.Copy(s, c); done <- struct{}{} }()
	go func() { io.Copy(c, s); done <- struct{}{} }()
	<-done
	c.Close()
	s.Close()
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, s)
	p.mu.Unlock()
}

// cut stops listening and closes every forwarded connection.
func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

// restore listens on the proxy's address again.
func (p *cutProxy) restore() {
	p.t.Helper()
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Fatalf("proxy: listen on %s again: %v", p.addr, err)
	}
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go p.serve(ln)
}

// proxiedKubeconfig writes a kubeconfig reaching cp's apiserver through a cutProxy.
func proxiedKubeconfig(t *testing.T, rc *rest.Config) (*cutProxy, string) {
	host := strings.TrimPrefix(rc.Host, "https://")
	host = strings.TrimSuffix(host, "/")
	p := newCutProxy(t, host)
	pc := rest.CopyConfig(rc)
	pc.Host = "https://" + p.addr
	kc := filepath.Join(t.TempDir(), "kubeconfig-proxied")
	testenv.WriteKubeconfig(t, pc, kc)
	return p, kc
}

// localPod is a pod on the agent's node: a host-side interface and a host route.
type localPod struct {
	ip      string
	ifname  string
	ifindex int
}

// addLocalPods adds n local pods as addLocalPod does (root: CAP_NET_ADMIN), with
// names and addresses derived from the test's pid and the index.
func addLocalPods(t testing.TB, n int) []localPod {
	t.Helper()
	if !skip.Root() {
		skip.Unmet(t, "needs root (CAP_NET_ADMIN) to add the interfaces and host routes of local pods for the route resolver")
	}
	pid := os.Getpid()
	pods := make([]localPod, n)
	for i := range pods {
		la := netlink.NewLinkAttrs()
		la.Name = fmt.Sprintf("npf%d-%d", pid%100000, i)
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: fmt.Sprintf("npg%d-%d", pid%100000, i)}); err != nil {
			t.Fatalf("add veth %s: %v", la.Name, err)
		}
		name := la.Name
		t.Cleanup(func() {
			if l, err := netlink.LinkByName(name); err == nil {
				netlink.LinkDel(l)
			}
		})
		link, err := netlink.LinkByName(name)
		if err != nil {
			t.Fatalf("link %s: %v", name, err)
		}
		if err := netlink.LinkSetUp(link); err != nil {
			t.Fatalf("set %s up: %v", name, err)
		}
		ip := net.IPv4(10, 251, byte(pid%250), byte(i+1))
		route := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: &net.IPNet{IP: ip, Mask: net.CIDRMask(32, 32)}, Scope: netlink.SCOPE_LINK}
		if err := netlink.RouteAdd(route); err != nil {
			t.Fatalf("add route %s dev %s: %v", route.Dst, name, err)
		}
		pods[i] = localPod{ip: ip.String(), ifname: name, ifindex: link.Attrs().Index}
	}
	return pods
}

// programReport is one policy.program root span as it reached the sink through the
// collector: one reported trigger.
type programReport struct {
	uid, name, trigger string
	trace              string // trace id, hex
	start, end         time.Time
	latency            float64 // the npagent.policy.programming.latency attribute, seconds
}

func (r programReport) key() string { return r.uid + " " + r.trigger }

// spanSink keeps the policy.program root spans (one reported trigger each) and
// the other spans' durations that a real collector delivered to an otlptest.Sink.
type spanSink struct {
	*otlptest.Sink

	mu      sync.Mutex
	reports []programReport
	spans   int
	// phases is every other span's duration by trace and span name: where a
	// report's time went.
	phases map[string]map[string]time.Duration
}

func newSpanSink(t testing.TB) *spanSink {
	s := &spanSink{phases: map[string]map[string]time.Duration{}}
	s.Sink = otlptest.NewSink(t, func(req *coltracepb.ExportTraceServiceRequest) {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, rs := range req.GetResourceSpans() {
			for _, ss := range rs.GetScopeSpans() {
				for _, sp := range ss.GetSpans() {
					s.spans++
					if sp.GetName() == "policy.program" {
						s.reports = append(s.reports, reportOf(sp))
						continue
					}
					trace := hex.EncodeToString(sp.GetTraceId())
					if s.phases[trace] == nil {
						s.phases[trace] = map[string]time.Duration{}
					}
					s.phases[trace][sp.GetName()] += time.Duration(sp.GetEndTimeUnixNano() - sp.GetStartTimeUnixNano())
				}
			}
		}
	}, nil)
	return s
}

func reportOf(sp *tracepb.Span) programReport {
	r := programReport{
		start: time.Unix(0, int64(sp.GetStartTimeUnixNano())),
		end:   time.Unix(0, int64(sp.GetEndTimeUnixNano())),
		trace: hex.EncodeToString(sp.GetTraceId()),
	}
	for _, kv := range sp.GetAttributes() {
		switch kv.GetKey() {
		case "npagent.policy.uid":
			r.uid = kv.GetValue().GetStringValue()
		case "npagent.policy.name":
			r.name = kv.GetValue().GetStringValue()
		case "npagent.policy.trigger_time":
			r.trigger = kv.GetValue().GetStringValue()
		case "npagent.policy.programming.latency":
			r.latency = kv.GetValue().GetDoubleValue()
		}
	}
	return r
}

func (s *spanSink) snapshot() []programReport {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.reports)
}

func otlpEnv(c *otlptest.Collector, extra ...string) []string {
	return append([]string{
		"OTEL_TRACES_EXPORTER=otlp", "OTEL_METRICS_EXPORTER=otlp",
		"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + c.GRPCAddr,
		"OTEL_BSP_SCHEDULE_DELAY=100",
	}, extra...)
}

// written is one trigger the test stamped and wrote.
type written struct {
	name, uid, trigger string
	at                 time.Time // when the write returned
	op                 string
}

// writer changes PolicyEndpoints through the real apiserver and records each
// trigger it writes.
type writer struct {
	t  *testing.T
	c  client.Client
	mu sync.Mutex
	w  []written
}

func stamp() (time.Time, string) {
	now := time.Now().UTC()
	return now, now.Format(time.RFC3339Nano)
}

func (w *writer) record(pe *v1alpha1.PolicyEndpoint, op string) written {
	rec := written{name: pe.Name, uid: string(pe.UID), trigger: pe.Annotations[v1alpha1.AnnotationLastChangeTriggerTime], at: time.Now(), op: op}
	w.mu.Lock()
	w.w = append(w.w, rec)
	w.mu.Unlock()
	return rec
}

func (w *writer) create(ctx context.Context, name, podIP string) (written, error) {
	at, _ := stamp()
	pe := policyEndpoint(name, podIP, at)
	if err := w.c.Create(ctx, pe); err != nil {
		return written{}, fmt.Errorf("create %s: %w", name, err)
	}
	return w.record(pe, "create"), nil
}

// update changes name's spec (the CIDR's second octet) with a new trigger.
func (w *writer) update(ctx context.Context, name string, n int) (written, error) {
	var pe v1alpha1.PolicyEndpoint
	if err := w.c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &pe); err != nil {
		return written{}, fmt.Errorf("get %s: %w", name, err)
	}
	_, trig := stamp()
	pe.Annotations[v1alpha1.AnnotationLastChangeTriggerTime] = trig
	pe.Spec.Ingress[0].CIDR = v1alpha1.NetworkAddress(fmt.Sprintf("10.%d.0.0/16", n%250))
	if err := w.c.Update(ctx, &pe); err != nil {
		return written{}, fmt.Errorf("update %s: %w", name, err)
	}
	return w.record(&pe, "update"), nil
}

func (w *writer) delete(ctx context.Context, name string) error {
	pe := &v1alpha1.PolicyEndpoint{}
	pe.Name, pe.Namespace = name, "default"
	if err := w.c.Delete(ctx, pe); err != nil {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	return nil
}

func (w *writer) all() []written {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.w)
}

// parseTrigger reads a trigger annotation value.
func parseTrigger(t *testing.T, s string) time.Time {
	t.Helper()
	tm, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatalf("trigger %q: %v", s, err)
	}
	return tm
}

func (s *spanSink) spanCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.spans
}

// vmRSS reads a process's resident set size (VmRSS in /proc/<pid>/status), bytes.
func vmRSS(t *testing.T, pid int) int64 {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("read VmRSS of %d: %v", pid, err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.Fields(v)[0], 10, 64) // "12345 kB"
			if err != nil {
				t.Fatalf("VmRSS %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}

// nativeHistogram is one scrape of a Prometheus native histogram: the positive
// buckets by index at schema (bucket i holds (2^((i-1)/2^schema), 2^(i/2^schema)]).
type nativeHistogram struct {
	schema  int32
	zero    uint64
	buckets map[int]uint64
	count   uint64
}

// scrapeNative reads metric family name's native histogram (the series whose labels
// contain every one of labels, name=value) from the agent's /metrics in the protobuf
// exposition, the only one that carries native histograms.
func (a *agentProcess) scrapeNative(t *testing.T, name string, labels ...string) nativeHistogram {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, a.url+"/metrics", nil)
	req.Header.Set("Accept", "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	for {
		var mf dto.MetricFamily
		if err := protodelim.UnmarshalFrom(r, &mf); err != nil {
			if err == io.EOF {
				t.Fatalf("/metrics has no native histogram %s %v", name, labels)
			}
			t.Fatalf("/metrics (protobuf): %v", err)
		}
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for _, want := range labels {
				k, v, _ := strings.Cut(want, "=")
				if !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == k && l.GetValue() == v }) {
					continue metrics
				}
			}
			h := m.GetHistogram()
			nh := nativeHistogram{schema: h.GetSchema(), zero: h.GetZeroCount(), count: h.GetSampleCount(), buckets: map[int]uint64{}}
			idx, deltas := 0, h.GetPositiveDelta()
			var c int64
			for si, sp := range h.GetPositiveSpan() {
				if si == 0 {
					idx = int(sp.GetOffset())
				} else {
					idx += int(sp.GetOffset())
				}
				for range sp.GetLength() {
					c += deltas[0]
					deltas = deltas[1:]
					nh.buckets[idx] = uint64(c)
					idx++
				}
			}
			return nh
		}
	}
}

// windowQuantile is the q-quantile (upper bucket bound, seconds) of the
// observations made between two scrapes of a cumulative native histogram, at the
// coarser of their schemas; n is how many observations the window holds.
func windowQuantile(before, after nativeHistogram, q float64) (quantile float64, n uint64) {
	schema := min(before.schema, after.schema)
	at := func(h nativeHistogram) map[int]uint64 {
		d := h.schema - schema
		out := map[int]uint64{}
		for i, c := range h.buckets {
			j := i >> d // ceil(i / 2^d)
			if j<<d < i {
				j++
			}
			out[j] += c
		}
		return out
	}
	b, a := at(before), at(after)
	var idx []int
	for i, c := range a {
		if c > b[i] {
			idx = append(idx, i)
		}
		n += c - b[i]
	}
	zero := after.zero - before.zero
	n += zero
	if n == 0 {
		return 0, 0
	}
	slices.Sort(idx)
	want, acc := uint64(math.Ceil(q*float64(n))), zero
	for _, i := range idx {
		acc += a[i] - b[i]
		if acc >= want {
			return math.Exp2(float64(i) / math.Exp2(float64(schema))), n
		}
	}
	return math.Exp2(float64(idx[len(idx)-1]) / math.Exp2(float64(schema))), n
}

// phasesOf is the durations of the spans of trace, by span name.
func (s *spanSink) phasesOf(trace string) map[string]time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.phases[trace])
}
