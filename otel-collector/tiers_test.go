package otelcollector

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"sigs.k8s.io/yaml"

	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/telemetry"
	"github.com/npagent/npagent/internal/testenv"
)

// The tiers as shipped: otel-collector/gateway/node.yaml (one node collector) sends
// by trace id to two replicas of otel-collector/gateway/gateway.yaml, which tail
// sample into a real Jaeger and pass metrics to a real Prometheus.
const (
	slowThresholdMS = 1000 // TAIL_SLOW_THRESHOLD_MS
	samplePercent   = 10   // TAIL_SAMPLE_PERCENT
	decisionWait    = 2 * time.Second
	gateways        = 2
)

// TestCollectorTiers sends npagent's traces of known latency through the node
// tier and shows what the gateways keep:
//
//   - every trace at least slowThresholdMS long, marked or not;
//   - every trace whose root carries npagent.exemplar=true;
//   - of the others (fast, unmarked), a share near samplePercent, within bounds
//     derived below;
//   - each kept trace whole, through one gateway replica, and both replicas used;
//   - every exemplar Prometheus holds names a trace Jaeger holds, whole;
//   - metrics are not sampled: the histogram counts every trigger.
//
// The traces come from the real telemetry package fed report.Record values; a
// tee (an in-memory exporter next to OTLP) tells the test which roots it marked.
// npagent marks only the roots whose point its exemplar reservoir kept (the
// first per latency octave per export interval), so most traces, slow and fast,
// are unmarked, and the latency and share policies are each shown on traces
// only they can keep.
func TestCollectorTiers(t *testing.T) {
	gw := testenv.ToolPath(t, "otelcol-gateway")
	promBin := testenv.ToolPath(t, "prometheus")
	jaegerBin := testenv.ToolPath(t, "jaeger")

	jaegerOTLP, jaegerQuery := freeAddr(t), freeAddr(t)
	start(t, "jaeger", jaegerBin, []string{"--config", filepath.Join(testenv.RepoRoot(), "examples", "demo", "jaeger.yaml")},
		"JAEGER_OTLP_GRPC_PORT="+port(jaegerOTLP), "JAEGER_QUERY_HTTP_PORT="+port(jaegerQuery),
		"JAEGER_QUERY_GRPC_PORT="+port(freeAddr(t)))
	jaeger := "http://" + jaegerQuery
	waitHTTP(t, "Jaeger's query API", jaeger+"/api/services")

	promAddr := freeAddr(t)
	promDir := t.TempDir()
	promCfg := filepath.Join(promDir, "prometheus.yml")
	writeFile(t, promCfg, "global:\n  evaluation_interval: 15s\notlp:\n  promote_resource_attributes: [k8s.node.name, k8s.cluster.name]\n")
	start(t, "prometheus", promBin, []string{"--config.file=" + promCfg, "--storage.tsdb.path=" + filepath.Join(promDir, "data"),
		"--web.listen-address=" + promAddr, "--web.enable-otlp-receiver", "--enable-feature=exemplar-storage"})
	prom := "http://" + promAddr
	waitHTTP(t, "Prometheus", prom+"/-/ready")

	var gwAddrs []string
	var gwOutputs []*testenv.LogBuffer
	for i := range gateways {
		addr := freeAddr(t)
		gwAddrs = append(gwAddrs, addr)
		out := start(t, fmt.Sprintf("gateway-%d", i), gw, []string{"--config", filepath.Join(testenv.RepoRoot(), "otel-collector", "gateway", "gateway.yaml")},
			"OTLP_GRPC_ENDPOINT="+addr, "PROMETHEUS_HOST="+promAddr, "JAEGER_OTLP_GRPC_ENDPOINT="+jaegerOTLP,
			"TAIL_SLOW_THRESHOLD_MS="+strconv.Itoa(slowThresholdMS), "TAIL_SAMPLE_PERCENT="+strconv.Itoa(samplePercent),
			"TAIL_DECISION_WAIT="+decisionWait.String(), fmt.Sprintf("POD_NAME=gateway-%d", i))
		gwOutputs = append(gwOutputs, out)
		waitTCP(t, "gateway", addr)
	}
	nodeAddr := freeAddr(t)
	start(t, "node", gw, []string{"--config", nodeConfig(t, gwAddrs)},
		"OTLP_GRPC_ENDPOINT="+nodeAddr, "OTLP_HTTP_ENDPOINT="+freeAddr(t),
		"K8S_NODE_NAME=node-tiers", "K8S_CLUSTER_NAME=cluster-tiers")
	waitTCP(t, "node collector", nodeAddr)

	// npagent: the real telemetry package, OTLP to the node collector.
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+nodeAddr)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
	tee := tracetest.NewInMemoryExporter()
	tel, err := telemetry.New(context.Background(), telemetry.WithNodeName("node-tiers"),
		telemetry.WithMeterExportInterval(500*time.Millisecond), telemetry.WithTraceExporter(tee),
		// Room for every tree reported at once (440 × 5 spans): nothing dropped at
		// the agent, so every trace the gateways do not keep was their decision.
		telemetry.WithSpanQueueSize(4096))
	if err != nil {
		t.Fatalf("telemetry.New: %v", err)
	}
	defer tel.Shutdown(context.Background())

	const nSlow, nFast = 40, 400
	base := time.Now().Add(-10 * time.Minute)
	for i := range nSlow + nFast {
		// Latencies spread evenly: slow ones 1.5 s .. 5 s, fast ones 5 ms .. 300 ms.
		lat := 5*time.Millisecond + time.Duration(i-nSlow)*295*time.Millisecond/nFast
		if i < nSlow {
			lat = 1500*time.Millisecond + time.Duration(i)*3500*time.Millisecond/nSlow
		}
		tel.Report(record(base.Add(time.Duration(i)*time.Second), fmt.Sprintf("pe-%03d", i), lat))
	}
	// Flow events (log records) through both tiers too: the gateways print them.
	const nFlows = 25
	for i := range nFlows {
		tel.Flow(&report.FlowEvent{Time: time.Now(), Node: "node-tiers", Kind: "deny", Verdict: "deny", Direction: "ingress",
			Reason: "default_deny", Namespace: "shop", Pod: "web-1", PodIP: netip.MustParseAddr("10.0.1.2"),
			Src: netip.MustParseAddr("10.0.9.9"), Dst: netip.MustParseAddr("10.0.1.2"), SrcPort: uint16(40000 + i), DstPort: 8080, Protocol: 6})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := tel.ForceFlush(ctx); err != nil {
		t.Fatalf("telemetry ForceFlush: %v", err)
	}
	checkFlowsPrinted(t, gwOutputs, nFlows)
	if spans, exports := tel.Dropped(); spans != 0 || exports != 0 {
		t.Fatalf("telemetry dropped %d spans, %d metric exports", spans, exports)
	}
	type sent struct {
		latency time.Duration
		marked  bool
		spans   int
	}
	traces := map[string]*sent{} // trace id (hex) → what npagent sent
	spans := tee.GetSpans()
	for _, s := range spans {
		if s.Name == telemetry.SpanProgram {
			st := &sent{latency: s.EndTime.Sub(s.StartTime)}
			for _, kv := range s.Attributes {
				if kv.Key == telemetry.ExemplarKey && kv.Value.Type() == attribute.BOOL && kv.Value.AsBool() {
					st.marked = true
				}
			}
			traces[s.SpanContext.TraceID().String()] = st
		}
	}
	for _, s := range spans {
		traces[s.SpanContext.TraceID().String()].spans++
	}
	if got := len(traces); got != nSlow+nFast {
		t.Fatalf("npagent sent %d traces, want one per record (%d)", got, nSlow+nFast)
	}

	// Wait for what must arrive (slow or marked), then for the decisions on
	// the rest: every trace left the node collector about when the slow and
	// marked ones did, so three more decision waits (the processor decides on
	// a one-second tick after decision_wait) plus the batch timeouts of the node
	// (1 s), the gateway (1 s) and Jaeger (1 s) cover them with room for a
	// loaded machine.
	mustKeep := 0
	for _, s := range traces {
		if s.marked || s.latency >= slowThresholdMS*time.Millisecond {
			mustKeep++
		}
	}
	kept := map[string]jaegerTrace{} // trace id → what Jaeger holds of it
	// No failure here when time runs out: the tally below says which are missing.
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		n := 0
		for id, s := range traces {
			if !(s.marked || s.latency >= slowThresholdMS*time.Millisecond) {
				continue
			}
			if kept[id].spans == 0 {
				kept[id] = jaegerGet(t, jaeger, id)
			}
			if kept[id].spans > 0 {
				n++
			}
		}
		if n == mustKeep {
			break
		}
	}
	time.Sleep(3*decisionWait + 4*time.Second)
	for id := range traces {
		kept[id] = jaegerGet(t, jaeger, id)
	}

	type tally struct{ sent, kept int }
	byReplica := map[string]int{} // gateway replica → traces it kept
	var slowMarked, slowUnmarked, fastMarked, fastUnmarked tally
	for id, s := range traces {
		var c *tally
		switch slow := s.latency >= slowThresholdMS*time.Millisecond; {
		case slow && s.marked:
			c = &slowMarked
		case slow:
			c = &slowUnmarked
		case s.marked:
			c = &fastMarked
		default:
			c = &fastUnmarked
		}
		c.sent++
		k := kept[id]
		if k.spans == 0 {
			continue
		}
		c.kept++
		// Whole trees through one replica: routing by trace id sends all of a
		// trace's spans to one gateway, which keeps or drops them together.
		if want := s.spans; k.spans != want {
			t.Errorf("trace %s: Jaeger holds %d spans, npagent sent %d", id, k.spans, want)
		}
		if len(k.replicas) != 1 {
			t.Errorf("trace %s: spans forwarded by replicas %v, want one", id, k.replicas)
		}
		for r := range k.replicas {
			byReplica[r]++
		}
	}
	t.Logf("kept traces by gateway replica: %v", byReplica)
	for i := range gateways {
		if r := fmt.Sprintf("gateway-%d", i); byReplica[r] == 0 {
			t.Errorf("gateway replica %s forwarded no trace: the node tier did not spread traces (%v)", r, byReplica)
		}
	}
	t.Logf("kept/sent: slow marked %d/%d, slow unmarked %d/%d, fast marked %d/%d, fast unmarked %d/%d",
		slowMarked.kept, slowMarked.sent, slowUnmarked.kept, slowUnmarked.sent,
		fastMarked.kept, fastMarked.sent, fastUnmarked.kept, fastUnmarked.sent)
	if slowUnmarked.sent < nSlow/2 || slowUnmarked.kept != slowUnmarked.sent {
		t.Errorf("slow unmarked traces: %d of %d kept, want all of at least %d (the latency policy)",
			slowUnmarked.kept, slowUnmarked.sent, nSlow/2)
	}
	if slowMarked.kept != slowMarked.sent || fastMarked.kept != fastMarked.sent {
		t.Errorf("marked traces: slow %d of %d, fast %d of %d kept, want all (the exemplar policy)",
			slowMarked.kept, slowMarked.sent, fastMarked.kept, fastMarked.sent)
	}
	if slowMarked.sent+fastMarked.sent == 0 {
		t.Error("npagent marked no root: the exemplar policy was not exercised")
	}
	// The share: the probabilistic policy keeps a trace when an FNV hash of its
	// (random) trace id falls under samplePercent of the range, so the count
	// kept of m fast unmarked traces is Binomial(m, p). Bounds at 4.5 standard
	// deviations: a correct tier fails this less than once in 100,000 runs; one
	// that keeps all or none (m about 390, p = 0.1: mean 39, sd 6, bounds
	// 13..66) always fails it. At least half the fast traces must be unmarked,
	// or the mark is so wide that the tier cannot sample npagent's traces.
	m, p := float64(fastUnmarked.sent), samplePercent/100.0
	sd := math.Sqrt(m * p * (1 - p))
	lo, hi := int(math.Ceil(m*p-4.5*sd)), int(math.Floor(m*p+4.5*sd))
	if fastUnmarked.sent < nFast/2 || fastUnmarked.kept < lo || fastUnmarked.kept > hi {
		t.Errorf("fast unmarked traces: %d of %d kept, want %d..%d (%d %% ± 4.5 sd) of at least %d",
			fastUnmarked.kept, fastUnmarked.sent, lo, hi, samplePercent, nFast/2)
	}
	t.Logf("fast unmarked share: %d of %d kept (%.1f %%), bounds %d..%d", fastUnmarked.kept, fastUnmarked.sent,
		100*float64(fastUnmarked.kept)/m, lo, hi)

	// Metrics through both tiers, unsampled: the histogram counts every trigger,
	// and every exemplar names a trace Jaeger holds whole.
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := tel.Shutdown(ctx); err != nil {
		t.Fatalf("telemetry Shutdown: %v", err)
	}
	const series = "npagent_policy_programming_latency_seconds"
	// The label k8s_cluster_name comes from the node tier's resource processor.
	testenv.Eventually(t, 30*time.Second, "Prometheus to count every trigger", func() bool {
		v, ok := promScalar(t, prom, "sum(histogram_count("+series+`{k8s_cluster_name="cluster-tiers"}))`)
		return ok && v == nSlow+nFast
	})
	exemplars := promExemplars(t, prom, series)
	if len(exemplars) == 0 {
		t.Fatal("Prometheus holds no exemplars for " + series)
	}
	for _, id := range exemplars {
		s := traces[id]
		if s == nil {
			t.Errorf("exemplar names trace %s, which npagent did not send", id)
			continue
		}
		if got := jaegerGet(t, jaeger, id).spans; got != s.spans {
			t.Errorf("exemplar's trace %s (latency %v, marked %v): Jaeger holds %d spans, want %d",
				id, s.latency, s.marked, got, s.spans)
		}
		if !s.marked {
			t.Errorf("exemplar's trace %s (latency %v) was not marked: only luck kept it", id, s.latency)
		}
	}
	t.Logf("%d exemplars in Prometheus, each naming a trace Jaeger holds whole", len(exemplars))
}

