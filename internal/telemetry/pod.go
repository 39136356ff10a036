package telemetry

import (
	"context"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/npagent/npagent/internal/report"
)

// The new-pod enforcement window (report.PodRecord): a histogram, exponential as
// the policy latency, with the window's start as its one attribute; a counter of
// new pods no policy selected (counted, not observed); a counter of windows that
// yielded no point (clock skew: programmed before the network was ready); and one
// span per pod, from the start to the commit, linked to the writers of the
// versions that programmed it.
const (
	// PodLatencyName is the new-pod enforcement window, one point per pod uid.
	PodLatencyName = "npagent.pod.enforcement.latency"
	// PodUnselectedName counts new pods no policy selected.
	PodUnselectedName = "npagent.pod.enforcement.unselected"
	// PodRejectedName counts windows that yielded no point (reason clock_skew).
	PodRejectedName = "npagent.pod.enforcement.rejected"
)

// SourceKey is where the window started (report.SourceReadyToStartContainers or
// report.SourceFirstSeenIP).
const SourceKey = attribute.Key("npagent.pod.network_ready.source")

// podInstruments are the window's instruments and their attribute sets.
type podInstruments struct {
	latency    metric.Float64Histogram
	unselected metric.Int64ObservableCounter
	rejected   metric.Int64ObservableCounter
	sources    map[string]metric.MeasurementOption

	unselectedN, rejectedN atomic.Int64
}

// build makes the instruments on m; their observables are returned for the
// collection callback.
func (p *podInstruments) build(m metric.Meter, check func(error)) []metric.Observable {
	var err error
	p.latency, err = m.Float64Histogram(PodLatencyName, metric.WithUnit("s"),
		metric.WithDescription("Time from a new pod's network becoming usable (PodReadyToStartContainers, else first seen with an IP) to the commit that first programmed its policy on its node; one point per pod."))
	check(err)
	p.unselected, err = m.Int64ObservableCounter(PodUnselectedName, metric.WithUnit("{pod}"),
		metric.WithDescription("New pods no policy selected: counted, not observed."))
	check(err)
	p.rejected, err = m.Int64ObservableCounter(PodRejectedName, metric.WithUnit("{pod}"),
		metric.WithDescription("New pods' windows that yielded no point (clock_skew: programmed before the network was ready)."))
	check(err)
	p.sources = map[string]metric.MeasurementOption{}
	for _, s := range []string{report.SourceReadyToStartContainers, report.SourceFirstSeenIP} {
		p.sources[s] = metric.WithAttributeSet(attribute.NewSet(SourceKey.String(s)))
	}
	return []metric.Observable{p.unselected, p.rejected}
}

func (p *podInstruments) observe(o metric.Observer) {
	o.ObserveInt64(p.unselected, p.unselectedN.Load())
	o.ObserveInt64(p.rejected, p.rejectedN.Load(), metric.WithAttributes(ReasonKey.String("clock_skew")))
}

var _ report.PodSink = (*Telemetry)(nil)

// PodUnselected counts a new pod no policy selected.
func (t *Telemetry) PodUnselected() { t.pod.unselectedN.Add(1) }

// PodProgrammed records one new pod's window: a span (start: network ready, end:
// programmed) linked to the writers' traceparents, and a point recorded in its
// context, so the point's exemplar names the span.
func (t *Telemetry) PodProgrammed(r *report.PodRecord) {
	latency := r.Programmed.Sub(r.NetworkReady)
	if r.NetworkReady.IsZero() || r.Programmed.IsZero() || latency < 0 {
		t.pod.rejectedN.Add(1)
		return
	}
	var links []trace.Link
	for _, tp := range r.TraceParents {
		carrier := traceparentCarrier(tp)
		if sc := trace.SpanContextFromContext(traceContext.Extract(context.Background(), &carrier)); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	attrs := []attribute.KeyValue{
		semconv.K8SNamespaceName(r.Namespace), semconv.K8SPodName(r.Name), semconv.K8SPodUID(r.UID),
		SourceKey.String(r.Source), attribute.Bool("npagent.enforcing_mode.strict", r.Strict),
		attribute.StringSlice("npagent.pod.objects", r.Objects),
	}
	if t.nodeAttr.Valid() {
		attrs = append(attrs, t.nodeAttr)
	}
	ctx, span := t.tracer.Start(context.Background(), "pod enforcement", trace.WithNewRoot(),
		trace.WithTimestamp(r.NetworkReady), trace.WithLinks(links...), trace.WithAttributes(attrs...))
	source, ok := t.pod.sources[r.Source]
	if !ok {
		source = metric.WithAttributeSet(attribute.NewSet(SourceKey.String(r.Source)))
	}
	t.pod.latency.Record(ctx, latency.Seconds(), source)
	span.End(trace.WithTimestamp(r.Programmed))
}
