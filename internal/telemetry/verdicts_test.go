package telemetry

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	colmetricspb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"

	"github.com/npagent/npagent/internal/testenv"
	"github.com/npagent/npagent/internal/testenv/otlptest"
)

// verdictPoints returns the packets counter's points by their attributes.
func verdictPoints(t *testing.T, rm metricdata.ResourceMetrics) map[string]int64 {
	t.Helper()
	m, ok := findMetric(rm, VerdictsName)
	if !ok {
		t.Fatalf("no %s metric", VerdictsName)
	}
	sum, ok := m.Data.(metricdata.Sum[int64])
	if !ok || !sum.IsMonotonic || sum.Temporality != metricdata.CumulativeTemporality {
		t.Fatalf("%s = %+v, want a cumulative monotonic sum", VerdictsName, m.Data)
	}
	out := map[string]int64{}
	for _, p := range sum.DataPoints {
		out[p.Attributes.Encoded(attribute.DefaultEncoder())] = p.Value
	}
	return out
}

// A verdict counter is one series with its pod, direction, verdict, reason, policy
// and rule, on the OTel counter and on /metrics (with its bytes).
func TestVerdictsExported(t *testing.T) {
	tel := newInMemory(t)
	counts := VerdictCounts{Counts: []Verdict{
		{Direction: "ingress", Denied: true, Reason: "admin_deny", Namespace: "shop", Pod: "web-1",
			PolicyKind: "ClusterPolicyEndpoint", PolicyName: "deny-metadata", Rule: 0, Packets: 3, Bytes: 180},
		{Direction: "egress", Reason: "policy_allow", Namespace: "shop", Pod: "web-1",
			PolicyKind: "PolicyEndpoint", PolicyName: "web", Rule: -1, Packets: 7, Bytes: 700},
	}, Lost: 2}
	if err := tel.ObserveVerdicts(func() VerdictCounts { return counts }); err != nil {
		t.Fatal(err)
	}
	rm := tel.collect(t)
	if got := counterValue(t, rm, VerdictsName, DirectionKey.String("ingress"), VerdictKey.String("deny"),
		VerdictReasonKy.String("admin_deny"), NamespaceKey.String("shop"), PodKey.String("web-1"),
		KindKey.String("ClusterPolicyEndpoint"), PolicyNameKey.String("deny-metadata"), RuleKey.String("0")); got != 3 {
		t.Errorf("admin deny packets %d, want 3", got)
	}
	if got := counterValue(t, rm, VerdictBytesName, DirectionKey.String("egress"), VerdictKey.String("allow"),
		VerdictReasonKy.String("policy_allow"), PolicyNameKey.String("web")); got != 700 {
		t.Errorf("policy allow bytes %d, want 700", got)
	}
	if got := counterValue(t, rm, VerdictsLostName); got != 2 {
		t.Errorf("lost %d, want 2", got)
	}
	counts.Counts[0].Packets = 5
	body := scrape(t, tel)
	found := false
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, "npagent_policy_verdicts_total{") && strings.HasSuffix(line, "} 5") &&
			strings.Contains(line, `npagent_verdict_reason="admin_deny"`) && strings.Contains(line, `k8s_pod_name="web-1"`) &&
			strings.Contains(line, `npagent_policy_name="deny-metadata"`) && strings.Contains(line, `npagent_policy_rule="0"`) {
			found = true
		}
	}
	if !found {
		t.Errorf("/metrics has no admin deny sample of 5:\n%s", body)
	}
}

