package telemetry

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/npagent/npagent/internal/report"
	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/encoding/protodelim"
)

var base = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func attrMap(kvs []attribute.KeyValue) map[attribute.Key]attribute.Value {
	m := make(map[attribute.Key]attribute.Value, len(kvs))
	for _, kv := range kvs {
		m[kv.Key] = kv.Value
	}
	return m
}

// TestReportLinksServedWriters: a commit that served several triggers links, from
// each trigger's successful commit span, to the writers of the others (Served);
// a served traceparent that does not parse is skipped, and a failed attempt's
// commit span has no links.
func TestReportLinksServedWriters(t *testing.T) {
	tel := newInMemory(t)
	r := record(base, "pe-1", 400*time.Millisecond)
	r.Attempts = []report.Attempt{
		{Start: base.Add(300 * time.Millisecond), End: base.Add(320 * time.Millisecond), Err: "no space"},
		{Start: base.Add(380 * time.Millisecond), End: base.Add(400 * time.Millisecond)},
	}
	const other = "00-33333333333333333333333333333333-3333333333333333-01"
	r.Served = []string{other, "not a traceparent"}
	tel.Report(r)
	var commits []tracetest.SpanStub
	for _, s := range tel.endedSpans(t) {
		if s.Name == SpanCommit {
			commits = append(commits, s)
		}
	}
	if len(commits) != 2 {
		t.Fatalf("%d commit spans, want 2", len(commits))
	}
	if len(commits[0].Links) != 0 {
		t.Errorf("the failed attempt's commit span has links %v", commits[0].Links)
	}
	links := commits[1].Links
	if len(links) != 1 || links[0].SpanContext.TraceID().String() != "33333333333333333333333333333333" ||
		attrMap(links[0].Attributes)[LinkKindKey] != attribute.StringValue("served") {
		t.Fatalf("successful commit span links %+v, want one served link to trace 3333…", links)
	}
}

// TestReportMarksRemovals: a trigger whose version only removed this node's pods
// (report.Record.RemovedOnly) says so on its root span.
func TestReportMarksRemovals(t *testing.T) {
	tel := newInMemory(t)
	r := record(base, "pe-1", 400*time.Millisecond)
	r.RemovedOnly = true
	tel.Report(r)
	for _, s := range tel.endedSpans(t) {
		if s.Name == SpanProgram {
			if got := attrMap(s.Attributes)[RemovedOnlyKey]; got != attribute.BoolValue(true) {
				t.Fatalf("root attribute %s = %v, want true", RemovedOnlyKey, got.String())
			}
			return
		}
	}
	t.Fatalf("no %q span", SpanProgram)
}

