package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/npagent/npagent/internal/report"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/expfmt"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/exemplar"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// ScopeName is the instrumentation scope of every span and instrument made here.
const ScopeName = "github.com/npagent/npagent/internal/telemetry"

// ServiceName is the default service.name (OTEL_SERVICE_NAME overrides it).
const ServiceName = "npagent"

// Telemetry owns the tracer and meter providers, their exporters and the
// instruments. Its methods are safe for concurrent use.
type Telemetry struct {
	cfg    config
	tp     *sdktrace.TracerProvider
	mp     *sdkmetric.MeterProvider
	tracer trace.Tracer
	prom   *prometheus.Registry
	// textScrapers: /metrics clients warned that text loses the native histograms.
	textScrapers textScrapers

	latency        metric.Float64Histogram
	commitDuration metric.Float64Histogram
	// What telemetry itself counts: records it could not turn into a point, by
	// reason; traceparents that did not parse; failed commit attempts.
	rejected           kindCounter // by reject reason
	traceparentInvalid kindCounter
	commitFailures     kindCounter

	latencySets byKind                                             // the latency histogram's sets
	commitSets  [2]byKind                                          // the commit duration histogram's sets, by outcome (0 success, 1 failure)
	causeSets   [report.NumKinds][report.NumCauses]*measureOptions // deliveries
	reasonSets  [report.NumReasons]*measureOptions                 // suppressions
	fieldSets   fieldSets                                          // invalid objects

	counts    atomic.Pointer[func(*report.Counts)] // reads the owners' counters (ObserveCounts)
	watch     watchInstruments                     // per-informer watch health, from the same Counts
	dataplane dataplaneInstruments                 // the dataplane's counts and map use, from the same Counts
	pod       podInstruments                       // new pods' enforcement windows (pod.go)
	verdicts  verdictExport                        // the dataplane's verdict counters (ObserveVerdicts)
	flows     flowLogs                             // flow events as log records (flows.go)

	nodeAttr attribute.KeyValue // k8s.node.name, or an empty KeyValue when unset

	trees         *treeGate // the tracer's span processor: whole trees to the span queues
	handoff       *handoff  // records waiting for the drawing goroutine
	spanExporters int       // span exporters behind the gate, for counting a lost tree's spans

	spansDropped        atomic.Uint64 // refused by a full span queue, or lost to a shutdown
	spansFailed         atomic.Uint64 // handed to an exporter whose export failed
	metricExportsFailed atomic.Uint64
}

// New builds providers, exporters (OTLP for traces, metrics and logs, over gRPC or
// http/protobuf, honouring the standard OTEL_EXPORTER_OTLP_* variables incl.
// protocol, TLS, headers and insecure; plus a Prometheus registry for
// MetricsHandler) and instruments. An unsupported protocol or an endpoint that is
// not an http:// or https:// URL is an error naming the variable. Nothing is
// dialled here: the exporters connect lazily, so a collector that is not up yet
// costs nothing but counted drops.
func New(ctx context.Context, opts ...Option) (*Telemetry, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.sdkLogs {
		// Before the exporters: they report bad OTEL_* values while being built.
		routeSDKLogs(cfg.logger)
	}
	res, err := buildResource(ctx, &cfg)
	if err != nil {
		return nil, err
	}
	t := &Telemetry{cfg: cfg}
	if cfg.nodeName != "" {
		t.nodeAttr = semconv.K8SNodeName(cfg.nodeName)
	}

	if err := t.buildTracing(ctx, res); err != nil {
		return nil, err
	}
	if err := t.buildMetrics(ctx, res); err != nil {
		_ = t.tp.Shutdown(ctx)
		return nil, err
	}
	if err := t.buildLogs(ctx, res); err != nil {
		_ = t.tp.Shutdown(ctx)
		_ = t.mp.Shutdown(ctx)
		return nil, err
	}
	// As many records as the span queues hold spans: a tree is at least one span.
	t.handoff = newHandoff(cfg.spanQueueSize)
	go t.handoff.run(t.draw)
	return t, nil
}