// logRecordsPrinted matches the debug exporter's line per batch of log records.
var logRecordsPrinted = regexp.MustCompile(`"otelcol.component.id": "debug/logs".*"log records": (\d+)`)

// checkFlowsPrinted waits until the gateways' debug/logs exporters have printed at
// least want log records between them. More is no failure: an export the node
// collector retried after a timeout is printed twice (OTLP is at least once).
func checkFlowsPrinted(t *testing.T, outputs []*testenv.LogBuffer, want int) {
	t.Helper()
	count := func() (n int) {
		for _, out := range outputs {
			for _, m := range logRecordsPrinted.FindAllStringSubmatch(out.String(), -1) {
				c, _ := strconv.Atoi(m[1])
				n += c
			}
		}
		return n
	}
	// The node's batch (1 s), the gateway's (1 s), with room for a loaded machine.
	testenv.Eventually(t, 30*time.Second, "the gateways printed every flow event", func() bool { return count() >= want })
	t.Logf("the gateways printed %d flow log records (%d sent)", count(), want)
}

// TestTierConfigsValidate checks node.yaml and gateway.yaml exactly as shipped,
// including the parts TestCollectorTiers replaces (node.yaml's dns resolver), with
// the collector's own validate command: every component known to the build, every
// setting decoded.
func TestTierConfigsValidate(t *testing.T) {
	gw := testenv.ToolPath(t, "otelcol-gateway")
	for _, name := range []string{"node.yaml", "gateway.yaml"} {
		cmd := exec.Command(gw, "validate", "--config", filepath.Join(testenv.RepoRoot(), "otel-collector", "gateway", name))
		cmd.Env = append(os.Environ(), "GATEWAY_HOSTNAME=otelcol-gateway-headless.observability.svc.cluster.local")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("otelcol-gateway validate %s: %v\n%s", name, err, out)
		}
	}
}

