package telemetry

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	sdklog "go.opentelemetry.io/otel/sdk/log"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// config holds what New needs. It is built from defaults, then the environment,
// then the options, in that order: explicit options win.
type config struct {
	nodeName       string
	serviceVersion string
	instanceID     string
	otlpSet        bool // WithOTLP was given; otlpEnabled then overrides the environment
	otlpEnabled    bool
	slowThreshold  time.Duration
	fastFraction   float64
	meterInterval  time.Duration
	spanQueueSize  int
	traceExporters []sdktrace.SpanExporter
	metricReaders  []sdkmetric.Reader
	logger         *slog.Logger
	sdkLogs        bool // WithLogger was given: the SDK's own errors go to logger too
	parenting      Parenting
	verdictSeries  int
	audit          bool
	logExporters   []sdklog.Exporter
	logQueueSize   int
}

// Option configures New. Options are sealed: only this package can make them.
type Option func(*config)

const (
	defaultMeterInterval = 10 * time.Second
	defaultSpanQueueSize = 2048
	defaultLogQueueSize  = 2048
)

func defaultConfig() config {
	return config{
		fastFraction:  1,
		meterInterval: envDurationMillis("OTEL_METRIC_EXPORT_INTERVAL", defaultMeterInterval),
		spanQueueSize: envInt("OTEL_BSP_MAX_QUEUE_SIZE", defaultSpanQueueSize),
		logQueueSize:  envInt("OTEL_BLRP_MAX_QUEUE_SIZE", defaultLogQueueSize),
		logger:        slog.New(slog.DiscardHandler),
	}
}

// WithVerdictSeriesLimit bounds the series of the verdict counters
// (ObserveVerdicts): past n, new series are folded into one overflow series per
// direction and verdict (attribute otel.metric.overflow=true) and counted.
// Default DefaultVerdictSeriesLimit.
func WithVerdictSeriesLimit(n int) Option { return func(c *config) { c.verdictSeries = n } }

// WithAuditMode says the dataplane runs in audit mode: the AuditModeName gauge is 1.
// Default false.
func WithAuditMode(on bool) Option { return func(c *config) { c.audit = on } }

// WithNodeName sets k8s.node.name on the resource (over OTEL_RESOURCE_ATTRIBUTES)
// and on every root span. Default: unset (omitted from spans; the resource keeps
// whatever OTEL_RESOURCE_ATTRIBUTES says).
func WithNodeName(name string) Option { return func(c *config) { c.nodeName = name } }

// WithServiceVersion sets service.version on the resource (over
// OTEL_RESOURCE_ATTRIBUTES). Default: unset.
func WithServiceVersion(v string) Option { return func(c *config) { c.serviceVersion = v } }

// WithInstanceID sets service.instance.id on the resource, over
// OTEL_RESOURCE_ATTRIBUTES. Default: OTEL_RESOURCE_ATTRIBUTES's value if it has
// one, else a random UUID per process.
func WithInstanceID(id string) Option { return func(c *config) { c.instanceID = id } }

// WithOTLP turns the OTLP exporters for traces, metrics and logs on or off.
// Default: traces are exported iff OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set, metrics iff OTEL_EXPORTER_OTLP_ENDPOINT
// or OTEL_EXPORTER_OTLP_METRICS_ENDPOINT is set, logs (flow records) iff
// OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_LOGS_ENDPOINT is set;
// OTEL_TRACES_EXPORTER=none, OTEL_METRICS_EXPORTER=none or OTEL_LOGS_EXPORTER=none
// turns a signal off. WithOTLP(true) exports both
// (to localhost:4317, or localhost:4318 for http/protobuf, when no endpoint is
// set). The transport is OTEL_EXPORTER_OTLP_{TRACES_,METRICS_,}PROTOCOL: grpc
// (the default, see defaultProtocol) or http/protobuf.
func WithOTLP(enabled bool) Option {
	return func(c *config) { c.otlpSet, c.otlpEnabled = true, enabled }
}

// WithSampling makes trace sampling latency-aware: every trigger whose latency is at
// least slowThreshold is traced, and fastFraction (0..1) of the faster ones, spread
// evenly (systematic sampling: exactly one in 1/fastFraction). Every trigger is
// still one histogram observation; only kept traces become exemplars. When
// OTEL_TRACES_SAMPLER is set it decides for the fast triggers the fraction
// keeps; slow ones are traced whatever it says (see the package doc).
// Default: keep all (threshold 0, fraction 1).
func WithSampling(slowThreshold time.Duration, fastFraction float64) Option {
	return func(c *config) {
		c.slowThreshold = max(slowThreshold, 0)
		c.fastFraction = min(max(fastFraction, 0), 1)
	}
}

// Parenting is how a trigger's root span relates to the writer's trace context
// (the record's traceparent annotation).
type Parenting int