// buildResource merges, lowest precedence first: the SDK's defaults; npagent's
// own defaults (service.name, a random service.instance.id, host.name);
// OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME; and what the options set
// (node name, service version, instance ID). So an operator can override the
// defaults from the environment, and, as the OTel specification asks, attributes
// the program sets explicitly win over the environment.
func buildResource(ctx context.Context, cfg *config) (*resource.Resource, error) {
	defaults := []attribute.KeyValue{
		semconv.ServiceName(ServiceName),
		semconv.ServiceInstanceID(uuid.NewString()),
	}
	if host, err := os.Hostname(); err == nil {
		defaults = append(defaults, semconv.HostName(host))
	}
	var explicit []attribute.KeyValue
	if cfg.instanceID != "" {
		explicit = append(explicit, semconv.ServiceInstanceID(cfg.instanceID))
	}
	if cfg.serviceVersion != "" {
		explicit = append(explicit, semconv.ServiceVersion(cfg.serviceVersion))
	}
	if cfg.nodeName != "" {
		explicit = append(explicit, semconv.K8SNodeName(cfg.nodeName))
	}
	fromEnv, err := resource.New(ctx, resource.WithFromEnv())
	if err != nil {
		return nil, fmt.Errorf("telemetry resource: OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	res := resource.Default()
	for _, layer := range []*resource.Resource{
		resource.NewWithAttributes(semconv.SchemaURL, defaults...),
		fromEnv,
		resource.NewWithAttributes(semconv.SchemaURL, explicit...),
	} {
		if res, err = resource.Merge(res, layer); err != nil {
			return nil, fmt.Errorf("telemetry resource: merge: %w", err)
		}
	}
	return res, nil
}

// collectorReconnect bounds how long the OTLP gRPC exporters wait between attempts to
// reconnect to a collector that went away. gRPC's default backoff grows to two
// minutes: after a 30 s outage the first spans reached the returned collector
// 15–20 s late, dropped meanwhile. Capped at 5 s, a node's agent retries a few
// times a minute at most while the collector is down.
var collectorReconnect = grpc.WithConnectParams(grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 500 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 5 * time.Second},
	MinConnectTimeout: 5 * time.Second,
})

func (t *Telemetry) buildTracing(ctx context.Context, res *resource.Resource) error {
	exporters := t.cfg.traceExporters
	if t.cfg.otlpTraces() {
		exp, err := newTraceExporter(ctx)
		if err != nil {
			return fmt.Errorf("telemetry: otlp trace exporter: %w", err)
		}
		exporters = append(exporters, exp)
	}
	queue := t.cfg.spanQueueSize
	var gates []*spanGate
	for _, exp := range exporters {
		inFlight := new(atomic.Int64)
		health := &exportHealth{signal: "traces", effect: "spans dropped and counted", logger: t.cfg.logger}
		bsp := sdktrace.NewBatchSpanProcessor(
			&gatedExporter{SpanExporter: exp, inFlight: inFlight, failed: &t.spansFailed, health: health},
			sdktrace.WithMaxQueueSize(queue),
			sdktrace.WithMaxExportBatchSize(min(sdktrace.DefaultMaxExportBatchSize, queue)),
		)
		gates = append(gates, &spanGate{next: bsp, limit: int64(queue), inFlight: inFlight, dropped: &t.spansDropped})
	}
	t.trees = newTreeGate(gates)
	t.spanExporters = len(exporters)
	// The SDK's span limits (OTEL_SPAN_*, OTEL_ATTRIBUTE_*) and id generator
	// apply as usual; the sampler is latency-aware and consults
	// OTEL_TRACES_SAMPLER for the fast triggers only (latencySampler).
	t.tp = sdktrace.NewTracerProvider(
		sdktrace.WithResource(res),
		sdktrace.WithSampler(newLatencySampler(t.cfg.slowThreshold, t.cfg.fastFraction, envSampler(t.cfg.logger))),
		sdktrace.WithSpanProcessor(t.trees),
	)
	t.tracer = t.tp.Tracer(ScopeName)
	return nil
}

