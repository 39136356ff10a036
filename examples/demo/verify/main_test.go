package main

import "testing"

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
