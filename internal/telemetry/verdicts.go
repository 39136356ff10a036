package telemetry

import (
	"context"
	"strconv"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Verdict counters: what the dataplane decided, read from it at collection
// (ObserveVerdicts) and exported as one monotonic counter of packets and one of
// bytes, with bounded attributes.
const (
	// VerdictsName counts packets the dataplane judged, by pod, direction, verdict
	// and what decided it.
	VerdictsName = "npagent.policy.verdicts"
	// VerdictBytesName is the same in bytes.
	VerdictBytesName = "npagent.policy.verdict.bytes"
	// VerdictSeriesOverflowName counts the verdict counters beyond the series
	// bound (WithVerdictSeriesLimit), exported folded into one overflow series.
	VerdictSeriesOverflowName = "npagent.policy.verdicts.overflowed"
	// VerdictsLostName counts packets the dataplane could not count (its counter
	// map full).
	VerdictsLostName = "npagent.policy.verdicts.lost"
	// AuditModeName is 1 while the dataplane runs in audit mode (policy denials
	// pass, counted as would_deny), else 0.
	AuditModeName = "npagent.dataplane.audit_mode"

	DirectionKey    = attribute.Key("npagent.verdict.direction")
	VerdictKey      = attribute.Key("npagent.verdict")
	VerdictReasonKy = attribute.Key("npagent.verdict.reason")
	NamespaceKey    = attribute.Key("k8s.namespace.name")
	PodKey          = attribute.Key("k8s.pod.name")
	RuleKey         = attribute.Key("npagent.policy.rule")
	OverflowKey     = attribute.Key("otel.metric.overflow")
)

// DefaultVerdictSeriesLimit is the default bound on verdict series per node.
const DefaultVerdictSeriesLimit = 2000

// Verdict is one verdict counter as its owner reads it (totals since the
// dataplane opened), named for export.
type Verdict struct {
	Direction  string // ingress or egress
	Denied     bool
	Audited    bool   // denied by the policy but passed (audit mode): verdict would_deny
	Reason     string // what decided (the dataplane's reason)
	Namespace  string // the pod's; empty when unknown
	Pod        string
	PolicyKind string // the deciding object's kind and name; empty when none
	PolicyName string
	Rule       int // the deciding rule's index in its object; -1 when none
	Packets    uint64
	Bytes      uint64
}

// VerdictCounts are the verdict counters at one collection.
type VerdictCounts struct {
	Counts []Verdict
	Lost   uint64 // packets the dataplane could not count
}

// verdictSeries is a Verdict's identity (its attributes).
type verdictSeries struct {
	direction, reason, namespace, pod, kind, name string
	denied, audited                               bool
	rule                                          int
}

// verdictExport keeps the series bound: series are admitted in the order first
// seen, up to limit, and stay admitted while their owner reports them (a
// cumulative counter's series must not move); later ones are folded into one overflow series per direction and
// verdict. The overflow series' totals are kept as sums of increases, so a folded
// counter that disappears (its pod removed) never makes them go down.
type verdictExport struct {
	mu        sync.Mutex
	limit     int
	admitted  map[verdictSeries]*measureOptions
	folded    map[verdictSeries][2]uint64 // last packets and bytes seen
	overflow  [2][3][2]uint64             // [direction ingress/egress][verdictIndex][packets, bytes]
	overSets  [2][3]*measureOptions
	packets   metric.Int64ObservableCounter
	bytes     metric.Int64ObservableCounter
	overflown metric.Int64ObservableGauge
	lost      metric.Int64ObservableCounter
	read      func() VerdictCounts
}

// verdictWords are the verdict attribute's values, by verdictIndex.
var verdictWords = [3]string{"allow", "deny", "would_deny"}

func verdictIndex(denied, audited bool) int {
	switch {
	case audited:
		return 2
	case denied:
		return 1
	}
	return 0
}

// ObserveVerdicts registers read, which returns the dataplane's verdict counters
// on each collection, from the collecting goroutine. The first call registers the
// instruments; a later call replaces read.
func (t *Telemetry) ObserveVerdicts(read func() VerdictCounts) error {
	v := &t.verdicts
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.read != nil {
		v.read = read
		return nil
	}
	v.read = read
	v.limit = t.cfg.verdictSeries
	if v.limit <= 0 {
		v.limit = DefaultVerdictSeriesLimit
	}
	v.admitted, v.folded = map[verdictSeries]*measureOptions{}, map[verdictSeries][2]uint64{}
	for d, dir := range [2]string{"ingress", "egress"} {
		for vi, word := range verdictWords {
			v.overSets[d][vi] = newMeasureOptions(DirectionKey.String(dir), VerdictKey.String(word), OverflowKey.Bool(true))
		}
	}
	m := t.mp.Meter(ScopeName)
	var err error
	if v.packets, err = m.Int64ObservableCounter(VerdictsName, metric.WithUnit("{packet}"),
		metric.WithDescription("Packets the dataplane judged, by pod, direction, verdict (allow, deny) and what decided it: reason, and the deciding policy and rule when one did.")); err != nil {
		return err
	}
	if v.bytes, err = m.Int64ObservableCounter(VerdictBytesName, metric.WithUnit("By"),
		metric.WithDescription("Bytes of the packets npagent.policy.verdicts counts, with the same attributes.")); err != nil {
		return err
	}
	if v.overflown, err = m.Int64ObservableGauge(VerdictSeriesOverflowName, metric.WithUnit("{series}"),
		metric.WithDescription("Verdict series beyond the bound (--verdict-series-limit), exported folded into the otel.metric.overflow series.")); err != nil {
		return err
	}
	if v.lost, err = m.Int64ObservableCounter(VerdictsLostName, metric.WithUnit("{packet}"),
		metric.WithDescription("Packets whose verdict the dataplane could not count: its counter map was full.")); err != nil {
		return err
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		v.observe(o)
		return nil
	}, v.packets, v.bytes, v.overflown, v.lost)
	return err
}