const (
	// ParentingLink: the root starts a trace of its own with a span link to the
	// writer's context (KEP-5915: parenting would stretch the writer's trace
	// to the slowest node's commit). The default.
	ParentingLink Parenting = iota
	// ParentingChild: the root is a child of the writer's context, in its
	// trace, inheriting its trace state.
	ParentingChild
)

func (p Parenting) String() string {
	if p == ParentingChild {
		return "child"
	}
	return "link"
}

// ParseParenting reads "link" or "child".
func ParseParenting(s string) (Parenting, error) {
	switch s {
	case "link":
		return ParentingLink, nil
	case "child":
		return ParentingChild, nil
	}
	return ParentingLink, fmt.Errorf("trace parenting %q: want link or child", s)
}

// WithTraceParenting sets how a root span relates to a valid traceparent
// annotation: a span link (ParentingLink) or a parent (ParentingChild).
// Default: ParentingLink.
func WithTraceParenting(p Parenting) Option {
	return func(c *config) { c.parenting = p }
}

// WithMeterExportInterval sets how often metrics are exported over OTLP.
// Default: OTEL_METRIC_EXPORT_INTERVAL (milliseconds) if set, else 10s.
func WithMeterExportInterval(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.meterInterval = d
		}
	}
}

// WithSpanQueueSize bounds how many ended spans may wait for export, per
// exporter; a tree that would exceed it is dropped whole and counted. Default:
// OTEL_BSP_MAX_QUEUE_SIZE if set, else 2048.
func WithSpanQueueSize(n int) Option {
	return func(c *config) {
		if n > 0 {
			c.spanQueueSize = n
		}
	}
}

// WithTraceExporter adds a span exporter next to OTLP (for tests: an in-memory
// exporter). It sits behind the same bounded queue and drop accounting as OTLP.
// Default: none.
func WithTraceExporter(e sdktrace.SpanExporter) Option {
	return func(c *config) {
		if e != nil {
			c.traceExporters = append(c.traceExporters, e)
		}
	}
}

// WithLogExporter adds a log record exporter next to OTLP (for tests: an
// in-memory exporter), behind its own batch processor. Default: none.
func WithLogExporter(e sdklog.Exporter) Option {
	return func(c *config) {
		if e != nil {
			c.logExporters = append(c.logExporters, e)
		}
	}
}

// WithLogQueueSize bounds how many flow log records may wait for export, per
// exporter; past it the oldest are dropped (the batch processor's ring). Default:
// OTEL_BLRP_MAX_QUEUE_SIZE if set, else 2048.
func WithLogQueueSize(n int) Option {
	return func(c *config) {
		if n > 0 {
			c.logQueueSize = n
		}
	}
}

// WithMetricReader adds a metric reader next to OTLP and Prometheus (for tests: a
// ManualReader). Default: none.
func WithMetricReader(r sdkmetric.Reader) Option {
	return func(c *config) {
		if r != nil {
			c.metricReaders = append(c.metricReaders, r)
		}
	}
}

// WithLogger sets where export trouble is reported (once per transition from
// healthy to failing, and back) and a /metrics client asking for a text format
// is warned about (once per User-Agent), and routes the OpenTelemetry SDK's own error
// handler and internal log there (process-wide: otel.SetErrorHandler and
// otel.SetLogger). Default: export trouble discarded, the SDK's globals left as
// they are (the standard logger, on stderr).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l != nil {
			c.logger, c.sdkLogs = l, true
		}
	}
}

// otlpTraces and otlpMetrics resolve WithOTLP against the environment.
func (c *config) otlpTraces() bool {
	if c.otlpSet {
		return c.otlpEnabled
	}
	if strings.EqualFold(os.Getenv("OTEL_TRACES_EXPORTER"), "none") {
		return false
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" ||
		os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

func (c *config) otlpMetrics() bool {
	if c.otlpSet {
		return c.otlpEnabled
	}
	if strings.EqualFold(os.Getenv("OTEL_METRICS_EXPORTER"), "none") {
		return false
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" ||
		os.Getenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") != ""
}

// otlpLogs resolves WithOTLP against the environment for logs (the flow records):
// on iff OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_LOGS_ENDPOINT is set,
// unless OTEL_LOGS_EXPORTER=none.
func (c *config) otlpLogs() bool {
	if c.otlpSet {
		return c.otlpEnabled
	}
	if strings.EqualFold(os.Getenv("OTEL_LOGS_EXPORTER"), "none") {
		return false
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" ||
		os.Getenv("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT") != ""
}

// envDurationMillis reads a positive integer of milliseconds, the unit the OTel
// specification gives the OTEL_METRIC_EXPORT_* and OTEL_BSP_* variables.
func envDurationMillis(key string, def time.Duration) time.Duration {
	n := envInt(key, 0)
	if n <= 0 {
		return def
	}
	return time.Duration(n) * time.Millisecond
}

func envInt(key string, def int) int {
	v := strings.TrimSpace(os.Getenv(key))
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return def
	}
	return n
}