func (t *Telemetry) buildMetrics(ctx context.Context, res *resource.Resource) error {
	exponential := sdkmetric.Stream{Aggregation: sdkmetric.AggregationBase2ExponentialHistogram{
		MaxSize: histogramMaxSize, MaxScale: histogramMaxScale,
	}}
	// The latency histogram's exemplars come from markReservoir, which tells
	// the drawing code which roots to mark (exemplar.go).
	latency := exponential
	latency.ExemplarReservoirProviderSelector = func(sdkmetric.Aggregation) exemplar.ReservoirProvider {
		return markReservoirProvider
	}
	mpOpts := []sdkmetric.Option{
		sdkmetric.WithResource(res),
		sdkmetric.WithView(
			sdkmetric.NewView(sdkmetric.Instrument{Name: LatencyName}, latency),
			sdkmetric.NewView(sdkmetric.Instrument{Name: CommitDurationName}, exponential),
			sdkmetric.NewView(sdkmetric.Instrument{Name: PodLatencyName}, exponential),
		),
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	promExporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	t.prom = reg
	mpOpts = append(mpOpts, sdkmetric.WithReader(promExporter))
	if t.cfg.otlpMetrics() {
		exp, err := newMetricExporter(ctx)
		if err != nil {
			return fmt.Errorf("telemetry: otlp metric exporter: %w", err)
		}
		health := &exportHealth{signal: "metrics", effect: "cumulative totals sent on recovery", logger: t.cfg.logger}
		mpOpts = append(mpOpts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(
			&countingMetricExporter{Exporter: exp, failed: &t.metricExportsFailed, health: health},
			sdkmetric.WithInterval(t.cfg.meterInterval),
		)))
	}
	for _, r := range t.cfg.metricReaders {
		mpOpts = append(mpOpts, sdkmetric.WithReader(r))
	}
	t.mp = sdkmetric.NewMeterProvider(mpOpts...)
	return t.buildInstruments()
}