func (v *verdictExport) observe(o metric.Observer) {
	v.mu.Lock()
	defer v.mu.Unlock()
	vc := v.read()
	// One total per series, in the order the owner lists them (admission order).
	agg := map[verdictSeries][2]uint64{}
	var order []verdictSeries
	for i := range vc.Counts {
		c := &vc.Counts[i]
		s := verdictSeries{direction: c.Direction, reason: c.Reason, namespace: c.Namespace, pod: c.Pod,
			kind: c.PolicyKind, name: c.PolicyName, denied: c.Denied, audited: c.Audited, rule: c.Rule}
		n, ok := agg[s]
		if !ok {
			order = append(order, s)
		}
		agg[s] = [2]uint64{n[0] + c.Packets, n[1] + c.Bytes}
	}
	type sum struct{ packets, bytes uint64 }
	sums := map[*measureOptions]*sum{}
	for _, s := range order {
		cur := agg[s]
		set, ok := v.admitted[s]
		if _, wasFolded := v.folded[s]; !ok && !wasFolded && len(v.admitted) < v.limit {
			set = newMeasureOptions(s.attributes()...)
			v.admitted[s] = set
			ok = true
		}
		if ok {
			sums[set] = &sum{cur[0], cur[1]}
			continue
		}
		// Folded: add what it counted since the last collection (all of it if it
		// went down: its owner started it again).
		last := v.folded[s]
		dp, db := cur[0]-last[0], cur[1]-last[1]
		if cur[0] < last[0] || cur[1] < last[1] {
			dp, db = cur[0], cur[1]
		}
		d := 0
		if s.direction == "egress" {
			d = 1
		}
		vi := verdictIndex(s.denied, s.audited)
		v.overflow[d][vi][0] += dp
		v.overflow[d][vi][1] += db
		v.folded[s] = cur
	}
	for s := range v.folded {
		if _, ok := agg[s]; !ok {
			delete(v.folded, s) // gone; its counts stay in the overflow totals
		}
	}
	for s := range v.admitted {
		if _, ok := agg[s]; !ok {
			delete(v.admitted, s) // gone (its pod removed): its room goes to a new series
		}
	}
	for set, n := range sums {
		o.ObserveInt64(v.packets, int64(n.packets), set.observe...)
		o.ObserveInt64(v.bytes, int64(n.bytes), set.observe...)
	}
	for d := range v.overflow {
		for den := range v.overflow[d] {
			if p := v.overflow[d][den]; p[0] > 0 {
				o.ObserveInt64(v.packets, int64(p[0]), v.overSets[d][den].observe...)
				o.ObserveInt64(v.bytes, int64(p[1]), v.overSets[d][den].observe...)
			}
		}
	}
	o.ObserveInt64(v.overflown, int64(len(v.folded)))
	o.ObserveInt64(v.lost, int64(vc.Lost))
}

func (s verdictSeries) attributes() []attribute.KeyValue {
	kv := []attribute.KeyValue{DirectionKey.String(s.direction), VerdictKey.String(verdictWords[verdictIndex(s.denied, s.audited)]),
		VerdictReasonKy.String(s.reason)}
	if s.namespace != "" {
		kv = append(kv, NamespaceKey.String(s.namespace))
	}
	if s.pod != "" {
		kv = append(kv, PodKey.String(s.pod))
	}
	if s.name != "" {
		kv = append(kv, KindKey.String(s.kind), PolicyNameKey.String(s.name))
	}
	if s.rule >= 0 {
		kv = append(kv, RuleKey.String(strconv.Itoa(s.rule)))
	}
	return kv
}

// buildAuditGauge registers the AuditModeName gauge (WithAuditMode).
func (t *Telemetry) buildAuditGauge(m metric.Meter) error {
	g, err := m.Int64ObservableGauge(AuditModeName, metric.WithUnit("{mode}"),
		metric.WithDescription("1 while the dataplane runs in audit mode (--audit-mode): packets the policy denies pass and are counted as npagent.policy.verdicts{npagent.verdict=\"would_deny\"}; else 0."))
	if err != nil {
		return err
	}
	on := int64(0)
	if t.cfg.audit {
		on = 1
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(g, on)
		return nil
	}, g)
	return err
}
