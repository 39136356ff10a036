package telemetry

import (
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Instrument names, all in the npagent.* namespace. Prometheus sees them with dots
// turned into underscores, the unit appended (_seconds) and _total on counters.
const (
	// LatencyName is the programming latency histogram: commit time minus trigger
	// time, one observation per reported trigger.
	LatencyName = "npagent.policy.programming.latency"
	// SuppressedName counts observations the seen-set suppressed, by reason.
	SuppressedName = "npagent.policy.programming.suppressed"
	// RejectedName counts records Report could not turn into an observation
	// (reason clock_skew: commit before trigger; no_commit: no attempt or no
	// trigger time).
	RejectedName = "npagent.policy.programming.rejected"
	// DeliveriesName counts informer deliveries by cause.
	DeliveriesName = "npagent.policy.deliveries"
	// InvalidObjectsName counts objects rejected for bad input, by field.
	InvalidObjectsName = "npagent.policy.invalid_objects"
	// TraceparentInvalidName counts traceparent annotations that did not parse;
	// the root span of such a record starts a trace of its own.
	TraceparentInvalidName = "npagent.policy.traceparent.invalid"
	// CommitDurationName is the duration of each dataplane commit attempt.
	CommitDurationName = "npagent.dataplane.commit.duration"
	// CommitFailuresName counts failed dataplane commit attempts.
	CommitFailuresName = "npagent.dataplane.commit.failures"
	// SeenObjectsName and SeenPendingName are the seen-set's size: objects
	// tracked, and trigger times pending a commit.
	SeenObjectsName = "npagent.seen.objects"
	SeenPendingName = "npagent.seen.pending"
	// SpansDroppedName counts spans that never reached the collector (queue full
	// or export failed after retries).
	SpansDroppedName = "npagent.telemetry.spans.dropped"
	// MetricExportsFailedName counts failed OTLP metric export rounds.
	MetricExportsFailedName = "npagent.telemetry.metric_exports.failed"
)

// Attribute keys.
const (
	KindKey    = attribute.Key("npagent.policy.kind")
	ReasonKey  = attribute.Key("reason")
	CauseKey   = attribute.Key("cause")
	FieldKey   = attribute.Key("field")
	OutcomeKey = attribute.Key("npagent.commit.outcome")
)

// Histogram aggregation of the latency and commit-duration instruments: the
// exponential layout keeps a relative error of about 2^(2^-scale)-1 over any range
// without a bucket layout to choose; MaxSize 160 holds a 2^5 (scale 5) resolution
// across a factor of 30 in latency, scale 4 across a factor of 1000.
const (
	histogramMaxSize  = 160
	histogramMaxScale = 20
)

// maxCachedPairs caps the distinct attribute pairs per instrument. Label values
// come from the code (kinds, reasons, causes, field names), so the cap only bites
// on a bug; beyond it values fold into "other" and cardinality stays bounded.
const maxCachedPairs = 64

const otherValue = "other"

// measureOptions is a pre-built attribute set wrapped as the option kinds, so
// recording with it allocates nothing, and the running total of a counter
// kept under that set.
type measureOptions struct {
	rec     []metric.RecordOption
	observe []metric.ObserveOption
	total   atomic.Int64
}

func newMeasureOptions(set attribute.Set) *measureOptions {
	opt := metric.WithAttributeSet(set)
	return &measureOptions{rec: []metric.RecordOption{opt}, observe: []metric.ObserveOption{opt}}
}

// counter is a monotonic count per attribute pair, kept in atomics on the
// caller's side and read by the meter at each collection (an observable
// counter; exported like a synchronous one: a cumulative monotonic sum).
//
// Why not a synchronous Int64Counter: its Add looks the attribute set up in the
// SDK's aggregation map under a lock; on the reconcile path, with the caches cold
// from the commit's system calls, that measured about 1 µs per call in
// BenchmarkTelemetryOverheadPaired. Here a call is one atomic add on a
// pre-built entry. A pair never counted is not exported, as with Add.
type counter struct {
	inst  metric.Int64ObservableCounter
	attrs *attrCache
}

func (c *counter) add(kind, value string) { c.attrs.get(kind, value).total.Add(1) }

// observe reports every counted pair's total; the meter calls it, through the
// callback New registers, on each collection.
func (c *counter) observe(o metric.Observer) {
	c.attrs.mu.RLock()
	defer c.attrs.mu.RUnlock()
	for _, m := range c.attrs.entries {
		if n := m.total.Load(); n > 0 {
			o.ObserveInt64(c.inst, n, m.observe...)
		}
	}
}

// attrCache maps an attribute pair (kind plus one more, or kind alone) to its
// pre-built measureOptions. Lookups take a read lock and allocate nothing.
type attrCache struct {
	kindKey, otherKey attribute.Key // otherKey "" means the set holds the kind alone
	mu                sync.RWMutex
	entries           map[[2]string]*measureOptions
}

func newAttrCache(otherKey attribute.Key, warm ...[2]string) *attrCache {
	c := &attrCache{kindKey: KindKey, otherKey: otherKey, entries: make(map[[2]string]*measureOptions)}
	c.insert([2]string{otherValue, otherValue})
	for _, kind := range []string{KindPolicyEndpoint, KindClusterPolicyEndpoint} {
		for _, w := range warm {
			c.insert([2]string{kind, w[1]})
		}
		if len(warm) == 0 {
			c.insert([2]string{kind, ""})
		}
	}
	return c
}

func (c *attrCache) insert(k [2]string) *measureOptions {
	kvs := []attribute.KeyValue{c.kindKey.String(k[0])}
	if c.otherKey != "" {
		kvs = append(kvs, c.otherKey.String(k[1]))
	}
	m := newMeasureOptions(attribute.NewSet(kvs...))
	c.entries[k] = m
	return m
}

func (c *attrCache) get(kind, value string) *measureOptions {
	k := [2]string{kind, value}
	c.mu.RLock()
	m, ok := c.entries[k]
	c.mu.RUnlock()
	if ok {
		return m
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if m, ok := c.entries[k]; ok {
		return m
	}
	if len(c.entries) >= maxCachedPairs {
		return c.entries[[2]string{otherValue, otherValue}]
	}
	return c.insert(k)
}

// pairs builds warm-up keys for newAttrCache from the values the loop is known
// to use.
func pairs(values ...string) [][2]string {
	out := make([][2]string, len(values))
	for i, v := range values {
		out[i] = [2]string{"", v}
	}
	return out
}