// TestGatewayKeepsTheMark: gateway.yaml's exemplar policy names the attribute
// npagent sets (telemetry.ExemplarMarkAttr), with the value it sets.
func TestGatewayKeepsTheMark(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "otel-collector", "gateway", "gateway.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Processors struct {
			TailSampling struct {
				Policies []struct {
					Type             string `json:"type"`
					BooleanAttribute struct {
						Key   string `json:"key"`
						Value bool   `json:"value"`
					} `json:"boolean_attribute"`
				} `json:"policies"`
			} `json:"tail_sampling"`
		} `json:"processors"`
	}
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	for _, p := range cfg.Processors.TailSampling.Policies {
		if p.Type == "boolean_attribute" && p.BooleanAttribute.Key == telemetry.ExemplarMarkAttr && p.BooleanAttribute.Value {
			return
		}
	}
	t.Errorf("gateway.yaml: no tail_sampling policy keeps %s=true: %+v", telemetry.ExemplarMarkAttr, cfg.Processors.TailSampling.Policies)
}

// record is a trigger programmed latency after trig, with its phases spread over
// that time (as the reconcile loop reports them).
func record(trig time.Time, name string, latency time.Duration) *report.Record {
	return &report.Record{
		Kind:            report.KindPolicyEndpoint,
		Namespace:       "team-a",
		Name:            name,
		UID:             "uid-" + name,
		PolicyRef:       "np-" + name,
		ResourceVersion: "1",
		Trigger:         trig,
		Received:        trig.Add(latency / 4),
		WorkerStart:     trig.Add(latency / 2),
		ComputeStart:    trig.Add(latency / 2),
		ComputeEnd:      trig.Add(latency * 3 / 4),
		Attempts:        []report.Attempt{{Start: trig.Add(latency * 3 / 4), End: trig.Add(latency)}},
		Pods:            2,
		Entries:         9,
	}
}