func (t *Telemetry) buildInstruments() error {
	m := t.mp.Meter(ScopeName)
	var errs []error
	check := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	var err error
	t.latency, err = m.Float64Histogram(LatencyName, metric.WithUnit("s"),
		metric.WithDescription("Time from a policy change's trigger time to its commit in this node's dataplane, per reported trigger."))
	check(err)
	t.latencySets = newByKind()
	for i, outcome := range [2]string{outcomeSuccess, outcomeFailure} {
		t.commitSets[i] = newByKind(OutcomeKey.String(outcome))
	}
	for k := range report.NumKinds {
		for c := range report.NumCauses {
			t.causeSets[k][c] = newMeasureOptions(KindKey.String(report.Kind(k).String()), CauseKey.String(report.Cause(c).String()))
		}
	}
	for _, r := range report.Reasons() {
		t.reasonSets[r] = newMeasureOptions(ReasonKey.String(r.String()))
	}

	t.rejected = newKindCounter(ReasonKey.String("clock_skew"), ReasonKey.String("no_commit"))
	t.traceparentInvalid = newKindCounter()
	t.commitFailures = newKindCounter()
	own := []struct {
		c           *kindCounter
		name, unit  string
		description string
	}{
		{&t.rejected, RejectedName, "{trigger}", "Reported triggers that yielded no observation (clock_skew: committed before the trigger time; no_commit: no attempt or no trigger time)."},
		{&t.traceparentInvalid, TraceparentInvalidName, "{annotation}", "traceparent annotations that did not parse; their spans start new traces."},
		{&t.commitFailures, CommitFailuresName, "{attempt}", "Failed dataplane commit attempts."},
	}
	observed := []metric.Observable{}
	for _, c := range own {
		c.c.inst, err = m.Int64ObservableCounter(c.name, metric.WithUnit(c.unit), metric.WithDescription(c.description))
		check(err)
		observed = append(observed, c.c.inst)
	}
	suppressed, err := m.Int64ObservableCounter(SuppressedName, metric.WithUnit("{trigger}"),
		metric.WithDescription("Trigger observations and pending triggers not reported, by the seen-set's reason."))
	check(err)
	deliveries, err := m.Int64ObservableCounter(DeliveriesName, metric.WithUnit("{delivery}"),
		metric.WithDescription("Informer deliveries of policy objects, by cause."))
	check(err)
	triggerMissing, err := m.Int64ObservableCounter(TriggerMissingName, metric.WithUnit("{version}"),
		metric.WithDescription("Policy object versions delivered without the trigger annotation, by kind: their programming latency is not measured (the controller that wrote them does not stamp it)."))
	check(err)
	invalidObjects, err := m.Int64ObservableCounter(InvalidObjectsName, metric.WithUnit("{object}"),
		metric.WithDescription("Policy objects rejected for bad input, by field."))
	check(err)
	observed = append(observed, suppressed, deliveries, invalidObjects, triggerMissing)
	t.commitDuration, err = m.Float64Histogram(CommitDurationName, metric.WithUnit("s"),
		metric.WithDescription("Duration of each dataplane commit attempt."))
	check(err)

	seenObjects, err := m.Int64ObservableGauge(SeenObjectsName, metric.WithUnit("{object}"),
		metric.WithDescription("Objects tracked by the seen-set."))
	check(err)
	seenPending, err := m.Int64ObservableGauge(SeenPendingName, metric.WithUnit("{trigger}"),
		metric.WithDescription("Trigger times seen but not yet committed."))
	check(err)
	pendingAge, err := newOldestPendingAge(m)
	check(err)
	spansDropped, err := m.Int64ObservableCounter(SpansDroppedName, metric.WithUnit("{span}"),
		metric.WithDescription("Spans that never reached the collector: span queue full, or export failed after retries."))
	check(err)
	exportsFailed, err := m.Int64ObservableCounter(MetricExportsFailedName, metric.WithUnit("{export}"),
		metric.WithDescription("OTLP metric export rounds that failed (cumulative temporality: the next round carries the totals)."))
	check(err)
	observed = append(observed, t.watch.build(m, check)...)
	observed = append(observed, t.dataplane.build(m, check)...)
	observed = append(observed, t.pod.build(m, check)...)
	check(t.buildAuditGauge(m))
	if len(errs) > 0 {
		return fmt.Errorf("telemetry instruments: %w", errors.Join(errs...))
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		spans, exports := t.Dropped()
		o.ObserveInt64(spansDropped, int64(spans))
		o.ObserveInt64(exportsFailed, int64(exports))
		for _, c := range own {
			c.c.observe(o)
		}
		t.pod.observe(o)
		if fill := t.counts.Load(); fill != nil {
			var c report.Counts
			(*fill)(&c)
			t.observeCounts(o, &c, suppressed, deliveries, invalidObjects, seenObjects, seenPending)
			for k, n := range c.TriggerMissing {
				o.ObserveInt64(triggerMissing, int64(n), t.latencySets[k].observe...)
			}
			pendingAge.observe(o, &c)
			t.watch.observe(o, &c)
			t.dataplane.observe(o, &c)
		}
		return nil
	}, append(observed, spansDropped, exportsFailed, seenObjects, seenPending, pendingAge.inst)...)
	if err != nil {
		return fmt.Errorf("telemetry instruments: register callback: %w", err)
	}
	return nil
}

// MetricsHandler serves the Prometheus exposition of every instrument. The
// latency histogram is a native histogram there, carried only by the protobuf
// exposition (negotiated through the Accept header); the text formats show its
// count and sum alone, so a scraper that asks for text is warned about once (per
// User-Agent). A scrape shows every trigger reported before it.
func (t *Telemetry) MetricsHandler() http.Handler {
	h := promhttp.HandlerFor(t.prom, promhttp.HandlerOpts{EnableOpenMetrics: true})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.handoff.drain(t.draw) // every trigger reported before the scrape is in it
		if expfmt.NegotiateAccept(r.Header, expfmt.DefaultOpenMetricsAcceptedFormats()...).FormatType() != expfmt.TypeProtoDelim {
			t.textScrapers.warn(t.cfg.logger, r)
		}
		h.ServeHTTP(w, r)
	})
}

// maxTextScrapers bounds the User-Agents textScrapers remembers: a warning per
// scraper is the point, and anything can set a User-Agent.
const maxTextScrapers = 16