func TestReportSpanTree(t *testing.T) {
	tel := newInMemory(t)
	r := record(base, "pe-1", 400*time.Millisecond)
	// A failed attempt, then the successful retry.
	r.Attempts = []report.Attempt{
		{Start: base.Add(300 * time.Millisecond), End: base.Add(320 * time.Millisecond), Err: "bpf map update: no space left on device"},
		{Start: base.Add(380 * time.Millisecond), End: base.Add(400 * time.Millisecond)},
	}
	tel.Report(r)

	spans := tel.endedSpans(t)
	if len(spans) != 6 {
		t.Fatalf("got %d spans, want 6 (root, delivery, queue, compute, 2 commits): %v", len(spans), names(spans))
	}
	var root tracetest.SpanStub
	byName := map[string][]tracetest.SpanStub{}
	for _, s := range spans {
		byName[s.Name] = append(byName[s.Name], s)
		if s.Name == SpanProgram {
			root = s
		}
	}
	if root.Name == "" {
		t.Fatalf("no %q span among %v", SpanProgram, names(spans))
	}
	if !root.StartTime.Equal(r.Trigger) || !root.EndTime.Equal(r.Committed()) {
		t.Errorf("root span %v..%v, want trigger %v .. commit %v", root.StartTime, root.EndTime, r.Trigger, r.Committed())
	}
	if root.Parent.IsValid() {
		t.Errorf("root span has parent %v, want none (no traceparent)", root.Parent)
	}
	got := attrMap(root.Attributes)
	want := map[attribute.Key]attribute.Value{
		"k8s.node.name":          attribute.StringValue("node-a"),
		"k8s.namespace.name":     attribute.StringValue("team-a"),
		KindKey:                  attribute.StringValue(report.KindPolicyEndpoint.String()),
		PolicyNameKey:            attribute.StringValue("pe-1"),
		PolicyUIDKey:             attribute.StringValue("uid-pe-1"),
		PolicyRefKey:             attribute.StringValue("np-pe-1"),
		PolicyResourceVersionKey: attribute.StringValue("1234"),
		TriggerTimeKey:           attribute.StringValue("2026-03-01T12:00:00Z"),
		AttemptsKey:              attribute.IntValue(2),
		PodsKey:                  attribute.IntValue(3),
		EntriesKey:               attribute.IntValue(17),
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("root attribute %s = %v, want %v", k, got[k].String(), v.String())
		}
	}
	if v, ok := got[RemovedOnlyKey]; ok {
		t.Errorf("root attribute %s = %v on a trigger whose version has local pods", RemovedOnlyKey, v.String())
	}

	phases := []struct {
		name       string
		start, end time.Time
	}{
		{SpanDelivery, r.Trigger, r.Received},
		{SpanQueue, r.Received, r.WorkerStart},
		{SpanCompute, r.ComputeStart, r.ComputeEnd},
	}
	for _, p := range phases {
		ss := byName[p.name]
		if len(ss) != 1 {
			t.Fatalf("%d %q spans, want 1", len(ss), p.name)
		}
		s := ss[0]
		if !s.StartTime.Equal(p.start) || !s.EndTime.Equal(p.end) {
			t.Errorf("%s span %v..%v, want %v..%v", p.name, s.StartTime, s.EndTime, p.start, p.end)
		}
		if s.Parent.SpanID() != root.SpanContext.SpanID() || s.SpanContext.TraceID() != root.SpanContext.TraceID() {
			t.Errorf("%s span is not a child of the root", p.name)
		}
	}
	commits := byName[SpanCommit]
	if len(commits) != 2 {
		t.Fatalf("%d commit spans, want 2", len(commits))
	}
	for i, c := range commits {
		a := r.Attempts[i]
		if !c.StartTime.Equal(a.Start) || !c.EndTime.Equal(a.End) {
			t.Errorf("commit %d span %v..%v, want %v..%v", i+1, c.StartTime, c.EndTime, a.Start, a.End)
		}
		if attrMap(c.Attributes)[AttemptKey] != attribute.IntValue(i+1) {
			t.Errorf("commit %d: attempt attribute %v", i+1, attrMap(c.Attributes)[AttemptKey].String())
		}
		if c.Parent.SpanID() != root.SpanContext.SpanID() {
			t.Errorf("commit %d span is not a child of the root", i+1)
		}
	}
	if commits[0].Status.Code != codes.Error || commits[0].Status.Description != r.Attempts[0].Err {
		t.Errorf("failed attempt status %+v, want Error %q", commits[0].Status, r.Attempts[0].Err)
	}
	if len(commits[0].Events) != 1 || commits[0].Events[0].Name != "exception" {
		t.Errorf("failed attempt events %+v, want one exception event", commits[0].Events)
	}
	if commits[1].Status.Code == codes.Error {
		t.Errorf("successful attempt has error status %+v", commits[1].Status)
	}

	res := attrMap(root.Resource.Attributes())
	for k, v := range map[attribute.Key]string{"service.name": "npagent", "service.version": "v0.0.0-test", "k8s.node.name": "node-a"} {
		if res[k].AsString() != v {
			t.Errorf("resource %s = %q, want %q", k, res[k].AsString(), v)
		}
	}
	if res["service.instance.id"].AsString() == "" || res["host.name"].AsString() == "" {
		t.Errorf("resource lacks service.instance.id or host.name: %v", root.Resource.Attributes())
	}

	// The point: one observation of the true latency, exemplar naming the root.
	pts := latencyPoints(t, tel.collect(t))
	if len(pts) != 1 || pts[0].Count != 1 {
		t.Fatalf("latency points %+v, want one point with count 1", pts)
	}
	if math.Abs(pts[0].Sum-0.4) > 1e-9 {
		t.Errorf("latency sum %v, want 0.4", pts[0].Sum)
	}
	if kind, _ := pts[0].Attributes.Value(KindKey); kind.AsString() != report.KindPolicyEndpoint.String() || pts[0].Attributes.Len() != 1 {
		t.Errorf("latency attributes %v, want only %s=%s", pts[0].Attributes.ToSlice(), KindKey, report.KindPolicyEndpoint)
	}
	if len(pts[0].Exemplars) != 1 {
		t.Fatalf("%d exemplars, want 1", len(pts[0].Exemplars))
	}
	ex := pts[0].Exemplars[0]
	rootTrace, rootSpan := root.SpanContext.TraceID(), root.SpanContext.SpanID()
	if string(ex.TraceID) != string(rootTrace[:]) || string(ex.SpanID) != string(rootSpan[:]) {
		t.Errorf("exemplar trace %x span %x, want root %s %s", ex.TraceID, ex.SpanID, rootTrace, rootSpan)
	}
}

