package telemetry

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/npagent/npagent/internal/report"
)

// The oldest pending trigger's age comes from the Counts snapshot, in seconds, as
// a gauge: exported over OTLP and on /metrics under the name the alert reads.
func TestOldestPendingAgeExported(t *testing.T) {
	tel := newInMemory(t)
	age := 754 * time.Second
	tel.ObserveCounts(func(c *report.Counts) { c.SeenPending, c.SeenOldestPendingAge = 2, age })
	m, ok := findMetric(tel.collect(t), SeenOldestPendingAgeName)
	if !ok {
		t.Fatalf("no %s metric", SeenOldestPendingAgeName)
	}
	g, ok := m.Data.(metricdata.Gauge[float64])
	if !ok || len(g.DataPoints) != 1 || g.DataPoints[0].Value != 754 || m.Unit != "s" {
		t.Fatalf("%s = %+v (unit %q), want one gauge point 754 in s", SeenOldestPendingAgeName, m.Data, m.Unit)
	}

	age = 0 // nothing pending
	srv := httptest.NewServer(tel.MetricsHandler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), "\nnpagent_seen_oldest_pending_age_seconds{") && !strings.Contains(string(body), "\nnpagent_seen_oldest_pending_age_seconds 0\n") {
		t.Errorf("/metrics has no npagent_seen_oldest_pending_age_seconds sample:\n%s", body)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "npagent_seen_oldest_pending_age_seconds") && !strings.HasSuffix(line, " 0") {
			t.Errorf("with nothing pending: %q, want 0", line)
		}
	}
}
