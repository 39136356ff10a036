package telemetry

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// latencySampler is the tracer provider's sampler: latency-aware sampling
// (WithSampling) composed with OTEL_TRACES_SAMPLER.
//
// A trigger's root span (SpanProgram) is started with its latency (LatencyKey)
// among its start attributes, so the decision is made before any span exists:
//
//   - slow (latency ≥ slowThreshold): recorded and sampled, whatever the remote
//     parent's flags and whatever OTEL_TRACES_SAMPLER says — the node's part of
//     a change is worth keeping on its own;
//   - fast: the systematic fastFraction first (the n-th fast trigger is kept
//     when floor(n·f) steps up, exactly that fraction without a random source);
//     one it keeps is then decided by the OTEL_TRACES_SAMPLER sampler if that is
//     set (it sees the remote parent and the start attributes, as the SDK would
//     give them), else kept.
//
// Every other span (the root's children) follows its parent: ParentBased, with
// AlwaysSample for a span with no parent.
type latencySampler struct {
	slow     time.Duration
	fraction float64
	fastSeen atomic.Uint64    // fast roots seen, for systematic sampling
	env      sdktrace.Sampler // from OTEL_TRACES_SAMPLER; nil when unset
	other    sdktrace.Sampler // for spans that are not a trigger's root
}

var _ sdktrace.Sampler = (*latencySampler)(nil)

func newLatencySampler(slow time.Duration, fraction float64, env sdktrace.Sampler) *latencySampler {
	return &latencySampler{slow: slow, fraction: fraction, env: env, other: sdktrace.ParentBased(sdktrace.AlwaysSample())}
}

func (s *latencySampler) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	latency, ok := rootLatency(p)
	if !ok {
		return s.other.ShouldSample(p)
	}
	if latency >= s.slow.Seconds() {
		return s.result(p, sdktrace.RecordAndSample)
	}
	if !s.keepFast() {
		return s.result(p, sdktrace.Drop)
	}
	if s.env != nil {
		return s.env.ShouldSample(p)
	}
	return s.result(p, sdktrace.RecordAndSample)
}

// result is decision with the parent's trace state carried on, as the SDK's
// samplers do.
func (s *latencySampler) result(p sdktrace.SamplingParameters, d sdktrace.SamplingDecision) sdktrace.SamplingResult {
	return sdktrace.SamplingResult{
		Decision:   d,
		Tracestate: trace.SpanContextFromContext(p.ParentContext).TraceState(),
	}
}

// keepFast decides for one fast root: fastFraction of them, systematically.
func (s *latencySampler) keepFast() bool {
	f := s.fraction
	if f >= 1 {
		return true
	}
	if f <= 0 {
		return false
	}
	n := s.fastSeen.Add(1)
	return uint64(float64(n)*f) > uint64(float64(n-1)*f)
}

func (s *latencySampler) Description() string {
	env := "none"
	if s.env != nil {
		env = s.env.Description()
	}
	return fmt.Sprintf("LatencyAware{slow>=%v,fastFraction=%v,fast=%s}", s.slow, s.fraction, env)
}

// rootLatency returns the latency (seconds) a trigger's root span was started
// with; ok is false for any other span.
func rootLatency(p sdktrace.SamplingParameters) (seconds float64, ok bool) {
	if p.Name != SpanProgram {
		return 0, false
	}
	for _, kv := range p.Attributes {
		if kv.Key == LatencyKey {
			return kv.Value.AsFloat64(), true
		}
	}
	return 0, false
}

// envSampler builds the sampler OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG
// name, as the SDK reads them (the SDK does not export its reader, and an
// explicit WithSampler replaces it). It returns nil when the variable is unset.
// A value the SDK does not know, or a bad ratio, is reported on logger and
// replaced as the SDK replaces it: the SDK's default sampler, a ratio of 1.
func envSampler(logger *slog.Logger) sdktrace.Sampler {
	name := strings.ToLower(strings.TrimSpace(os.Getenv("OTEL_TRACES_SAMPLER")))
	arg := strings.TrimSpace(os.Getenv("OTEL_TRACES_SAMPLER_ARG"))
	ratio := func() sdktrace.Sampler {
		if arg == "" {
			return sdktrace.TraceIDRatioBased(1)
		}
		v, err := strconv.ParseFloat(arg, 64)
		if err != nil || v < 0 || v > 1 {
			logger.Warn("telemetry: OTEL_TRACES_SAMPLER_ARG is not a ratio in [0, 1]; using 1", "value", arg)
			return sdktrace.TraceIDRatioBased(1)
		}
		return sdktrace.TraceIDRatioBased(v)
	}
	switch name {
	case "":
		return nil
	case "always_on":
		return sdktrace.AlwaysSample()
	case "always_off":
		return sdktrace.NeverSample()
	case "traceidratio":
		return ratio()
	case "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample())
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample())
	case "parentbased_traceidratio":
		return sdktrace.ParentBased(ratio())
	default:
		logger.Warn("telemetry: unsupported OTEL_TRACES_SAMPLER; using parentbased_always_on", "value", name)
		return sdktrace.ParentBased(sdktrace.AlwaysSample())
	}
}
