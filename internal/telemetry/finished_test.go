package telemetry

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/npagent/npagent/internal/report"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// The builder emits finished spans itself (finishedSpans) rather than through the
// tracer, which Report uses when OTEL_TRACES_SAMPLER is set. Both must export the
// same trees: the same spans with the same names, parents, times, attributes,
// status, events, dropped counts, child counts, kind, resource and scope, under
// the span limits the SDK reads from the environment. Only the random span and
// trace ids differ, so spans are compared by their place in the tree.
func TestFinishedSpansMatchTheTracer(t *testing.T) {
	for _, limits := range []struct {
		name string
		env  map[string]string
		// The SDK's snapshot copies a span's dropped-event count only when at
		// least one event remains (recordingSpan.snapshot, SDK v1.47.0), so with
		// an event limit of 0 the tracer exports 0 dropped events where the
		// builder counts the one it dropped, as the specification asks.
		sdkLosesDroppedEvents bool
	}{
		{name: "default limits"},
		{name: "tight limits", env: map[string]string{
			"OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT":        "5",
			"OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT": "6",
			"OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT":       "0",
		}},
		{name: "no attributes or events", env: map[string]string{
			"OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "0",
			"OTEL_SPAN_EVENT_COUNT_LIMIT":     "0",
		}, sdkLosesDroppedEvents: true},
	} {
		t.Run(limits.name, func(t *testing.T) {
			for k, v := range limits.env {
				t.Setenv(k, v)
			}
			records := treeShapes()
			viaBuilder := exportTrees(t, false, records)
			viaTracer := exportTrees(t, true, records)
			if len(viaBuilder) != len(viaTracer) {
				t.Fatalf("builder exported %d spans, tracer %d", len(viaBuilder), len(viaTracer))
			}
			for i := range viaTracer {
				if limits.sdkLosesDroppedEvents {
					if want := failedCommit(viaTracer[i]); viaBuilder[i].stub.DroppedEvents != want {
						t.Errorf("span %d (%s): builder counts %d dropped events, want %d", i, viaTracer[i].key, viaBuilder[i].stub.DroppedEvents, want)
					}
					viaBuilder[i].stub.DroppedEvents = viaTracer[i].stub.DroppedEvents
				}
				if diff := diffSpans(viaBuilder[i], viaTracer[i]); diff != "" {
					t.Errorf("span %d (%s): builder and tracer differ: %s", i, viaTracer[i].key, diff)
				}
			}
		})
	}
}

// failedCommit is 1 for a commit span with error status (it had an exception
// event), else 0.
func failedCommit(s exportedSpan) int {
	if s.stub.Name == SpanCommit && s.stub.Status.Code == codes.Error {
		return 1
	}
	return 0
}

// treeShapes are records covering every branch of a tree: remote parents (one
// with the random trace flag, which both paths must carry on), failed
// attempts, more attempts than finishedSpans prebuilds, phases left out (a bound
// missing or out of order), a cluster policy with no namespace or policy ref, and
// a value longer than the tight length limit in a multi-byte script.
func treeShapes() []*report.Record {
	full := record(base, "pe-full", 80*time.Millisecond)
	full.TraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

	failed := record(base.Add(time.Second), "pe-failed", 80*time.Millisecond)
	failed.TraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4737-00f067aa0ba902b8-03" // sampled and random
	failed.Attempts = []report.Attempt{
		{Start: base.Add(time.Second + 60*time.Millisecond), End: base.Add(time.Second + 65*time.Millisecond), Err: "map full"},
		{Start: base.Add(time.Second + 70*time.Millisecond), End: base.Add(time.Second + 80*time.Millisecond)},
	}

	many := record(base.Add(2*time.Second), "pe-many-attempts", 80*time.Millisecond)
	many.Attempts = nil
	for i := range maxSharedAttempts + 3 {
		at := base.Add(2*time.Second + 60*time.Millisecond + time.Duration(i)*time.Millisecond)
		a := report.Attempt{Start: at, End: at.Add(500 * time.Microsecond)}
		if i < maxSharedAttempts+2 {
			a.Err = fmt.Sprintf("interface not found (%d)", i)
		}
		many.Attempts = append(many.Attempts, a)
	}

	gaps := record(base.Add(3*time.Second), "cpe-gaps", 80*time.Millisecond)
	gaps.Kind, gaps.Namespace, gaps.PolicyRef = report.KindClusterPolicyEndpoint, "", ""
	gaps.Received = time.Time{}                                // no delivery span, no queue span
	gaps.ComputeEnd = gaps.ComputeStart.Add(-time.Millisecond) // out of order: no compute span

	long := record(base.Add(4*time.Second), "pe-"+strings.Repeat("ü", 20), 80*time.Millisecond)
	return []*report.Record{full, failed, many, gaps, long}
}