// textScrapers warns, once per User-Agent, that a /metrics client asked for a
// text format, which carries the native histograms' count and sum only: the
// latency quantiles and the dashboard then stay empty with nothing else to say
// why.
type textScrapers struct {
	mu   sync.Mutex
	seen map[string]bool
}

func (s *textScrapers) warn(log *slog.Logger, r *http.Request) {
	ua := r.Header.Get("User-Agent")
	s.mu.Lock()
	if s.seen[ua] || len(s.seen) >= maxTextScrapers {
		s.mu.Unlock()
		return
	}
	if s.seen == nil {
		s.seen = map[string]bool{}
	}
	s.seen[ua] = true
	s.mu.Unlock()
	log.Warn("a /metrics client asked for a text format: it gets only _count and _sum of the native histograms "+
		"("+LatencyName+", "+CommitDurationName+"), so their quantiles stay empty; scrape protobuf first "+
		"(Prometheus: scrape_protocols: [PrometheusProto, ...] and scrape_native_histograms: true) or receive them over OTLP",
		"remote", r.RemoteAddr, "user_agent", ua, "accept", r.Header.Get("Accept"))
}

// Dropped returns how many spans never reached an exporter's destination (queue
// full, or export failed after the exporter's retries) and how many OTLP metric
// export rounds failed, so far.
func (t *Telemetry) Dropped() (spans, metricExports uint64) {
	return t.spansDropped.Load() + t.spansFailed.Load(), t.metricExportsFailed.Load()
}

// ObserveCounts registers fill, which copies the counters their owners keep (the
// reconcile loop's deliveries and invalid objects, the seen-set's suppressions
// and size) into a Counts on each collection, from the collecting goroutine.
// Telemetry keeps no copy of them. A later call replaces fill.
func (t *Telemetry) ObserveCounts(fill func(*report.Counts)) {
	t.counts.Store(&fill)
}

// observeCounts exports one Counts snapshot.
func (t *Telemetry) observeCounts(o metric.Observer, c *report.Counts, suppressed, deliveries, invalid metric.Int64ObservableCounter, objects, pending metric.Int64ObservableGauge) {
	for k := range c.Deliveries {
		for cause, n := range c.Deliveries[k] {
			if n > 0 {
				o.ObserveInt64(deliveries, int64(n), t.causeSets[k][cause].observe...)
			}
		}
	}
	for _, r := range report.Reasons() {
		if n := c.Suppressed[r]; n > 0 {
			o.ObserveInt64(suppressed, int64(n), t.reasonSets[r].observe...)
		}
	}
	// Fields beyond the cap share one set: sum them before observing it once.
	totals := make(map[*measureOptions]int64, len(c.InvalidObjects))
	for key, n := range c.InvalidObjects {
		totals[t.fieldSets.get(key)] += int64(n)
	}
	for set, n := range totals {
		o.ObserveInt64(invalid, n, set.observe...)
	}
	o.ObserveInt64(objects, c.SeenObjects)
	o.ObserveInt64(pending, c.SeenPending)
}

// ForceFlush exports every span and every metric recorded so far, waiting for
// the exporters (or ctx).
func (t *Telemetry) ForceFlush(ctx context.Context) error {
	t.handoff.drain(t.draw)
	errs := []error{t.tp.ForceFlush(ctx), t.mp.ForceFlush(ctx)}
	if t.flows.lp != nil {
		errs = append(errs, t.flows.lp.ForceFlush(ctx))
	}
	return errors.Join(errs...)
}

// Shutdown flushes and stops the exporters. Report and the counters stay safe
// to call afterwards; what they record is no longer exported (a later Report's
// spans are counted as dropped).
func (t *Telemetry) Shutdown(ctx context.Context) error {
	t.handoff.close() // draws what is queued; later Reports draw on the caller
	errs := []error{t.tp.Shutdown(ctx), t.mp.Shutdown(ctx)}
	if t.flows.lp != nil {
		errs = append(errs, t.flows.lp.Shutdown(ctx))
	}
	return errors.Join(errs...)
}
