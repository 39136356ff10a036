package telemetry

import (
	"bytes"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/npagent/npagent/internal/report"
)

// scrape returns the Prometheus text exposition of tel's instruments.
func scrape(t *testing.T, tel *inMemory) string {
	t.Helper()
	srv := httptest.NewServer(tel.MetricsHandler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

// The reconcile loop's isolated-pod count (pods denied because their commit could
// not complete) is exported as a cumulative counter, over OTLP and on /metrics.
func TestPodsIsolatedExported(t *testing.T) {
	tel := newInMemory(t)
	var isolated uint64 = 3
	tel.ObserveCounts(func(c *report.Counts) { c.PodsIsolated = isolated })
	m, ok := findMetric(tel.collect(t), PodsIsolatedName)
	if !ok {
		t.Fatalf("no %s metric", PodsIsolatedName)
	}
	sum, ok := m.Data.(metricdata.Sum[int64])
	if !ok || !sum.IsMonotonic || sum.Temporality != metricdata.CumulativeTemporality || len(sum.DataPoints) != 1 || sum.DataPoints[0].Value != 3 {
		t.Fatalf("%s = %+v, want one cumulative monotonic point 3", PodsIsolatedName, m.Data)
	}
	isolated = 5
	if body := scrape(t, tel); !containsSample(body, "npagent_dataplane_pods_isolated_total", "5") {
		t.Errorf("/metrics has no npagent_dataplane_pods_isolated_total sample of 5:\n%s", body)
	}
}

// Endpoints that could not be isolated (a rejected PolicyEndpoint without a valid
// version, its hostIP or podIP unparsable) are a cumulative counter too.
func TestPodsUnisolableExported(t *testing.T) {
	tel := newInMemory(t)
	var n uint64 = 2
	tel.ObserveCounts(func(c *report.Counts) { c.PodsUnisolable = n })
	m, ok := findMetric(tel.collect(t), PodsUnisolableName)
	if !ok {
		t.Fatalf("no %s metric", PodsUnisolableName)
	}
	sum, ok := m.Data.(metricdata.Sum[int64])
	if !ok || !sum.IsMonotonic || len(sum.DataPoints) != 1 || sum.DataPoints[0].Value != 2 {
		t.Fatalf("%s = %+v, want one monotonic point 2", PodsUnisolableName, m.Data)
	}
	n = 7
	if body := scrape(t, tel); !containsSample(body, "npagent_dataplane_pods_unisolable_total", "7") {
		t.Errorf("/metrics has no npagent_dataplane_pods_unisolable_total sample of 7:\n%s", body)
	}
}

// Strict mode's denied-pod count is a gauge (pods leave it when a policy selects
// them), over OTLP and on /metrics.
func TestPodsStrictDeniedExported(t *testing.T) {
	tel := newInMemory(t)
	var denied int64 = 4
	tel.ObserveCounts(func(c *report.Counts) { c.PodsStrictDenied = denied })
	m, ok := findMetric(tel.collect(t), PodsStrictDeniedName)
	if !ok {
		t.Fatalf("no %s metric", PodsStrictDeniedName)
	}
	g, ok := m.Data.(metricdata.Gauge[int64])
	if !ok || len(g.DataPoints) != 1 || g.DataPoints[0].Value != 4 {
		t.Fatalf("%s = %+v, want one gauge point 4", PodsStrictDeniedName, m.Data)
	}
	denied = 1
	if body := scrape(t, tel); !containsSample(body, "npagent_dataplane_pods_strict_denied", "1") {
		t.Errorf("/metrics has no npagent_dataplane_pods_strict_denied sample of 1:\n%s", body)
	}
}

// containsSample reports whether the exposition has a sample whose line starts
// with name (a family name, or one with its first labels) and whose value is value.
func containsSample(body, name, value string) bool {
	for _, line := range strings.Split(body, "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && !strings.ContainsRune(" {,}", rune(rest[0]))) {
			continue
		}
		if f := strings.Fields(line); len(f) >= 2 && f[len(f)-1] == value {
			return true
		}
	}
	return false
}

// Map use is exported as two gauges by map: entries held and capacity, for each
// policy map (direction and family), the pods holding state and the connection
// table; a map the backend does not have (Max 0) is left out, not shown as empty.
func TestMapUseExported(t *testing.T) {
	tel := newInMemory(t)
	dm := report.DataplaneMaps{
		Entries: [2][2]report.MapUse{{{Used: 100, Max: 65536}, {Used: 7, Max: 16384}}, {{Used: 3, Max: 65536}, {Used: 0, Max: 16384}}},
		Pods:    report.MapUse{Used: 12, Max: 4096},
	}
	tel.ObserveCounts(func(c *report.Counts) { c.Maps = dm })
	gauge := func(rm metricdata.ResourceMetrics, name string) map[string]int64 {
		t.Helper()
		m, ok := findMetric(rm, name)
		if !ok {
			t.Fatalf("no %s metric", name)
		}
		g, ok := m.Data.(metricdata.Gauge[int64])
		if !ok {
			t.Fatalf("%s: %T, want an int64 gauge", name, m.Data)
		}
		out := map[string]int64{}
		for _, p := range g.DataPoints {
			v, _ := p.Attributes.Value(MapKey)
			out[v.AsString()] = p.Value
		}
		return out
	}
	rm := tel.collect(t)
	wantUsed := map[string]int64{"ingress_ipv4": 100, "ingress_ipv6": 7, "egress_ipv4": 3, "egress_ipv6": 0, "pods": 12}
	wantMax := map[string]int64{"ingress_ipv4": 65536, "ingress_ipv6": 16384, "egress_ipv4": 65536, "egress_ipv6": 16384, "pods": 4096}
	if got := gauge(rm, MapEntriesName); !maps.Equal(got, wantUsed) {
		t.Errorf("%s = %v, want %v (no conntrack point: not reported)", MapEntriesName, got, wantUsed)
	}
	if got := gauge(rm, MapCapacityName); !maps.Equal(got, wantMax) {
		t.Errorf("%s = %v, want %v", MapCapacityName, got, wantMax)
	}

	dm.Conntrack = report.MapUse{Used: 5000, Max: 65536}
	dm.Entries[0][0].Used = 101
	body := scrape(t, tel)
	for _, s := range []struct{ name, value string }{
		{`npagent_dataplane_map_entries{map="ingress_ipv4"`, "101"},
		{`npagent_dataplane_map_entries{map="conntrack"`, "5000"},
		{`npagent_dataplane_map_capacity{map="conntrack"`, "65536"},
		{`npagent_dataplane_map_capacity{map="egress_ipv6"`, "16384"},
	} {
		if !containsSample(body, s.name, s.value) {
			t.Errorf("/metrics has no %s...} %s sample:\n%s", s.name, s.value, body)
		}
	}
}

// Object versions without the trigger annotation are a cumulative counter by kind,
// over OTLP and on /metrics: the reason an empty latency dashboard is empty.
func TestTriggerMissingExported(t *testing.T) {
	tel := newInMemory(t)
	tel.ObserveCounts(func(c *report.Counts) { c.TriggerMissing[report.KindPolicyEndpoint] = 4 })
	m, ok := findMetric(tel.collect(t), TriggerMissingName)
	if !ok {
		t.Fatalf("no %s metric", TriggerMissingName)
	}
	sum, ok := m.Data.(metricdata.Sum[int64])
	if !ok || !sum.IsMonotonic || len(sum.DataPoints) != report.NumKinds {
		t.Fatalf("%s = %+v, want a monotonic point per kind", TriggerMissingName, m.Data)
	}
	for _, p := range sum.DataPoints {
		kind, _ := p.Attributes.Value(KindKey)
		want := int64(0)
		if kind.AsString() == report.KindPolicyEndpoint.String() {
			want = 4
		}
		if p.Value != want {
			t.Errorf("%s{%s} = %d, want %d", TriggerMissingName, kind.AsString(), p.Value, want)
		}
	}
	if body := scrape(t, tel); !containsSample(body, `npagent_policy_trigger_missing_total{npagent_policy_kind="PolicyEndpoint"`, "4") {
		t.Errorf("/metrics has no npagent_policy_trigger_missing_total sample of 4 for PolicyEndpoint:\n%s", body)
	}
}

// TestTextScrapeWarned: a /metrics client that asks for a text format loses the
// native histograms' buckets, so the agent warns, once per User-Agent, naming the
// setting that fixes it; a protobuf scrape is not warned about.
func TestTextScrapeWarned(t *testing.T) {
	var logs syncBuffer
	tel := newInMemory(t, WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	srv := httptest.NewServer(tel.MetricsHandler())
	defer srv.Close()
	get := func(ua, accept string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		req.Header.Set("User-Agent", ua)
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	const proto = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.6,application/openmetrics-text;version=1.0.0;q=0.5"
	get("Prometheus/3.8.0", proto)
	if strings.Contains(logs.String(), "text format") {
		t.Fatalf("a protobuf scrape was warned about:\n%s", logs.String())
	}
	get("Prometheus/2.53.0", "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5")
	get("Prometheus/2.53.0", "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5")
	get("curl/8.5.0", "")
	out := logs.String()
	if n := strings.Count(out, "text format"); n != 2 {
		t.Errorf("warned %d times, want once per User-Agent (2):\n%s", n, out)
	}
	for _, want := range []string{"PrometheusProto", "scrape_native_histograms", LatencyName, "Prometheus/2.53.0", "curl/8.5.0"} {
		if !strings.Contains(out, want) {
			t.Errorf("the warning does not name %q:\n%s", want, out)
		}
	}
}

// syncBuffer is a bytes.Buffer a logger may write from a server's goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
