package telemetry

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// This file measures how well quantiles survive the latency histogram: the
// exponential layout npagent exports, read the way Prometheus reads a native
// histogram, against the exact quantiles of the recorded latencies, next to
// kube-proxy's fixed bucket layout for network_programming_duration_seconds.

// kubeProxyBounds is kube-proxy's network programming duration layout: 0.25, 0.5,
// 1..59 by 1, 60..115 by 5, 120..300 by 30 (seconds).
func kubeProxyBounds() []float64 {
	b := []float64{0.25, 0.5}
	for v := 1.0; v <= 59; v++ {
		b = append(b, v)
	}
	for v := 60.0; v <= 115; v += 5 {
		b = append(b, v)
	}
	for v := 120.0; v <= 300; v += 30 {
		b = append(b, v)
	}
	return b
}

// exactQuantile is the value of rank ⌈q·n⌉ among the sorted observations, the
// value a histogram estimate aims at.
func exactQuantile(sorted []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(i, 0)]
}

// expBucket is one populated bucket of an exponential histogram, (lower, upper].
type expBucket struct {
	lower, upper float64
	count        uint64
}

func expBuckets(p metricdata.ExponentialHistogramDataPoint[float64]) []expBucket {
	base := math.Exp2(math.Exp2(-float64(p.Scale)))
	var out []expBucket
	if p.ZeroCount > 0 {
		out = append(out, expBucket{0, p.ZeroThreshold, p.ZeroCount})
	}
	for i, c := range p.PositiveBucket.Counts {
		idx := float64(p.PositiveBucket.Offset + int32(i))
		out = append(out, expBucket{math.Pow(base, idx), math.Pow(base, idx+1), c})
	}
	return out
}

// nativeQuantile estimates quantile q from an exponential histogram the way
// Prometheus's histogram_quantile does for a native histogram: find the bucket
// holding rank q·count, then interpolate inside it — exponentially (Prometheus
// 3: observations assumed spread evenly in log space, which is what the
// exponential layout implies) or linearly (Prometheus 2). The zero bucket is
// always interpolated linearly.
func nativeQuantile(buckets []expBucket, total uint64, q float64, exponential bool) float64 {
	rank := q * float64(total)
	var below float64
	for _, b := range buckets {
		if below+float64(b.count) < rank {
			below += float64(b.count)
			continue
		}
		frac := (rank - below) / float64(b.count)
		if exponential && b.lower > 0 {
			return b.lower * math.Pow(b.upper/b.lower, frac)
		}
		return b.lower + (b.upper-b.lower)*frac
	}
	return buckets[len(buckets)-1].upper
}

// fixedQuantile is Prometheus's bucketQuantile over a classic histogram: linear
// interpolation inside the bucket, 0 as the first bucket's lower bound, and the
// highest finite bound when the rank falls in +Inf.
func fixedQuantile(bounds []float64, observations []float64, q float64) float64 {
	counts := make([]uint64, len(bounds)+1) // last: +Inf
	for _, v := range observations {
		i, _ := slices.BinarySearch(bounds, v) // first bound >= v: le is inclusive
		counts[i]++
	}
	rank := q * float64(len(observations))
	var below float64
	for i, c := range counts {
		if below+float64(c) < rank {
			below += float64(c)
			continue
		}
		if i == len(bounds) {
			return bounds[len(bounds)-1]
		}
		lower := 0.0
		if i > 0 {
			lower = bounds[i-1]
		}
		return lower + (bounds[i]-lower)*(rank-below)/float64(c)
	}
	return bounds[len(bounds)-1]
}

type accuracyRow struct {
	workload                    string
	q                           float64
	exact, expo, linear, fixed  float64
	scale                       int32
	expoErr, linearErr, fixdErr float64
}

