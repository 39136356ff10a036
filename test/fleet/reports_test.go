package fleet

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/testenv/otlptest"
)

// programReport is one policy.program root span: one trigger an agent reported.
type programReport struct {
	node, uid, trigger string
	start, end         time.Time // the trigger, the commit
}

func (r programReport) latency() time.Duration { return r.end.Sub(r.start) }

// reportSink keeps every report the agents export to it over OTLP/HTTP.
type reportSink struct {
	*otlptest.Sink
	mu      sync.Mutex
	reports []programReport
}

func newReportSink(t testing.TB) *reportSink {
	s := &reportSink{}
	s.Sink = otlptest.NewSink(t, func(req *coltracepb.ExportTraceServiceRequest) {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, rs := range req.GetResourceSpans() {
			resNode := attr(rs.GetResource().GetAttributes(), "k8s.node.name")
			for _, ss := range rs.GetScopeSpans() {
				for _, sp := range ss.GetSpans() {
					if sp.GetName() != "policy.program" {
						continue
					}
					r := programReport{
						node:    attr(sp.GetAttributes(), "k8s.node.name"),
						uid:     attr(sp.GetAttributes(), "npagent.policy.uid"),
						trigger: attr(sp.GetAttributes(), "npagent.policy.trigger_time"),
						start:   time.Unix(0, int64(sp.GetStartTimeUnixNano())),
						end:     time.Unix(0, int64(sp.GetEndTimeUnixNano())),
					}
					if r.node == "" {
						r.node = resNode
					}
					s.reports = append(s.reports, r)
				}
			}
		}
	}, nil)
	return s
}

func attr(kvs []*commonpb.KeyValue, key string) string {
	for _, kv := range kvs {
		if kv.GetKey() == key {
			return kv.GetValue().GetStringValue()
		}
	}
	return ""
}

func (s *reportSink) snapshot() []programReport {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.reports)
}

// write is one trigger the writer stamped: the node of the object's local pod must
// report it, once.
type write struct {
	node, uid, trigger string
}

func (w write) key() string { return w.node + " " + w.uid + " " + w.trigger }

func (r programReport) key() string { return r.node + " " + r.uid + " " + r.trigger }

// writer updates the fleet's PolicyEndpoints through the apiserver, each write a
// new trigger and a changed spec, and records each trigger it wrote. It keeps every
// object as its last write returned it, so an update needs no read first; a churn
// goroutine owns a share of the objects, so no object has two writers.
type writer struct {
	c      client.Client
	objs   []*v1alpha1.PolicyEndpoint
	nodeOf func(k int) string // the node of object k's local pod

	mu     sync.Mutex
	writes []write
	n      int
}

// update writes object k with a new trigger and one ingress CIDR changed.
func (w *writer) update(ctx context.Context, k int) (write, error) {
	w.mu.Lock()
	w.n++
	n := w.n
	w.mu.Unlock()
	pe := w.objs[k]
	pe.Spec.Ingress[0].CIDR = v1alpha1.NetworkAddress(fmt.Sprintf("10.%d.%d.0/24", 100+n/250%100, n%250))
	trig := time.Now().UTC().Format(time.RFC3339Nano)
	pe.Annotations[v1alpha1.AnnotationLastChangeTriggerTime] = trig
	if err := w.c.Update(ctx, pe); err != nil {
		return write{}, fmt.Errorf("update %s: %w", pe.Name, err)
	}
	wr := write{node: w.nodeOf(k), uid: string(pe.UID), trigger: trig}
	w.mu.Lock()
	w.writes = append(w.writes, wr)
	w.mu.Unlock()
	return wr, nil
}

func (w *writer) all() []write {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.writes)
}

// churn writes perSecond updates a second to random objects for d, from writers
// goroutines that each own the objects k with k%writers == their index, skipping
// the objects skip says are not theirs to touch. It returns the first error.
func (w *writer) churn(ctx context.Context, perSecond float64, d time.Duration, skip func(k int) bool) error {
	const writers = 4
	stop := time.Now().Add(d)
	errs := make(chan error, writers)
	var wg sync.WaitGroup
	for g := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), uint64(time.Now().UnixNano())))
			tick := time.NewTicker(time.Duration(float64(writers) * float64(time.Second) / perSecond))
			defer tick.Stop()
			for time.Now().Before(stop) {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				k := g + writers*rng.IntN(len(w.objs)/writers)
				if skip(k) {
					continue
				}
				if _, err := w.update(ctx, k); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// exactlyOnce checks every report against what was written: no (node, uid,
// trigger) reported twice, none reported that was not written for that node, and
// each written one reported. It returns the counts of each fault.
func exactlyOnce(reports []programReport, writes []write) (dup, unexpected, missing int, examples []string) {
	wrote := map[string]bool{}
	for _, w := range writes {
		wrote[w.key()] = true
	}
	got := map[string]int{}
	for _, r := range reports {
		got[r.key()]++
	}
	note := func(format string, args ...any) {
		if len(examples) < 10 {
			examples = append(examples, fmt.Sprintf(format, args...))
		}
	}
	for k, n := range got {
		if n > 1 {
			dup++
			note("reported %d times: %s", n, k)
		}
		if !wrote[k] {
			unexpected++
			note("reported, never written for that node: %s", k)
		}
	}
	for k := range wrote {
		if got[k] == 0 {
			missing++
			note("written, never reported: %s", k)
		}
	}
	return dup, unexpected, missing, examples
}

// allReported reports whether every write of ws has been reported.
func allReported(reports []programReport, ws []write) bool {
	got := map[string]bool{}
	for _, r := range reports {
		got[r.key()] = true
	}
	for _, w := range ws {
		if !got[w.key()] {
			return false
		}
	}
	return true
}
