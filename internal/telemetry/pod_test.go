package telemetry

import (
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/npagent/npagent/internal/report"
)

// TestPodProgrammed: one new pod's window is one exponential-histogram point with
// its source, one span from network ready to programmed linked to the writer, and
// the point's exemplar names that span; an unselected pod and a skewed window are
// counted, not observed.
func TestPodProgrammed(t *testing.T) {
	m := newInMemory(t)
	ready := time.Now().Add(-1500 * time.Millisecond)
	programmed := ready.Add(1200 * time.Millisecond)
	const writer = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	m.PodProgrammed(&report.PodRecord{Namespace: "shop", Name: "web-0", UID: "u1", NetworkReady: ready,
		Source: report.SourceReadyToStartContainers, Programmed: programmed, Objects: []string{"PolicyEndpoint shop/web"},
		TraceParents: []string{writer, "garbage"}})
	m.PodProgrammed(&report.PodRecord{Namespace: "shop", Name: "web-1", UID: "u2", NetworkReady: programmed, Programmed: ready,
		Source: report.SourceFirstSeenIP})
	m.PodUnselected()

	rm := m.collect(t)
	met, ok := findMetric(rm, PodLatencyName)
	if !ok {
		t.Fatalf("no %s", PodLatencyName)
	}
	h, ok := met.Data.(metricdata.ExponentialHistogram[float64])
	if !ok || len(h.DataPoints) != 1 {
		t.Fatalf("%s: %T with %v, want one exponential histogram point", PodLatencyName, met.Data, met.Data)
	}
	p := h.DataPoints[0]
	if p.Count != 1 || p.Sum < 1.19 || p.Sum > 1.21 {
		t.Errorf("point count %d sum %v, want 1 and 1.2s", p.Count, p.Sum)
	}
	if v, _ := p.Attributes.Value(SourceKey); v.AsString() != report.SourceReadyToStartContainers {
		t.Errorf("point attributes %v, want source %s", p.Attributes, report.SourceReadyToStartContainers)
	}
	if n := counterValue(t, rm, PodUnselectedName); n != 1 {
		t.Errorf("%s = %d, want 1", PodUnselectedName, n)
	}
	if n := counterValue(t, rm, PodRejectedName, attribute.String("reason", "clock_skew")); n != 1 {
		t.Errorf("%s = %d, want 1", PodRejectedName, n)
	}
	spans := m.endedSpans(t)
	if len(spans) != 1 {
		t.Fatalf("%d spans, want 1 (none for the skewed window)", len(spans))
	}
	s := spans[0]
	if s.Name != "pod enforcement" || !s.StartTime.Equal(ready) || !s.EndTime.Equal(programmed) || len(s.Links) != 1 ||
		s.Links[0].SpanContext.TraceID().String() != "0af7651916cd43dd8448eb211c80319c" {
		t.Errorf("span %s %v..%v links %v, want pod enforcement from ready to programmed linked to the writer", s.Name, s.StartTime, s.EndTime, s.Links)
	}
	if len(p.Exemplars) != 1 || [16]byte(p.Exemplars[0].TraceID) != s.SpanContext.TraceID() {
		t.Errorf("exemplars %v, want one naming trace %s", p.Exemplars, s.SpanContext.TraceID())
	}
}