func names(spans tracetest.SpanStubs) []string {
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = s.Name
	}
	return out
}

func TestReportClusterScopedOmitsNamespace(t *testing.T) {
	tel := newInMemory(t)
	r := record(base, "cpe-1", 50*time.Millisecond)
	r.Kind, r.Namespace, r.PolicyRef = report.KindClusterPolicyEndpoint, "", ""
	tel.Report(r)
	spans := tel.endedSpans(t)
	for _, s := range spans {
		if s.Name != SpanProgram {
			continue
		}
		a := attrMap(s.Attributes)
		if _, ok := a["k8s.namespace.name"]; ok {
			t.Errorf("cluster-scoped root span has k8s.namespace.name %v", a["k8s.namespace.name"].String())
		}
		if _, ok := a[PolicyRefKey]; ok {
			t.Errorf("root span without policyRef has %s", PolicyRefKey)
		}
		if a[KindKey].AsString() != report.KindClusterPolicyEndpoint.String() {
			t.Errorf("kind %q", a[KindKey].AsString())
		}
		return
	}
	t.Fatalf("no root span among %v", names(spans))
}

// A valid traceparent annotation: by default (link) the root starts a trace of
// its own with one span link to the writer's context and no parent (KEP-5915);
// with ParentingChild the root is the writer's remote child, in its trace. An
// invalid one is counted and gives neither.
func TestReportTraceparent(t *testing.T) {
	const (
		traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
		spanID  = "00f067aa0ba902b7"
	)
	for _, mode := range []struct {
		name string
		opts []Option
		link bool
	}{
		{"default", nil, true},
		{"link", []Option{WithTraceParenting(ParentingLink)}, true},
		{"child", []Option{WithTraceParenting(ParentingChild)}, false},
	} {
		for _, tc := range []struct {
			name        string
			traceparent string
			valid       bool
			wantInvalid int64
		}{
			{"sampled parent", "00-" + traceID + "-" + spanID + "-01", true, 0},
			// The controller did not sample its own span; the node's part is still kept.
			{"unsampled parent", "00-" + traceID + "-" + spanID + "-00", true, 0},
			{"garbage", "not-a-traceparent", false, 1},
			{"zero trace id", "00-00000000000000000000000000000000-" + spanID + "-01", false, 1},
		} {
			t.Run(mode.name+"/"+tc.name, func(t *testing.T) {
				tel := newInMemory(t, mode.opts...)
				r := record(base, "pe-tp", 100*time.Millisecond)
				r.TraceParent = tc.traceparent
				tel.Report(r)
				var root tracetest.SpanStub
				for _, s := range tel.endedSpans(t) {
					if s.Name == SpanProgram {
						root = s
					}
				}
				if !root.SpanContext.IsValid() {
					t.Fatal("no root span")
				}
				switch {
				case tc.valid && mode.link:
					if root.Parent.IsValid() {
						t.Errorf("root has parent %s/%s, want none (a link)", root.Parent.TraceID(), root.Parent.SpanID())
					}
					if root.SpanContext.TraceID().String() == traceID {
						t.Errorf("root is in the writer's trace %s, want a trace of its own", traceID)
					}
					if len(root.Links) != 1 {
						t.Fatalf("root has %d links, want 1 to the writer's context", len(root.Links))
					}
					l := root.Links[0].SpanContext
					if l.TraceID().String() != traceID || l.SpanID().String() != spanID || !l.IsRemote() ||
						l.IsSampled() != (tc.traceparent[len(tc.traceparent)-1] == '1') {
						t.Errorf("root link %s/%s remote=%v sampled=%v, want the annotation's %s", l.TraceID(), l.SpanID(),
							l.IsRemote(), l.IsSampled(), tc.traceparent)
					}
				case tc.valid:
					if root.Parent.TraceID().String() != traceID || root.Parent.SpanID().String() != spanID || !root.Parent.IsRemote() {
						t.Errorf("root parent %s/%s remote=%v, want %s/%s remote", root.Parent.TraceID(), root.Parent.SpanID(),
							root.Parent.IsRemote(), traceID, spanID)
					}
					if root.SpanContext.TraceID().String() != traceID {
						t.Errorf("root trace id %s, want the annotation's %s", root.SpanContext.TraceID(), traceID)
					}
					if len(root.Links) != 0 {
						t.Errorf("root has links %v in child mode", root.Links)
					}
				default:
					if root.Parent.IsValid() || len(root.Links) != 0 {
						t.Errorf("root has parent %v, links %v from an invalid traceparent", root.Parent, root.Links)
					}
				}
				if got := counterValue(t, tel.collect(t), TraceparentInvalidName); got != tc.wantInvalid {
					t.Errorf("%s = %d, want %d", TraceparentInvalidName, got, tc.wantInvalid)
				}
			})
		}
	}
}

