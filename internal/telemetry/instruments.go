package telemetry

import (
	"sync"
	"sync/atomic"

	"github.com/npagent/npagent/internal/report"
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
	// TriggerMissingName counts object versions without the trigger annotation:
	// nothing to measure them by, so a controller that never stamps it leaves the
	// latency histogram empty and this counter says why.
	TriggerMissingName = "npagent.policy.trigger_missing"
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
	// SeenOldestPendingAgeName is the age of the oldest trigger pending a commit
	// (now minus its trigger time; 0 when none): a stuck node shows as a growing
	// age, which the pending count cannot tell from steady churn.
	SeenOldestPendingAgeName = "npagent.seen.oldest_pending.age"
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
//
// MaxScale 8: Prometheus native histograms take schemas up to 8 (a bucket per
// 0.27 %), and a finer point is coarsened on the way in. Only a histogram whose
// observations all lie within a factor of about 1.6 reaches a scale above 8 (a
// quiet node's first few triggers), and then the agent's own /metrics and what
// arrives through the collector would disagree; capped at 8 they are one series,
// and nothing is lost that Prometheus would have kept.
const (
	histogramMaxSize  = 160
	histogramMaxScale = 8
)

// maxFieldSeries caps the distinct field names of the invalid-objects counter.
// Field names come from the code, so the cap only bites on a bug; beyond it
// fields are exported under "other" and cardinality stays bounded.
const maxFieldSeries = 64

const otherValue = "other"

// measureOptions is a pre-built attribute set wrapped as the option kinds, so
// recording or observing with it allocates nothing.
type measureOptions struct {
	rec     []metric.RecordOption
	observe []metric.ObserveOption
}

func newMeasureOptions(kvs ...attribute.KeyValue) *measureOptions {
	opt := metric.WithAttributeSet(attribute.NewSet(kvs...))
	return &measureOptions{rec: []metric.RecordOption{opt}, observe: []metric.ObserveOption{opt}}
}

// byKind holds one attribute set per policy kind.
type byKind [report.NumKinds]*measureOptions

func newByKind(extra ...attribute.KeyValue) byKind {
	var b byKind
	for k := range report.NumKinds {
		b[k] = newMeasureOptions(append([]attribute.KeyValue{KindKey.String(report.Kind(k).String())}, extra...)...)
	}
	return b
}

// kindCounter is a count per policy kind, and per value of at most one more
// attribute, that telemetry keeps itself (what it rejects or fails to parse): an
// atomic total the meter reads at collection, so counting allocates nothing.
type kindCounter struct {
	inst   metric.Int64ObservableCounter
	sets   []byKind // one per value of the extra attribute; one without it
	totals [][report.NumKinds]atomic.Int64
}

// newKindCounter builds the sets: values are the extra attribute's values, none
// for a counter by kind alone.
func newKindCounter(values ...attribute.KeyValue) kindCounter {
	if len(values) == 0 {
		return kindCounter{sets: []byKind{newByKind()}, totals: make([][report.NumKinds]atomic.Int64, 1)}
	}
	c := kindCounter{totals: make([][report.NumKinds]atomic.Int64, len(values))}
	for _, v := range values {
		c.sets = append(c.sets, newByKind(v))
	}
	return c
}

// add counts one for kind k and the extra attribute's value number v.
func (c *kindCounter) add(k report.Kind, v int) {
	if int(k) < report.NumKinds {
		c.totals[v][k].Add(1)
	}
}

func (c *kindCounter) observe(o metric.Observer) {
	for v := range c.totals {
		for k := range c.totals[v] {
			if n := c.totals[v][k].Load(); n > 0 {
				o.ObserveInt64(c.inst, n, c.sets[v][k].observe...)
			}
		}
	}
}

// oldestPendingAge is the SeenOldestPendingAgeName gauge, read from
// report.Counts at each collection like the seen-set's size.
type oldestPendingAge struct{ inst metric.Float64ObservableGauge }

func newOldestPendingAge(m metric.Meter) (oldestPendingAge, error) {
	inst, err := m.Float64ObservableGauge(SeenOldestPendingAgeName, metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest trigger time pending a commit on this node (now minus the trigger time); 0 when none is pending."))
	return oldestPendingAge{inst}, err
}

func (g oldestPendingAge) observe(o metric.Observer, c *report.Counts) {
	o.ObserveFloat64(g.inst, max(c.SeenOldestPendingAge, 0).Seconds())
}

// fieldSets builds, at collection time, the attribute sets of the
// invalid-objects counter, one per (kind, field), bounded by maxFieldSeries.
type fieldSets struct {
	mu   sync.Mutex
	sets map[report.InvalidObject]*measureOptions
}

func (f *fieldSets) get(key report.InvalidObject) *measureOptions {
	f.mu.Lock()
	defer f.mu.Unlock()
	if m, ok := f.sets[key]; ok {
		return m
	}
	if f.sets == nil {
		f.sets = map[report.InvalidObject]*measureOptions{}
	}
	if len(f.sets) >= maxFieldSeries {
		key.Field = otherValue
		if m, ok := f.sets[key]; ok {
			return m
		}
	}
	m := newMeasureOptions(KindKey.String(key.Kind.String()), FieldKey.String(key.Field))
	f.sets[key] = m
	return m
}

// Watch health: per informer (npagent.policy.kind), read from report.Counts.Watch
// at each collection. The stall rule (down past --watch-stall-timeout, or open and
// silent past the watch's timeout plus that) is reconcile's; these export its
// verdict and what it judged from.
const (
	// WatchLastEventAgeName is how long ago the informer last received an event,
	// a bookmark or a list, or opened a watch. On an idle resource this grows up
	// to the watch's timeout (5-10 min): the apiserver sends bookmarks only when
	// its resourceVersion moves. Not exported before the first.
	WatchLastEventAgeName = "npagent.watch.last_event_age"
	// WatchStalledName is 1 while the informer's watch is stalled, else 0.
	WatchStalledName = "npagent.watch.stalled"
	// WatchEstablishedName is 1 while the informer's watch is open, else 0.
	WatchEstablishedName = "npagent.watch.established"
	// WatchErrorsName counts failed list and watch requests, and watches that
	// ended with an error (410 excluded), by request.
	WatchErrorsName = "npagent.watch.errors"
	// WatchRelistsName counts lists after the initial one, by cause (expired:
	// 410, relisted in place; restart: the reflector listed again after its
	// backoff).
	WatchRelistsName = "npagent.watch.relists"

	// RequestKey is the watch errors' request: list or watch.
	RequestKey = attribute.Key("request")
)

// watchInstruments exports report.Counts.Watch.
type watchInstruments struct {
	age         metric.Float64ObservableGauge
	stalled     metric.Int64ObservableGauge
	established metric.Int64ObservableGauge
	errors      metric.Int64ObservableCounter
	relists     metric.Int64ObservableCounter

	kinds      byKind
	requests   [2]byKind // list, watch
	relistSets [report.NumRelistCauses]byKind
}

// build creates the instruments and returns them for the meter's callback.
func (w *watchInstruments) build(m metric.Meter, check func(error)) []metric.Observable {
	var err error
	w.age, err = m.Float64ObservableGauge(WatchLastEventAgeName, metric.WithUnit("s"),
		metric.WithDescription("Time since the informer last received a watch event, a bookmark or a list, or opened a watch."))
	check(err)
	w.stalled, err = m.Int64ObservableGauge(WatchStalledName, metric.WithUnit("{watch}"),
		metric.WithDescription("1 while the informer's watch is stalled (down past --watch-stall-timeout, or silent past its timeout plus that), else 0."))
	check(err)
	w.established, err = m.Int64ObservableGauge(WatchEstablishedName, metric.WithUnit("{watch}"),
		metric.WithDescription("1 while the informer's watch is open, else 0."))
	check(err)
	w.errors, err = m.Int64ObservableCounter(WatchErrorsName, metric.WithUnit("{error}"),
		metric.WithDescription("Failed list and watch requests, and watches ended by an error other than 410, by request."))
	check(err)
	w.relists, err = m.Int64ObservableCounter(WatchRelistsName, metric.WithUnit("{list}"),
		metric.WithDescription("Lists after the informer's initial one, by cause: expired (410), restart (the reflector's own)."))
	check(err)
	w.kinds = newByKind()
	w.requests = [2]byKind{newByKind(RequestKey.String("list")), newByKind(RequestKey.String("watch"))}
	for c := range report.NumRelistCauses {
		w.relistSets[c] = newByKind(CauseKey.String(report.RelistCause(c).String()))
	}
	return []metric.Observable{w.age, w.stalled, w.established, w.errors, w.relists}
}

func (w *watchInstruments) observe(o metric.Observer, c *report.Counts) {
	b := func(v bool) int64 {
		if v {
			return 1
		}
		return 0
	}
	for k, h := range c.Watch {
		if !h.LastEvent.IsZero() {
			o.ObserveFloat64(w.age, h.Age.Seconds(), w.kinds[k].observe...)
		}
		o.ObserveInt64(w.stalled, b(h.Stalled), w.kinds[k].observe...)
		o.ObserveInt64(w.established, b(h.Established), w.kinds[k].observe...)
		o.ObserveInt64(w.errors, int64(h.ListErrors), w.requests[0][k].observe...)
		o.ObserveInt64(w.errors, int64(h.WatchErrors), w.requests[1][k].observe...)
		for cause, n := range h.Relists {
			o.ObserveInt64(w.relists, int64(n), w.relistSets[cause][k].observe...)
		}
	}
}

// Dataplane: what the dataplane and the loop driving it report about enforcement,
// read from report.Counts at each collection.
const (
	// PodsIsolatedName counts pods isolated (denied, node traffic excepted)
	// because their policy could not be committed or an object naming them has no
	// valid version: the fail-closed path, each
	// also logged naming the pod and the object.
	PodsIsolatedName = "npagent.dataplane.pods_isolated"
	// PodsUnisolableName counts endpoints of rejected PolicyEndpoints without a
	// valid version whose hostIP or podIP does not parse: if one is a pod of this
	// node it cannot be found, so it is not isolated (logged naming the object).
	PodsUnisolableName = "npagent.dataplane.pods_unisolable"
	// PodsStrictDeniedName is how many pods strict mode denies now (node traffic
	// excepted) until a policy selecting them is committed (--enforcing-mode=strict).
	PodsStrictDeniedName = "npagent.dataplane.pods_strict_denied"
	// NodeAddrsLeftOutName is how many of the node's own addresses did not fit the
	// dataplane's node set, so are not exempt from policy (the agent is not ready
	// meanwhile, and logs it).
	NodeAddrsLeftOutName = "npagent.dataplane.node_addresses_left_out"
	// MapEntriesName and MapCapacityName are each dataplane map's entries held
	// and capacity, by map (MapKey): a commit that does not fit fails, so their
	// ratio is the alert. Policy maps are shared by every pod of the node.
	MapEntriesName  = "npagent.dataplane.map.entries"
	MapCapacityName = "npagent.dataplane.map.capacity"

	// MapKey names the map: ingress_ipv4, ingress_ipv6, egress_ipv4, egress_ipv6
	// (the policy maps), pods (pods holding state), conntrack (the connection
	// table).
	MapKey = attribute.Key("map")
)

// mapNames are MapKey's values, in the order dataplaneMaps lists the maps.
var mapNames = [6]string{"ingress_ipv4", "ingress_ipv6", "egress_ipv4", "egress_ipv6", "pods", "conntrack"}

// dataplaneMaps lists c's maps in mapNames' order.
func dataplaneMaps(c *report.DataplaneMaps) [6]report.MapUse {
	return [6]report.MapUse{c.Entries[0][0], c.Entries[0][1], c.Entries[1][0], c.Entries[1][1], c.Pods, c.Conntrack}
}

// dataplaneInstruments exports the dataplane's part of report.Counts.
type dataplaneInstruments struct {
	podsIsolated     metric.Int64ObservableCounter
	podsUnisolable   metric.Int64ObservableCounter
	podsStrictDenied metric.Int64ObservableGauge
	nodeAddrsLeft    metric.Int64ObservableGauge
	mapEntries       metric.Int64ObservableGauge
	mapCapacity      metric.Int64ObservableGauge
	mapSets          [len(mapNames)]*measureOptions
}

// build creates the instruments and returns them for the meter's callback.
func (d *dataplaneInstruments) build(m metric.Meter, check func(error)) []metric.Observable {
	var err error
	d.podsIsolated, err = m.Int64ObservableCounter(PodsIsolatedName, metric.WithUnit("{pod}"),
		metric.WithDescription("Pods isolated (denied, node traffic excepted) because their policy could not be committed or an object naming them has no valid version."))
	check(err)
	d.podsUnisolable, err = m.Int64ObservableCounter(PodsUnisolableName, metric.WithUnit("{endpoint}"),
		metric.WithDescription("Endpoints of rejected PolicyEndpoints without a valid version whose hostIP or podIP does not parse: a pod of this node among them cannot be found, so it is not isolated."))
	check(err)
	d.podsStrictDenied, err = m.Int64ObservableGauge(PodsStrictDeniedName, metric.WithUnit("{pod}"),
		metric.WithDescription("Pods strict mode denies (node traffic excepted) until a policy selecting them is committed."))
	check(err)
	d.nodeAddrsLeft, err = m.Int64ObservableGauge(NodeAddrsLeftOutName, metric.WithUnit("{address}"),
		metric.WithDescription("The node's own addresses that did not fit the dataplane's node set, so are not exempt from policy."))
	check(err)
	d.mapEntries, err = m.Int64ObservableGauge(MapEntriesName, metric.WithUnit("{entry}"),
		metric.WithDescription("Entries a dataplane map holds, by map; policy maps are shared by every pod of the node."))
	check(err)
	d.mapCapacity, err = m.Int64ObservableGauge(MapCapacityName, metric.WithUnit("{entry}"),
		metric.WithDescription("Capacity of a dataplane map, by map (--max-entries-ipv4, --max-entries-ipv6); a commit that does not fit fails."))
	check(err)
	for i, name := range mapNames {
		d.mapSets[i] = newMeasureOptions(MapKey.String(name))
	}
	return []metric.Observable{d.podsIsolated, d.podsUnisolable, d.podsStrictDenied, d.nodeAddrsLeft, d.mapEntries, d.mapCapacity}
}

func (d *dataplaneInstruments) observe(o metric.Observer, c *report.Counts) {
	o.ObserveInt64(d.podsIsolated, int64(c.PodsIsolated))
	o.ObserveInt64(d.podsUnisolable, int64(c.PodsUnisolable))
	o.ObserveInt64(d.podsStrictDenied, c.PodsStrictDenied)
	o.ObserveInt64(d.nodeAddrsLeft, c.NodeAddrsLeftOut)
	for i, u := range dataplaneMaps(&c.Maps) {
		if u.Max > 0 { // a map the backend has
			o.ObserveInt64(d.mapEntries, u.Used, d.mapSets[i].observe...)
			o.ObserveInt64(d.mapCapacity, u.Max, d.mapSets[i].observe...)
		}
	}
}