// exportedSpan is a span with its ids replaced by its place in the tree.
type exportedSpan struct {
	key    string // root name and record, then the span's name and start
	parent string // the parent's key; for a root, its remote parent's span id
	stub   tracetest.SpanStub
}

// exportTrees reports records through a fresh Telemetry, building the trees
// through the tracer when viaTracer (OTEL_TRACES_SAMPLER set), else through the
// builder, and returns the exported spans sorted by key.
func exportTrees(t *testing.T, viaTracer bool, records []*report.Record) []exportedSpan {
	t.Helper()
	if viaTracer {
		t.Setenv("OTEL_TRACES_SAMPLER", "always_on")
	} else {
		t.Setenv("OTEL_TRACES_SAMPLER", "")
	}
	tel := newInMemory(t, WithInstanceID("instance-a"))
	if (tel.builds == nil) != viaTracer {
		t.Fatalf("OTEL_TRACES_SAMPLER=%q: builder running = %v", map[bool]string{true: "always_on"}[viaTracer], tel.builds != nil)
	}
	for _, r := range records {
		tel.Report(r)
	}
	stubs := tel.endedSpans(t)
	roots := map[[8]byte]string{}
	for _, s := range stubs {
		if s.Name == SpanProgram {
			roots[s.SpanContext.SpanID()] = s.Name + "/" + fmt.Sprint(s.StartTime.UnixNano())
		}
	}
	var out []exportedSpan
	for _, s := range stubs {
		e := exportedSpan{stub: s}
		if s.Name == SpanProgram {
			e.key = roots[s.SpanContext.SpanID()]
			e.parent = s.Parent.SpanID().String()
		} else {
			rootKey, ok := roots[s.Parent.SpanID()]
			if !ok {
				t.Fatalf("span %s has parent %s, not a root span", s.Name, s.Parent.SpanID())
			}
			if s.SpanContext.TraceID() != s.Parent.TraceID() {
				t.Errorf("span %s is in trace %s, its root in %s", s.Name, s.SpanContext.TraceID(), s.Parent.TraceID())
			}
			e.key = fmt.Sprintf("%s/%s/%d", rootKey, s.Name, s.StartTime.UnixNano())
			e.parent = rootKey
		}
		out = append(out, e)
	}
	slices.SortStableFunc(out, func(a, b exportedSpan) int { return strings.Compare(a.key, b.key) })
	return out
}

// diffSpans names the first fields that differ, ids aside.
func diffSpans(a, b exportedSpan) string {
	var d []string
	check := func(field string, x, y any) {
		if !reflect.DeepEqual(x, y) {
			d = append(d, fmt.Sprintf("%s: %v vs %v", field, x, y))
		}
	}
	check("key", a.key, b.key)
	check("parent", a.parent, b.parent)
	check("parent remote", a.stub.Parent.IsRemote(), b.stub.Parent.IsRemote())
	check("trace flags", a.stub.SpanContext.TraceFlags(), b.stub.SpanContext.TraceFlags())
	check("trace state", a.stub.SpanContext.TraceState().String(), b.stub.SpanContext.TraceState().String())
	check("remote", a.stub.SpanContext.IsRemote(), b.stub.SpanContext.IsRemote())
	check("kind", a.stub.SpanKind, b.stub.SpanKind)
	check("start", a.stub.StartTime.UnixNano(), b.stub.StartTime.UnixNano())
	check("end", a.stub.EndTime.UnixNano(), b.stub.EndTime.UnixNano())
	check("attributes", orEmpty(a.stub.Attributes), orEmpty(b.stub.Attributes))
	check("dropped attributes", a.stub.DroppedAttributes, b.stub.DroppedAttributes)
	check("status", a.stub.Status, b.stub.Status)
	check("events", len(a.stub.Events), len(b.stub.Events))
	for i := range min(len(a.stub.Events), len(b.stub.Events)) {
		ea, eb := a.stub.Events[i], b.stub.Events[i]
		check("event name", ea.Name, eb.Name)
		check("event time", ea.Time.UnixNano(), eb.Time.UnixNano())
		check("event attributes", orEmpty(ea.Attributes), orEmpty(eb.Attributes))
		check("event dropped attributes", ea.DroppedAttributeCount, eb.DroppedAttributeCount)
	}
	check("dropped events", a.stub.DroppedEvents, b.stub.DroppedEvents)
	check("links", len(a.stub.Links), len(b.stub.Links))
	check("child count", a.stub.ChildSpanCount, b.stub.ChildSpanCount)
	check("resource", a.stub.Resource.Equivalent(), b.stub.Resource.Equivalent())
	check("scope", a.stub.InstrumentationScope, b.stub.InstrumentationScope)
	return strings.Join(d, "; ")
}

func orEmpty(kv []attribute.KeyValue) []attribute.KeyValue {
	if kv == nil {
		return []attribute.KeyValue{}
	}
	return kv
}