func TestParseParenting(t *testing.T) {
	for in, want := range map[string]Parenting{"link": ParentingLink, "child": ParentingChild} {
		if got, err := ParseParenting(in); err != nil || got != want || got.String() != in {
			t.Errorf("ParseParenting(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "parent", "Child"} {
		if _, err := ParseParenting(bad); err == nil {
			t.Errorf("ParseParenting(%q) accepted", bad)
		}
	}
}

func TestReportClockSkewYieldsNothing(t *testing.T) {
	tel := newInMemory(t)
	r := record(base, "pe-skew", 100*time.Millisecond)
	r.Trigger = r.Committed().Add(time.Millisecond) // the controller's clock is ahead
	tel.Report(r)
	noCommit := record(base, "pe-nocommit", 100*time.Millisecond)
	noCommit.Attempts = nil
	tel.Report(noCommit)

	if spans := tel.endedSpans(t); len(spans) != 0 {
		t.Errorf("got spans %v, want none", names(spans))
	}
	rm := tel.collect(t)
	for _, p := range latencyPoints(t, rm) {
		if p.Count != 0 {
			t.Errorf("latency point with count %d, want no observation", p.Count)
		}
	}
	if got := counterValue(t, rm, RejectedName, ReasonKey.String("clock_skew"), KindKey.String(report.KindPolicyEndpoint.String())); got != 1 {
		t.Errorf("rejected{clock_skew} = %d, want 1", got)
	}
	if got := counterValue(t, rm, RejectedName, ReasonKey.String("no_commit")); got != 1 {
		t.Errorf("rejected{no_commit} = %d, want 1", got)
	}
}

func TestReportZeroLatencyIsKept(t *testing.T) {
	// Trigger == commit is not skew: a 0 s observation is counted.
	tel := newInMemory(t)
	r := record(base, "pe-zero", 0)
	tel.Report(r)
	pts := latencyPoints(t, tel.collect(t))
	if len(pts) != 1 || pts[0].Count != 1 || pts[0].ZeroCount != 1 {
		t.Fatalf("points %+v, want one observation in the zero bucket", pts)
	}
}

func TestLatencyAwareSampling(t *testing.T) {
	const (
		slow, fast = 40, 400
		fraction   = 0.25
	)
	tel := newInMemory(t, WithSampling(100*time.Millisecond, fraction))
	for i := range slow + fast {
		latency := 10 * time.Millisecond
		if i%11 == 0 && i/11 < slow {
			latency = 250 * time.Millisecond
		}
		tel.Report(record(base.Add(time.Duration(i)*time.Second), fmt.Sprintf("pe-%d", i), latency))
	}
	kept := map[trace.TraceID]time.Duration{}
	for _, s := range tel.endedSpans(t) {
		if s.Name == SpanProgram {
			kept[s.SpanContext.TraceID()] = s.EndTime.Sub(s.StartTime)
		}
	}
	var keptSlow, keptFast int
	for _, d := range kept {
		if d >= 100*time.Millisecond {
			keptSlow++
		} else {
			keptFast++
		}
	}
	if keptSlow != slow {
		t.Errorf("kept %d slow traces, want all %d", keptSlow, slow)
	}
	if want := int(fast * fraction); keptFast != want {
		t.Errorf("kept %d fast traces, want exactly %d (systematic %v)", keptFast, want, fraction)
	}

	pts := latencyPoints(t, tel.collect(t))
	if len(pts) != 1 || pts[0].Count != slow+fast {
		t.Fatalf("latency points %+v, want one point counting all %d triggers", pts, slow+fast)
	}
	if len(pts[0].Exemplars) == 0 {
		t.Fatal("no exemplars")
	}
	for _, ex := range pts[0].Exemplars {
		if _, ok := kept[trace.TraceID(ex.TraceID)]; !ok {
			t.Errorf("exemplar (value %v) names trace %x, which was not kept", ex.Value, ex.TraceID)
		}
	}
}

func TestSamplingDropAllFastKeepsCountNoExemplars(t *testing.T) {
	tel := newInMemory(t, WithSampling(time.Second, 0))
	for i := range 50 {
		tel.Report(record(base, fmt.Sprintf("pe-%d", i), 20*time.Millisecond))
	}
	if spans := tel.endedSpans(t); len(spans) != 0 {
		t.Errorf("%d spans, want none (fraction 0, all fast)", len(spans))
	}
	pts := latencyPoints(t, tel.collect(t))
	if len(pts) != 1 || pts[0].Count != 50 {
		t.Fatalf("points %+v, want count 50", pts)
	}
	if len(pts[0].Exemplars) != 0 {
		t.Errorf("%d exemplars for discarded traces, want 0", len(pts[0].Exemplars))
	}
}

// The counts their owners keep (reconcile's deliveries and invalid objects, the
// seen-set's suppressions and size) are exported from the snapshot ObserveCounts
// fills at each collection, each under its own attribute set.
func TestCountsExportedFromTheirOwners(t *testing.T) {
	tel := newInMemory(t)
	var c report.Counts
	c.Suppressed[report.Redelivered] = 1002
	c.Suppressed[report.NoLocalPods] = 3
	c.Deliveries[report.KindClusterPolicyEndpoint][report.CauseResync] = 1002
	c.InvalidObjects = map[report.InvalidObject]uint64{{Kind: report.KindPolicyEndpoint, Field: "spec.ingress.cidr"}: 2}
	c.SeenObjects, c.SeenPending = 42, 7
	tel.ObserveCounts(func(dst *report.Counts) { *dst = c })
	rm := tel.collect(t)
	if got := counterValue(t, rm, SuppressedName, ReasonKey.String("redelivered")); got != 1002 {
		t.Errorf("suppressed{redelivered} = %d, want 1002", got)
	}
	if got := counterValue(t, rm, SuppressedName, ReasonKey.String("no_local_pods")); got != 3 {
		t.Errorf("suppressed{no_local_pods} = %d, want 3", got)
	}
	if got := counterValue(t, rm, DeliveriesName, CauseKey.String("resync"), KindKey.String(report.KindClusterPolicyEndpoint.String())); got != 1002 {
		t.Errorf("deliveries{resync} = %d, want 1002", got)
	}
	if got := counterValue(t, rm, InvalidObjectsName, FieldKey.String("spec.ingress.cidr"), KindKey.String(report.KindPolicyEndpoint.String())); got != 2 {
		t.Errorf("invalid_objects{spec.ingress.cidr} = %d, want 2", got)
	}
	if got := counterValue(t, rm, SeenObjectsName); got != 42 {
		t.Errorf("seen objects %d, want 42", got)
	}
	if got := counterValue(t, rm, SeenPendingName); got != 7 {
		t.Errorf("seen pending %d, want 7", got)
	}
}

// Field names are bounded by the code; a bug that made them unbounded still
// exports at most maxFieldSeries series, the rest summed under "other".
func TestAttributeCardinalityIsCapped(t *testing.T) {
	tel := newInMemory(t)
	invalid := map[report.InvalidObject]uint64{}
	for i := range 3 * maxFieldSeries {
		invalid[report.InvalidObject{Kind: report.KindPolicyEndpoint, Field: fmt.Sprintf("spec.field%d", i)}] = 1
	}
	tel.ObserveCounts(func(dst *report.Counts) { dst.InvalidObjects = invalid })
	m, ok := findMetric(tel.collect(t), InvalidObjectsName)
	if !ok {
		t.Fatal("no invalid-objects metric")
	}
	points := m.Data.(metricdata.Sum[int64]).DataPoints
	if n := len(points); n > maxFieldSeries+1 {
		t.Errorf("%d series, want at most %d", n, maxFieldSeries+1)
	}
	var sum int64
	for _, p := range points {
		sum += p.Value
	}
	if sum != 3*maxFieldSeries {
		t.Errorf("invalid objects sum to %d over the series, want %d (nothing lost to the cap)", sum, 3*maxFieldSeries)
	}
}

func TestCommittedAndGauges(t *testing.T) {
	tel := newInMemory(t)
	tel.Committed(report.KindPolicyEndpoint, attempt(base, 3*time.Millisecond, ""))
	tel.Committed(report.KindPolicyEndpoint, attempt(base, 12*time.Millisecond, "map full"))
	tel.ObserveCounts(func(c *report.Counts) { c.SeenObjects, c.SeenPending = 42, 7 })

	rm := tel.collect(t)
	if got := counterValue(t, rm, CommitFailuresName, KindKey.String(report.KindPolicyEndpoint.String())); got != 1 {
		t.Errorf("commit failures %d, want 1", got)
	}
	if got := counterValue(t, rm, SeenObjectsName); got != 42 {
		t.Errorf("seen objects %d, want 42", got)
	}
	if got := counterValue(t, rm, SeenPendingName); got != 7 {
		t.Errorf("seen pending %d, want 7", got)
	}
	m, ok := findMetric(rm, CommitDurationName)
	if !ok {
		t.Fatal("no commit duration metric")
	}
	var total uint64
	for _, p := range m.Data.(metricdata.ExponentialHistogram[float64]).DataPoints {
		total += p.Count
	}
	if total != 2 {
		t.Errorf("commit duration count %d, want 2", total)
	}
}

func TestMetricsHandlerServesNativeHistogram(t *testing.T) {
	tel := newInMemory(t)
	const n = 25
	for i := range n {
		tel.Report(record(base, fmt.Sprintf("pe-%d", i), time.Duration(i+1)*10*time.Millisecond))
	}
	srv := httptest.NewServer(tel.MetricsHandler())
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
	req.Header.Set("Accept", "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	var found *dto.MetricFamily
	for {
		mf := &dto.MetricFamily{}
		if err := protodelim.UnmarshalFrom(br, mf); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatalf("decoding protobuf exposition (content type %q): %v", resp.Header.Get("Content-Type"), err)
		}
		if mf.GetName() == "npagent_policy_programming_latency_seconds" {
			found = mf
		}
	}
	if found == nil {
		t.Fatal("npagent_policy_programming_latency_seconds not in the protobuf exposition")
	}
	if found.GetType() != dto.MetricType_HISTOGRAM || len(found.Metric) != 1 {
		t.Fatalf("family type %v with %d metrics", found.GetType(), len(found.Metric))
	}
	h := found.Metric[0].GetHistogram()
	if h.GetSampleCount() != n {
		t.Errorf("sample count %d, want %d", h.GetSampleCount(), n)
	}
	if h.Schema == nil || len(h.GetPositiveSpan()) == 0 || len(h.GetPositiveDelta()) == 0 {
		t.Errorf("not a native histogram: schema %v, %d spans, %d deltas", h.Schema, len(h.GetPositiveSpan()), len(h.GetPositiveDelta()))
	}
	var buckets int64
	var count int64
	for _, d := range h.GetPositiveDelta() {
		count += d
		buckets += count
	}
	if uint64(buckets)+h.GetZeroCount() != n {
		t.Errorf("native buckets hold %d observations, want %d", uint64(buckets)+h.GetZeroCount(), n)
	}
	if len(h.GetExemplars()) == 0 {
		t.Error("native histogram carries no exemplars")
	}
	for _, ex := range h.GetExemplars() {
		var hasTrace bool
		for _, l := range ex.GetLabel() {
			hasTrace = hasTrace || (l.GetName() == "trace_id" && len(l.GetValue()) == 32)
		}
		if !hasTrace {
			t.Errorf("exemplar %v lacks a trace_id label", ex)
		}
	}
}

// blockingExporter is a test double for a collector that does not answer: every
// export waits until released, then succeeds.
type blockingExporter struct {
	*tracetest.InMemoryExporter
	release chan struct{}
	once    sync.Once
}

func (e *blockingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	select {
	case <-e.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	return e.InMemoryExporter.ExportSpans(ctx, spans)
}

func (e *blockingExporter) open() { e.once.Do(func() { close(e.release) }) }

func TestStalledExportDropsAndCountsWithoutBlocking(t *testing.T) {
	exp := &blockingExporter{InMemoryExporter: tracetest.NewInMemoryExporter(), release: make(chan struct{})}
	const queue = 16
	tel, err := New(context.Background(), WithOTLP(false), WithTraceExporter(exp), WithSpanQueueSize(queue))
	if err != nil {
		t.Fatal(err)
	}
	defer exp.open()
	const records = 200
	spansPerRecord := uint64(5) // root, delivery, queue, compute, one commit
	start := time.Now()
	for i := range records {
		tel.Report(record(base, fmt.Sprintf("pe-%d", i), 30*time.Millisecond))
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("%d Reports with a stalled exporter took %v", records, d)
	}
	dropped, _ := tel.Dropped()
	if dropped == 0 {
		t.Fatal("no drops counted with a stalled exporter and a 16-span queue")
	}
	exp.open()
	// ForceFlush, not Shutdown: the in-memory exporter forgets its spans on Shutdown.
	if err := tel.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	dropped, _ = tel.Dropped()
	arrived := uint64(len(exp.GetSpans()))
	if arrived+dropped != records*spansPerRecord {
		t.Errorf("arrived %d + dropped %d = %d, want every one of %d spans accounted for",
			arrived, dropped, arrived+dropped, records*spansPerRecord)
	}
	// What waited is bounded: the queue plus the one batch held by the exporter.
	if arrived > 2*queue {
		t.Errorf("%d spans arrived, more than the queue (%d) plus one batch can have held", arrived, queue)
	}
}

// The counters, kept as atomic totals and observed at collection, reach the
// Prometheus exposition as counters (_total, TYPE counter) with their labels
// and exact values, and a pair never counted is not exposed.
func TestMetricsHandlerServesCounters(t *testing.T) {
	tel := newInMemory(t)
	tel.ObserveCounts(func(c *report.Counts) {
		c.Suppressed[report.Redelivered] = 3
		c.Deliveries[report.KindClusterPolicyEndpoint][report.CauseRelist] = 1
	})
	tel.Committed(report.KindPolicyEndpoint, attempt(base, time.Millisecond, "map full"))
	srv := httptest.NewServer(tel.MetricsHandler())
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	text := string(body)
	for _, want := range []string{
		"# TYPE npagent_policy_programming_suppressed_total counter",
		`npagent_policy_programming_suppressed_total{otel_scope_name="` + ScopeName + `",otel_scope_schema_url="",otel_scope_version="",reason="redelivered"} 3`,
		"# TYPE npagent_policy_deliveries_total counter",
		`npagent_policy_deliveries_total{cause="relist",npagent_policy_kind="ClusterPolicyEndpoint",otel_scope_name="` + ScopeName + `",otel_scope_schema_url="",otel_scope_version=""} 1`,
		"# TYPE npagent_dataplane_commit_failures_total counter",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("exposition lacks %q", want)
		}
	}
	if strings.Contains(text, `reason="stale"`) {
		t.Error("a reason never counted (stale) is exposed")
	}
	if t.Failed() {
		t.Logf("exposition:\n%s", text)
	}
}

// A latency point never carries a scale Prometheus would have to coarsen (its
// native histograms take schemas up to 8), even when every observation is the
// same, which the exponential aggregation would otherwise resolve at scale 20.
func TestLatencyScaleAtMost8(t *testing.T) {
	tel := newInMemory(t)
	for i := range 3 {
		tel.Report(record(base, fmt.Sprintf("pe-%d", i), 30*time.Millisecond))
	}
	pts := latencyPoints(t, tel.collect(t))
	if len(pts) != 1 || pts[0].Count != 3 {
		t.Fatalf("points %+v, want one counting 3", pts)
	}
	if pts[0].Scale > 8 {
		t.Errorf("scale %d, want at most 8", pts[0].Scale)
	}
}

// A span link costs a linked root at most two allocations more than a parent
// does (the SDK's option closure and its copy of the link; the link itself
// lives in the pooled scratch).
func TestLinkAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("under the race detector sync.Pool drops what is put back: allocations are not representative")
	}
	perDraw := func(p Parenting) float64 {
		tel := newInMemory(t, WithTraceParenting(p), WithSpanQueueSize(1<<16))
		r := record(base, "pe-allocs", 80*time.Millisecond)
		r.TraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		for range 50 {
			tel.draw(r) // warm the pools
		}
		return testing.AllocsPerRun(500, func() { tel.draw(r) })
	}
	link, child := perDraw(ParentingLink), perDraw(ParentingChild)
	t.Logf("allocations per drawn tree: link %.0f, child %.0f", link, child)
	if link > child+2 {
		t.Errorf("a linked tree allocates %.0f times, a parented one %.0f: want at most 2 more", link, child)
	}
}