// nodeConfig is otel-collector/gateway/node.yaml with its dns resolver (a
// headless Service in a cluster) replaced by a static list of the test's
// gateways; everything else as shipped.
func nodeConfig(t *testing.T, gateways []string) string {
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "otel-collector", "gateway", "node.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	exporters, _ := cfg["exporters"].(map[string]any)
	swapped := 0
	for name, e := range exporters {
		if !strings.HasPrefix(name, "load_balancing") {
			continue
		}
		lb := e.(map[string]any)
		if _, ok := lb["resolver"].(map[string]any)["dns"]; !ok {
			t.Fatalf("node.yaml: %s has no dns resolver to swap", name)
		}
		lb["resolver"] = map[string]any{"static": map[string]any{"hostnames": gateways}}
		swapped++
	}
	if swapped != 3 {
		t.Fatalf("node.yaml: %d loadbalancing exporters, want 3 (traces, metrics, logs)", swapped)
	}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "node.yaml")
	writeFile(t, path, string(out))
	return path
}

// start runs a tool until the test ends, its output kept for the failure message.
// start runs bin until the test ends; its output is returned, and logged if the
// test failed.
func start(t *testing.T, name, bin string, args []string, env ...string) *testenv.LogBuffer {
	t.Helper()
	logs := &testenv.LogBuffer{}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("%s output:\n%s", name, tail(logs.String(), 4000))
		}
	})
	return logs
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func port(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

func writeFile(t *testing.T, path, content string) {
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func waitTCP(t *testing.T, what, addr string) {
	testenv.Eventually(t, 60*time.Second, what+" to listen on "+addr, func() bool {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

func waitHTTP(t *testing.T, what, u string) {
	testenv.Eventually(t, 60*time.Second, what+" to answer at "+u, func() bool {
		resp, err := http.Get(u)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

func getJSON(t *testing.T, u string, v any) int {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(body, v); err != nil {
			t.Fatalf("GET %s: %v in %s", u, err, tail(string(body), 500))
		}
	}
	return resp.StatusCode
}

// jaegerTrace is what Jaeger holds of a trace: its spans (0: not found) and the
// gateway replicas that forwarded them (npagent.gateway.replica on each
// span's process), with how many spans each.
type jaegerTrace struct {
	spans    int
	replicas map[string]int
}

func jaegerGet(t *testing.T, jaeger, traceID string) jaegerTrace {
	var r struct {
		Data []struct {
			Spans []struct {
				ProcessID string `json:"processID"`
			} `json:"spans"`
			Processes map[string]struct {
				Tags []struct {
					Key   string `json:"key"`
					Value any    `json:"value"`
				} `json:"tags"`
			} `json:"processes"`
		} `json:"data"`
	}
	got := jaegerTrace{replicas: map[string]int{}}
	switch code := getJSON(t, jaeger+"/api/traces/"+traceID, &r); code {
	case http.StatusOK:
	case http.StatusNotFound:
		return got
	default:
		t.Fatalf("Jaeger /api/traces/%s: HTTP %d", traceID, code)
	}
	for _, d := range r.Data {
		for _, sp := range d.Spans {
			got.spans++
			replica := ""
			for _, tag := range d.Processes[sp.ProcessID].Tags {
				if tag.Key == "npagent.gateway.replica" {
					replica = fmt.Sprint(tag.Value)
				}
			}
			got.replicas[replica]++
		}
	}
	return got
}

func promScalar(t *testing.T, prom, query string) (float64, bool) {
	var r struct {
		Data struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if code := getJSON(t, prom+"/api/v1/query?"+url.Values{"query": {query}}.Encode(), &r); code != http.StatusOK || len(r.Data.Result) != 1 {
		return 0, false
	}
	s, _ := r.Data.Result[0].Value[1].(string)
	v, err := strconv.ParseFloat(s, 64)
	return v, err == nil
}

// promExemplars returns the trace ids of the exemplars Prometheus holds for series.
func promExemplars(t *testing.T, prom, series string) []string {
	now := time.Now()
	q := url.Values{"query": {series}, "start": {strconv.FormatInt(now.Add(-time.Hour).Unix(), 10)},
		"end": {strconv.FormatInt(now.Add(time.Minute).Unix(), 10)}}
	var r struct {
		Data []struct {
			Exemplars []struct {
				Labels map[string]string `json:"labels"`
			} `json:"exemplars"`
		} `json:"data"`
	}
	if code := getJSON(t, prom+"/api/v1/query_exemplars?"+q.Encode(), &r); code != http.StatusOK {
		t.Fatalf("query_exemplars: HTTP %d", code)
	}
	var ids []string
	for _, s := range r.Data {
		for _, e := range s.Exemplars {
			id := e.Labels["trace_id"]
			if _, err := hex.DecodeString(id); err != nil || len(id) != 32 {
				t.Errorf("exemplar without a trace id: %v", e.Labels)
				continue
			}
			ids = append(ids, id)
		}
	}
	return ids
}
