package telemetry

import (
	"bufio"
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	sdklog "go.opentelemetry.io/otel/sdk/log"
	collogspb "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	logspb "go.opentelemetry.io/proto/otlp/logs/v1"

	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/testenv"
	"github.com/npagent/npagent/internal/testenv/otlptest"
)

// sampleFlow is a denial as the reconcile loop names it.
func sampleFlow(i int) *report.FlowEvent {
	return &report.FlowEvent{
		Time: time.Now().Add(-time.Second), Node: "node-e2e", Kind: "deny", Verdict: "deny", Direction: "ingress",
		Reason: "default_deny", Namespace: "shop", Pod: "web-1", PodIP: netip.MustParseAddr("10.0.1.2"),
		Src: netip.MustParseAddr("10.0.9.9"), Dst: netip.MustParseAddr("10.0.1.2"), SrcPort: uint16(40000 + i), DstPort: 8080,
		Protocol: 6, Length: 74, PolicyKind: "PolicyEndpoint", PolicyNamespace: "shop", PolicyName: "web",
		PolicyUID: "uid-web", Policies: []string{"web"}, Tier: "namespaced", RuleIndex: -1, ResourceVersion: "42",
		TriggerTime: time.Date(2026, 12, 5, 19, 0, 0, 0, time.UTC), Attributed: true,
	}
}

// wantFlowAttrs are the documented attributes sampleFlow carries.
var wantFlowAttrs = map[string]string{
	"k8s.node.name": "node-e2e", "k8s.namespace.name": "shop", "k8s.pod.name": "web-1",
	"source.address": "10.0.9.9", "destination.address": "10.0.1.2", "destination.port": "8080",
	"network.transport": "tcp", "network.type": "ipv4", "npagent.verdict": "deny", "npagent.flow.kind": "deny",
	"npagent.verdict.direction": "ingress", "npagent.verdict.reason": "default_deny", "npagent.policy.kind": "PolicyEndpoint",
	"npagent.policy.namespace": "shop", "npagent.policy.name": "web", "npagent.policy.uid": "uid-web",
	"npagent.policy.tier": "namespaced", "npagent.policy.rule": "-1", "npagent.policy.resource_version": "42",
	"npagent.policy.trigger_time": "2026-12-05T19:00:00Z", "npagent.pod.address": "10.0.1.2", "npagent.packet.bytes": "74",
	"npagent.policy.attributed": "true",
}

func anyString(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return strconv.FormatInt(x.IntValue, 10)
	case *commonpb.AnyValue_BoolValue:
		if x.BoolValue {
			return "true"
		}
		return "false"
	}
	return v.String()
}

// Flow events reach a real collector as OTLP log records, with the documented
// attributes, event name and severity.
func TestFlowsThroughRealCollector(t *testing.T) {
	var mu sync.Mutex
	var got []*logspb.LogRecord
	sink := otlptest.NewSink(t, nil, nil)
	sink.OnLogs(func(req *collogspb.ExportLogsServiceRequest) {
		mu.Lock()
		defer mu.Unlock()
		for _, rl := range req.GetResourceLogs() {
			for _, sl := range rl.GetScopeLogs() {
				got = append(got, sl.GetLogRecords()...)
			}
		}
	})
	col := otlptest.StartCollector(t, sink.URL)
	t.Setenv("OTEL_BLRP_SCHEDULE_DELAY", "100")
	tel := newCollectorTelemetry(t, col)
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	const n = 3
	for i := range n {
		tel.Flow(sampleFlow(i))
	}
	testenv.Eventually(t, 30*time.Second, "three flow log records at the collector's sink", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) >= n
	})
	mu.Lock()
	defer mu.Unlock()
	for _, r := range got {
		attrs := map[string]string{}
		for _, kv := range r.GetAttributes() {
			attrs[kv.GetKey()] = anyString(kv.GetValue())
		}
		for k, v := range wantFlowAttrs {
			if attrs[k] != v {
				t.Errorf("record attribute %s = %q, want %q (all: %v)", k, attrs[k], v, attrs)
			}
		}
		if r.GetEventName() != FlowLogEvent || r.GetSeverityText() != "WARN" || r.GetTimeUnixNano() == 0 {
			t.Errorf("record event name %q, severity %q, time %d: want %s, WARN, set", r.GetEventName(), r.GetSeverityText(), r.GetTimeUnixNano(), FlowLogEvent)
		}
		if b := r.GetBody().GetStringValue(); !strings.Contains(b, "ingress deny pod shop/web-1") || !strings.Contains(b, "by PolicyEndpoint shop/web") {
			t.Errorf("record body %q", b)
		}
	}
}

