package telemetry

import (
	"io"
	"net/http/httptest"
	"strings"
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

// containsSample reports whether the exposition has a sample of the metric family
// name (with or without labels) whose value is value.
func containsSample(body, name, value string) bool {
	for _, line := range strings.Split(body, "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		if f := strings.Fields(line); len(f) >= 2 && f[len(f)-1] == value {
			return true
		}
	}
	return false
}