// More series than the bound: at most the bound plus the overflow series (one per
// direction and verdict) are exported, the folded ones summed there and counted,
// and the overflow series never goes down when a folded counter goes away.
func TestVerdictSeriesBounded(t *testing.T) {
	const limit = 10
	tel := newInMemory(t, WithVerdictSeriesLimit(limit))
	var counts VerdictCounts
	for pod := range 40 { // 40 pods × 3 rules = 120 series
		for rule := range 3 {
			counts.Counts = append(counts.Counts, Verdict{Direction: "ingress", Denied: true, Reason: "admin_deny",
				Namespace: "ns", Pod: fmt.Sprintf("pod-%d", pod), PolicyKind: "ClusterPolicyEndpoint", PolicyName: "c", Rule: rule, Packets: 1, Bytes: 100})
		}
	}
	var mu sync.Mutex
	if err := tel.ObserveVerdicts(func() VerdictCounts {
		mu.Lock()
		defer mu.Unlock()
		return VerdictCounts{Counts: append([]Verdict(nil), counts.Counts...)}
	}); err != nil {
		t.Fatal(err)
	}
	check := func(what string, wantTotal, wantOverflow int64) {
		t.Helper()
		rm := tel.collect(t)
		pts := verdictPoints(t, rm)
		if len(pts) > limit+1 {
			t.Errorf("%s: %d series, want at most %d and the overflow series", what, len(pts), limit)
		}
		var total int64
		for _, v := range pts {
			total += v
		}
		if total != wantTotal {
			t.Errorf("%s: series sum to %d packets, want %d (nothing lost to the bound)", what, total, wantTotal)
		}
		if got := counterValue(t, rm, VerdictsName, OverflowKey.Bool(true)); got != wantOverflow {
			t.Errorf("%s: overflow series %d, want %d", what, got, wantOverflow)
		}
		if got := counterValue(t, rm, VerdictSeriesOverflowName); got != int64(len(counts.Counts)-limit) {
			t.Errorf("%s: %d series counted as folded, want %d", what, got, len(counts.Counts)-limit)
		}
	}
	check("first collection", 120, 110)
	mu.Lock()
	for i := range counts.Counts {
		counts.Counts[i].Packets = 2
	}
	mu.Unlock()
	check("every counter grew", 240, 220)
	// A folded counter's pod goes away: its counts stay in the overflow series.
	mu.Lock()
	counts.Counts = counts.Counts[:len(counts.Counts)-1]
	mu.Unlock()
	rm := tel.collect(t)
	if got := counterValue(t, rm, VerdictsName, OverflowKey.Bool(true)); got != 220 {
		t.Errorf("after a folded counter went away: overflow series %d, want 220 (never down)", got)
	}
}

// The verdict counter reaches a real collector over OTLP.
func TestVerdictsThroughRealCollector(t *testing.T) {
	var mu sync.Mutex
	got := map[string]int64{}
	sink := otlptest.NewSink(t, nil, func(req *colmetricspb.ExportMetricsServiceRequest) {
		mu.Lock()
		defer mu.Unlock()
		for _, rm := range req.GetResourceMetrics() {
			for _, sm := range rm.GetScopeMetrics() {
				for _, m := range sm.GetMetrics() {
					if m.GetName() != VerdictsName || !m.GetSum().GetIsMonotonic() {
						continue
					}
					for _, p := range m.GetSum().GetDataPoints() {
						for _, kv := range p.GetAttributes() {
							if kv.GetKey() == string(VerdictReasonKy) {
								got[kv.GetValue().GetStringValue()] = p.GetAsInt()
							}
						}
					}
				}
			}
		}
	})
	col := otlptest.StartCollector(t, sink.URL)
	tel := newCollectorTelemetry(t, col)
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	if err := tel.ObserveVerdicts(func() VerdictCounts {
		return VerdictCounts{Counts: []Verdict{{Direction: "ingress", Denied: true, Reason: "default_deny",
			Namespace: "shop", Pod: "web-1", PolicyKind: "PolicyEndpoint", PolicyName: "web", Rule: -1, Packets: 9, Bytes: 900}}}
	}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the verdict counter's default_deny point (9) at the collector's sink", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return got["default_deny"] == 9
	})
}

// Audit mode says so: a gauge of 1 (0 otherwise), and the policy's would-be denials
// are their own verdict, would_deny.
func TestAuditModeExported(t *testing.T) {
	if got := counterValue(t, newInMemory(t).collect(t), AuditModeName); got != 0 {
		t.Errorf("audit mode gauge %d without it, want 0", got)
	}
	tel := newInMemory(t, WithAuditMode(true))
	if err := tel.ObserveVerdicts(func() VerdictCounts {
		return VerdictCounts{Counts: []Verdict{{Direction: "ingress", Denied: true, Audited: true, Reason: "default_deny",
			Namespace: "shop", Pod: "web-1", PolicyKind: "PolicyEndpoint", PolicyName: "web", Rule: -1, Packets: 4, Bytes: 400}}}
	}); err != nil {
		t.Fatal(err)
	}
	rm := tel.collect(t)
	if got := counterValue(t, rm, AuditModeName); got != 1 {
		t.Errorf("audit mode gauge %d, want 1", got)
	}
	if got := counterValue(t, rm, VerdictsName, VerdictKey.String("would_deny"), VerdictReasonKy.String("default_deny")); got != 4 {
		t.Errorf("would_deny packets %d, want 4", got)
	}
}
