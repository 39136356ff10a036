package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// sampleSum reads the value after the label set: not a timestamp or an
// exemplar after it, not a metric whose name merely starts with the same
// characters, and only samples whose labels match.
func TestSampleSum(t *testing.T) {
	const exposition = `# HELP npagent_policy_programming_suppressed_total Trigger observations not reported.
# TYPE npagent_policy_programming_suppressed_total counter
npagent_policy_programming_suppressed_total{npagent_policy_kind="PolicyEndpoint",reason="redelivered"} 40
npagent_policy_programming_suppressed_total{npagent_policy_kind="ClusterPolicyEndpoint",reason="redelivered"} 2 1732920000000
npagent_policy_programming_suppressed_total{npagent_policy_kind="PolicyEndpoint",reason="stale"} 3 # {trace_id="4bf92f3577b34da6a3ce929d0e0e4736"} 1 1732920000.5
npagent_policy_programming_suppressed_total_created{reason="redelivered"} 1.7e9
npagent_policy_programming_latency_seconds_count 570
`
	for _, tc := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"npagent_policy_programming_suppressed_total", []string{`reason="redelivered"`}, 42},
		{"npagent_policy_programming_suppressed_total", []string{`reason="stale"`}, 3},
		{"npagent_policy_programming_suppressed_total", []string{`npagent_policy_kind="PolicyEndpoint"`}, 43},
		{"npagent_policy_programming_suppressed_total", nil, 45},
		{"npagent_policy_programming_suppressed_total", []string{`reason="deleted"`}, 0},
		{"npagent_policy_programming_latency_seconds_count", nil, 570},
	} {
		if got := sampleSum(exposition, tc.name, tc.labels...); got != tc.want {
			t.Errorf("sampleSum(%s, %v) = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
}

// Jaeger's /api/traces shape (uimodel): an OpenTelemetry span link is a
// FOLLOWS_FROM reference carrying the linked trace id, the parent a CHILD_OF.
const (
	linkedTrace = `{"spans":[
 {"traceID":"aaaa0000000000000000000000000001","spanID":"a1","operationName":"policy.program","processID":"p1",
  "references":[{"refType":"FOLLOWS_FROM","traceID":"bbbb0000000000000000000000000002","spanID":"b1"}]},
 {"traceID":"aaaa0000000000000000000000000001","spanID":"a2","operationName":"commit","processID":"p1",
  "references":[{"refType":"CHILD_OF","traceID":"aaaa0000000000000000000000000001","spanID":"a1"}]}],
 "processes":{"p1":{"serviceName":"npagent"}}}`
	writerTrace = `{"spans":[
 {"traceID":"bbbb0000000000000000000000000002","spanID":"b1","operationName":"policy.change","processID":"p1","references":[]}],
 "processes":{"p1":{"serviceName":"churn"}}}`
	childTrace = `{"spans":[
 {"traceID":"bbbb0000000000000000000000000002","spanID":"b1","operationName":"policy.change","processID":"p2","references":[]},
 {"traceID":"bbbb0000000000000000000000000002","spanID":"a1","operationName":"policy.program","processID":"p1",
  "references":[{"refType":"CHILD_OF","traceID":"bbbb0000000000000000000000000002","spanID":"b1"}]}],
 "processes":{"p1":{"serviceName":"npagent"},"p2":{"serviceName":"churn"}}}`
	orphanTrace = `{"spans":[
 {"traceID":"aaaa0000000000000000000000000001","spanID":"a1","operationName":"policy.program","processID":"p1","references":[]}],
 "processes":{"p1":{"serviceName":"npagent"}}}`
)

func parseTrace(t *testing.T, s string) jaegerTrace {
	t.Helper()
	var tr jaegerTrace
	if err := json.Unmarshal([]byte(s), &tr); err != nil {
		t.Fatal(err)
	}
	return tr
}

// The writer's span is found through the link in link mode and through the
// parent in child mode; the wrong shape for the mode is reported.
func TestWriterRef(t *testing.T) {
	for _, tc := range []struct {
		name, trace string
		link        bool
		wantSpan    string // "" = a problem expected
		wantProblem string
	}{
		{"link mode follows the link", linkedTrace, true, "b1", ""},
		{"child mode follows the parent", childTrace, false, "b1", ""},
		{"link mode rejects a parented root", childTrace, true, "", "should be a root"},
		{"child mode rejects a linked root", linkedTrace, false, "", "0 parents"},
		{"link mode needs a link", orphanTrace, true, "", "0 span links"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ref, problem := writerRef(parseTrace(t, tc.trace), tc.link)
			if tc.wantSpan != "" && (problem != "" || ref.SpanID != tc.wantSpan) {
				t.Errorf("writerRef = %+v, %q; want span %s", ref, problem, tc.wantSpan)
			}
			if tc.wantSpan == "" && !strings.Contains(problem, tc.wantProblem) {
				t.Errorf("writerRef problem %q, want one mentioning %q", problem, tc.wantProblem)
			}
		})
	}
	ref, _ := writerRef(parseTrace(t, linkedTrace), true)
	if p := writerSpanProblem(parseTrace(t, writerTrace), ref); p != "" {
		t.Errorf("writer's trace: %s", p)
	}
	if p := writerSpanProblem(parseTrace(t, orphanTrace), ref); !strings.Contains(p, "not in trace") {
		t.Errorf("a trace without the linked span: problem %q", p)
	}
	ref.SpanID = "a1"
	if p := writerSpanProblem(parseTrace(t, orphanTrace), ref); !strings.Contains(p, "want churn/policy.change") {
		t.Errorf("a linked span that is not churn's policy.change: problem %q", p)
	}
	if !sameID("0000000000000000abcd000000000001", "abcd000000000001") || sameID("a1", "a2") {
		t.Error("sameID")
	}
}

// TestExplainRef: the object npagent explain is run on comes from the root span's
// attributes, in explain's own syntax, for both kinds; a root without them is an error.
func TestExplainRef(t *testing.T) {
	root := func(tags string) string {
		return `{"spans":[{"traceID":"a","spanID":"r","operationName":"policy.program","tags":[` + tags + `]}]}`
	}
	for _, tc := range []struct{ name, trace, want, wantErr string }{
		{"PolicyEndpoint", root(`{"key":"npagent.policy.kind","value":"PolicyEndpoint"},{"key":"k8s.namespace.name","value":"churn"},{"key":"npagent.policy.name","value":"churn-002"}`), "pe/churn/churn-002", ""},
		{"ClusterPolicyEndpoint", root(`{"key":"npagent.policy.kind","value":"ClusterPolicyEndpoint"},{"key":"npagent.policy.name","value":"deny-all"}`), "cpe/deny-all", ""},
		{"no name", root(`{"key":"npagent.policy.kind","value":"PolicyEndpoint"}`), "", "no npagent.policy.name"},
		{"no root", `{"spans":[{"traceID":"a","spanID":"c","operationName":"commit"}]}`, "", "no policy.program"},
	} {
		got, err := explainRef(parseTrace(t, tc.trace))
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: explainRef = %q, %v; want an error about %q", tc.name, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s: explainRef = %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
}
