package telemetry

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/npagent/npagent/internal/report"
)

// Each informer's watch health from report.Counts.Watch is exported per kind: the
// age of its last event or bookmark, stalled and established as 0/1, errors by
// request and relists by cause. An informer that never received anything exports
// no age.
func TestWatchHealthExported(t *testing.T) {
	tel := newInMemory(t)
	var c report.Counts
	pe, cpe := report.KindPolicyEndpoint, report.KindClusterPolicyEndpoint
	c.Watch[pe] = report.WatchHealth{Established: true, LastEvent: time.Now(), Age: 1500 * time.Millisecond,
		ListErrors: 2, WatchErrors: 5, Relists: [report.NumRelistCauses]uint64{3, 1}}
	c.Watch[cpe] = report.WatchHealth{Stalled: true}
	tel.ObserveCounts(func(dst *report.Counts) { *dst = c })
	rm := tel.collect(t)
	kind := func(k report.Kind) attribute.KeyValue { return KindKey.String(k.String()) }
	for _, tc := range []struct {
		name string
		want int64
		attr []attribute.KeyValue
	}{
		{WatchStalledName, 0, []attribute.KeyValue{kind(pe)}},
		{WatchStalledName, 1, []attribute.KeyValue{kind(cpe)}},
		{WatchEstablishedName, 1, []attribute.KeyValue{kind(pe)}},
		{WatchEstablishedName, 0, []attribute.KeyValue{kind(cpe)}},
		{WatchErrorsName, 2, []attribute.KeyValue{kind(pe), RequestKey.String("list")}},
		{WatchErrorsName, 5, []attribute.KeyValue{kind(pe), RequestKey.String("watch")}},
		{WatchRelistsName, 3, []attribute.KeyValue{kind(pe), CauseKey.String("expired")}},
		{WatchRelistsName, 1, []attribute.KeyValue{kind(pe), CauseKey.String("restart")}},
	} {
		if got := counterValue(t, rm, tc.name, tc.attr...); got != tc.want {
			t.Errorf("%s%v = %d, want %d", tc.name, tc.attr, got, tc.want)
		}
	}
	m, ok := findMetric(rm, WatchLastEventAgeName)
	if !ok {
		t.Fatalf("no %s", WatchLastEventAgeName)
	}
	points := m.Data.(metricdata.Gauge[float64]).DataPoints
	if len(points) != 1 || !hasAll(points[0].Attributes, []attribute.KeyValue{kind(pe)}) || points[0].Value != 1.5 {
		t.Errorf("%s = %+v, want one point 1.5 for PolicyEndpoint (none for an informer that received nothing)", WatchLastEventAgeName, points)
	}
	if m.Unit != "s" {
		t.Errorf("%s unit %q, want s", WatchLastEventAgeName, m.Unit)
	}
}

// The names the Prometheus rules read (deploy/prometheus) are what /metrics serves.
func TestWatchHealthPrometheusNames(t *testing.T) {
	tel := newInMemory(t)
	tel.ObserveCounts(func(dst *report.Counts) {
		dst.Watch[report.KindPolicyEndpoint] = report.WatchHealth{Established: true, LastEvent: time.Now(), Age: time.Second, WatchErrors: 1}
	})
	srv := httptest.NewServer(tel.MetricsHandler())
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, want := range []string{
		`npagent_watch_stalled{`,
		`npagent_watch_established{`,
		`npagent_watch_last_event_age_seconds{`,
		`npagent_watch_errors_total{`,
		`npagent_watch_relists_total{`,
		`npagent_policy_kind="PolicyEndpoint"`,
		`request="watch"`,
		`cause="expired"`,
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics has no %s", want)
		}
	}
}