// latencyAccuracy records n log-uniform latencies in [lo, hi] through Report into
// the real SDK aggregation, and compares quantile estimates with the truth.
func latencyAccuracy(t testing.TB, name string, lo, hi time.Duration, n int) []accuracyRow {
	// No spans: only the histogram is under test, and 10^5 span trees would only
	// cost time.
	tel := newInMemory(t, WithSampling(time.Duration(math.MaxInt64), 0))
	rng := rand.New(rand.NewPCG(7, uint64(lo)))
	values := make([]float64, n)
	r := record(base, "pe", 0)
	for i := range values {
		lat := time.Duration(math.Exp(math.Log(float64(lo)) + rng.Float64()*math.Log(float64(hi)/float64(lo))))
		r.Attempts[0].End = r.Trigger.Add(lat)
		tel.Report(r)
		values[i] = lat.Seconds()
	}
	slices.Sort(values)
	pts := latencyPoints(t, tel.collect(t))
	if len(pts) != 1 || pts[0].Count != uint64(n) {
		t.Fatalf("%s: points %d, want one with count %d", name, len(pts), n)
	}
	buckets := expBuckets(pts[0])
	bounds := kubeProxyBounds()
	var rows []accuracyRow
	for _, q := range []float64{0.5, 0.9, 0.99} {
		row := accuracyRow{workload: name, q: q, scale: pts[0].Scale, exact: exactQuantile(values, q)}
		row.expo = nativeQuantile(buckets, pts[0].Count, q, true)
		row.linear = nativeQuantile(buckets, pts[0].Count, q, false)
		row.fixed = fixedQuantile(bounds, values, q)
		rel := func(v float64) float64 { return math.Abs(v-row.exact) / row.exact }
		row.expoErr, row.linearErr, row.fixdErr = rel(row.expo), rel(row.linear), rel(row.fixed)
		rows = append(rows, row)
	}
	return rows
}

func formatAccuracy(rows []accuracyRow) string {
	var b strings.Builder
	b.WriteString("| workload | q | exact | exponential (Prom 3) | err | linear in native bucket (Prom 2) | err | kube-proxy fixed buckets | err |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s (scale %d) | p%g | %s | %s | %.3f%% | %s | %.3f%% | %s | %.1f%% |\n",
			r.workload, r.scale, r.q*100, sec(r.exact), sec(r.expo), 100*r.expoErr,
			sec(r.linear), 100*r.linearErr, sec(r.fixed), 100*r.fixdErr)
	}
	return b.String()
}

func sec(v float64) string {
	if v < 1 {
		return fmt.Sprintf("%.4g ms", v*1e3)
	}
	return fmt.Sprintf("%.4g s", v)
}

// TestQuantileAccuracy holds the exponential histogram to ≤ 2% relative error at
// p50, p90 and p99 for a 1–20 ms and a 1–300 s workload, and prints the table
// for BENCHMARKS.md (go test -run TestQuantileAccuracy -v).
func TestQuantileAccuracy(t *testing.T) {
	const n = 100_000
	rows := latencyAccuracy(t, "1–20 ms", time.Millisecond, 20*time.Millisecond, n)
	rows = append(rows, latencyAccuracy(t, "1–300 s", time.Second, 300*time.Second, n)...)
	// For information: one histogram spanning both ranges. MaxSize 160 then forces
	// a coarser scale (wider buckets); no goal is set for it.
	wide := latencyAccuracy(t, "1 ms–300 s", time.Millisecond, 300*time.Second, n)
	t.Logf("%d log-uniform latencies per workload\n%s", n, formatAccuracy(append(rows, wide...)))
	for _, r := range rows {
		if r.expoErr > 0.02 {
			t.Errorf("%s p%g: exponential histogram estimate %s vs exact %s: %.2f%% error, goal ≤ 2%%",
				r.workload, r.q*100, sec(r.expo), sec(r.exact), 100*r.expoErr)
		}
		if r.scale > 8 {
			// Prometheus stores native histograms at scale ≤ 8 and would reduce the
			// resolution; the figures above would then not be what it computes.
			t.Errorf("%s: exported scale %d above Prometheus's maximum 8", r.workload, r.scale)
		}
	}
}

// BenchmarkQuantileEstimate measures computing the three quantiles from the
// exported buckets, the part a dashboard pays per series.
func BenchmarkQuantileEstimate(b *testing.B) {
	tel := newInMemory(b, WithSampling(time.Duration(math.MaxInt64), 0))
	r := record(base, "pe", 0)
	rng := rand.New(rand.NewPCG(1, 1))
	for range 10_000 {
		r.Attempts[0].End = r.Trigger.Add(time.Duration(1e6 + rng.Float64()*19e6))
		tel.Report(r)
	}
	p := latencyPoints(b, tel.collect(b))[0]
	buckets := expBuckets(p)
	b.ReportAllocs()
	b.ResetTimer()
	var sink float64
	for b.Loop() {
		for _, q := range []float64{0.5, 0.9, 0.99} {
			sink += nativeQuantile(buckets, p.Count, q, true)
		}
	}
	_ = sink
}
