package e2enode

import (
	"fmt"
	"sync"
	"testing"
	"time"

	colmetricspb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"

	"github.com/npagent/npagent/internal/telemetry"
	"github.com/npagent/npagent/internal/testenv/otlptest"
)

// telemetrySink is where the node's collector delivers what the agent exports: the
// policy.program spans (one per reported trigger) and the latency histogram's count.
type telemetrySink struct {
	*otlptest.Sink

	mu sync.Mutex
	// reports counts policy.program spans by object uid and trigger time.
	reports map[triggerKey]int
	// latencyCount is the largest count the latency histogram exported (cumulative).
	latencyCount uint64
}

type triggerKey struct {
	uid     string
	trigger time.Time
}

func newTelemetrySink(t *testing.T) *telemetrySink {
	s := &telemetrySink{reports: map[triggerKey]int{}}
	s.Sink = otlptest.NewSink(t, func(req *coltracepb.ExportTraceServiceRequest) {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, rs := range req.GetResourceSpans() {
			for _, ss := range rs.GetScopeSpans() {
				for _, sp := range ss.GetSpans() {
					if sp.GetName() != telemetry.SpanProgram {
						continue
					}
					var k triggerKey
					for _, kv := range sp.GetAttributes() {
						switch kv.GetKey() {
						case string(telemetry.PolicyUIDKey):
							k.uid = kv.GetValue().GetStringValue()
						case string(telemetry.TriggerTimeKey):
							k.trigger, _ = time.Parse(time.RFC3339Nano, kv.GetValue().GetStringValue())
						}
					}
					s.reports[k]++
				}
			}
		}
	}, func(req *colmetricspb.ExportMetricsServiceRequest) {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, rm := range req.GetResourceMetrics() {
			for _, sm := range rm.GetScopeMetrics() {
				for _, m := range sm.GetMetrics() {
					if m.GetName() != telemetry.LatencyName {
						continue
					}
					var count uint64
					for _, dp := range m.GetExponentialHistogram().GetDataPoints() {
						count += dp.GetCount()
					}
					s.latencyCount = max(s.latencyCount, count)
				}
			}
		}
	})
	return s
}

// reported is how many policy.program spans reached the sink for uid's trigger.
func (s *telemetrySink) reported(uid string, trigger time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, n := range s.reports {
		if k.uid == uid && k.trigger.Equal(trigger) {
			return n
		}
	}
	return 0
}

// duplicates lists the triggers reported more than once, and returns how many
// distinct triggers were reported.
func (s *telemetrySink) duplicates() (dups []string, distinct int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, n := range s.reports {
		if n > 1 {
			dups = append(dups, fmt.Sprintf("%s@%s ×%d", k.uid, k.trigger.Format(time.RFC3339Nano), n))
		}
	}
	return dups, len(s.reports)
}

func (s *telemetrySink) latencyPoints() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.latencyCount
}
