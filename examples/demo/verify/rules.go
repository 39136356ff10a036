package main

import (
	"math"
	"strconv"
)

// quantileRule is the SLO recording rule of the cluster-wide latency quantiles
// (deploy/prometheus/npagent.rules.yaml), one series per quantile label.
const quantileRule = "cluster_quantile:npagent_policy_programming_latency_seconds:histogram_quantile5m"

// ruleQuantiles waits until the demo's Prometheus has evaluated the cluster
// quantile recording rule to a number for p50, p90 and p99, and returns them.
func (v *verifier) ruleQuantiles() (map[string]float64, error) {
	var q map[string]float64
	err := v.poll(quantileRule+" to hold p50, p90 and p99", func() (bool, error) {
		vec, err := v.queryVector(quantileRule)
		if err != nil {
			return false, err
		}
		q = map[string]float64{}
		for _, s := range vec {
			str, _ := s.Value[1].(string)
			if f, err := strconv.ParseFloat(str, 64); err == nil && !math.IsNaN(f) {
				q[s.Metric["quantile"]] = f
			}
		}
		return q["0.5"] > 0 && q["0.9"] > 0 && q["0.99"] > 0, nil
	})
	return q, err
}