// The flow counters are exported with their reasons.
func TestFlowCountersExported(t *testing.T) {
	tel := newInMemory(t)
	if err := tel.ObserveFlows(func(c *report.FlowCounts) {
		*c = report.FlowCounts{Emitted: 7, RateLimited: 5, BufferFull: 3, QueueFull: 2}
	}); err != nil {
		t.Fatal(err)
	}
	rm := tel.collect(t)
	for _, c := range []struct {
		name, reason string
		want         int64
	}{
		{FlowEventsEmittedName, "", 7}, {FlowEventsSuppressedName, "rate_limited", 5},
		{FlowEventsSuppressedName, "buffer_full", 3}, {FlowEventsDroppedName, "queue_full", 2},
	} {
		var got int64
		if c.reason == "" {
			got = counterValue(t, rm, c.name)
		} else {
			got = counterValue(t, rm, c.name, ReasonKey.String(c.reason))
		}
		if got != c.want {
			t.Errorf("%s %s = %d, want %d", c.name, c.reason, got, c.want)
		}
	}
}

// The flow log file rotates by size, keeps the number of files asked, every line is
// one JSON object with the documented names, and FlowFileNames finds those files.
func TestFlowFileRotates(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "flows.log")
	f, err := NewFlowFile(FlowFileOptions{Path: path, MaxSizeMB: 1, MaxFiles: 2})
	if err != nil {
		t.Fatal(err)
	}
	// Past 3 MB: three rotations.
	const n = 12000
	for i := range n {
		f.Flow(sampleFlow(i))
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if f.Failed() != 0 {
		t.Errorf("%d lines failed", f.Failed())
	}
	// lumberjack removes rotated files past MaxFiles in the background.
	var files []os.DirEntry
	testenv.Eventually(t, 5*time.Second, "at most the current file and 2 rotated ones", func() bool {
		files, _ = os.ReadDir(dir)
		return len(files) == 3
	})
	lines := 0
	for _, e := range files {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() > 1<<20 {
			t.Errorf("%s: %d bytes, past the 1 MB bound", e.Name(), fi.Size())
		}
		fh, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			lines++
			var m map[string]any
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				t.Fatalf("%s: line %q does not parse: %v", e.Name(), sc.Text(), err)
			}
			for k, v := range wantFlowAttrs {
				if got := jsonString(m[k]); got != v {
					t.Fatalf("%s: %s = %q, want %q (line %s)", e.Name(), k, got, v, sc.Text())
				}
			}
			if m["severity"] != "WARN" || m["time"] == nil || m["body"] == nil {
				t.Fatalf("%s: line lacks time, severity or body: %s", e.Name(), sc.Text())
			}
		}
		_ = fh.Close()
	}
	if lines == 0 || lines >= n {
		t.Errorf("%d lines kept of %d written: want some, the oldest rotated away", lines, n)
	}
	if _, err := NewFlowFile(FlowFileOptions{Path: "relative.log"}); err == nil {
		t.Error("a relative path was accepted")
	}
	// FlowFileNames names the file and its rotated copies, what lumberjack wrote,
	// and no other file beside them.
	var want []string
	for _, e := range files {
		want = append(want, filepath.Join(dir, e.Name()))
	}
	for _, other := range []string{"flows-notes.log", "other.log", "flows.log.1", "flows-2026-12-06T01-02-03.000.txt"} {
		if err := os.WriteFile(filepath.Join(dir, other), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "flows-2026-12-06T01-02-03.000.log"), 0o700); err != nil {
		t.Fatal(err)
	}
	if got, err := FlowFileNames(path); err != nil || !slices.Equal(got, want) {
		t.Errorf("FlowFileNames = %v, %v; want %v", got, err, want)
	}
	if got, err := FlowFileNames(filepath.Join(dir, "gone", "flows.log")); err != nil || len(got) != 0 {
		t.Errorf("FlowFileNames in a missing directory = %v, %v; want none", got, err)
	}
}

func jsonString(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case nil:
		return ""
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// Without a log exporter Flow exports nothing, and says so.
func TestFlowsExportedOnlyWithALogExporter(t *testing.T) {
	if newInMemory(t).FlowsExported() {
		t.Error("FlowsExported without OTLP logs or a log exporter")
	}
	tel, err := New(context.Background(), WithOTLP(false), WithLogExporter(nopLogExporter{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	if !tel.FlowsExported() {
		t.Error("not FlowsExported with a log exporter")
	}
	tel.Flow(sampleFlow(0)) // never blocks
}

type nopLogExporter struct{}

func (nopLogExporter) Export(context.Context, []sdklog.Record) error { return nil }
func (nopLogExporter) Shutdown(context.Context) error                { return nil }
func (nopLogExporter) ForceFlush(context.Context) error              { return nil }

// FlowFileNames with a file whose own extension is .gz: its rotated copies, plain and
// compressed, are found as lumberjack names them (pure logic).
func TestFlowFileNamesGzExtension(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "flows.gz")
	names := []string{"flows-2026-12-06T01-02-03.000.gz", "flows-2026-12-06T01-02-04.000.gz.gz", "flows.gz", "flows-x.gz"}
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{filepath.Join(dir, names[0]), filepath.Join(dir, names[1]), path}
	if got, err := FlowFileNames(path); err != nil || !slices.Equal(got, want) {
		t.Errorf("FlowFileNames = %v, %v; want %v", got, err, want)
	}
}
