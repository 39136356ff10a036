// Command verify is the demo's last step: it follows the chain from the churn
// driver's writes through npagent to Prometheus and Jaeger, prints a summary, and
// exits non-zero when a link is broken.
//
// It reads the churn driver's JSON summary (triggers written), waits until npagent
// has nothing pending, reads npagent's own /metrics (triggers reported, suppressed
// by reason), waits until Prometheus holds as many latency observations as npagent
// reported, queries the p50 and p99 and the exemplars of
// npagent_policy_programming_latency_seconds, fetches the trace of one exemplar from
// Jaeger and prints its span tree.
//
// With --dashboard it also runs every query of the Grafana dashboard
// (deploy/grafana/npagent.json) against Prometheus, and it reads the SLO
// recording rules (deploy/prometheus/npagent.rules.yaml) the demo's Prometheus
// evaluates.
//
// Checks (each failure is printed, and the exit status is 1):
//   - npagent reported at least one trigger;
//   - Prometheus's histogram_count equals npagent's reported count (the OTLP chain
//     lost and duplicated nothing);
//   - reported + the accepted-then-dropped reasons (deleted, overflow,
//     no_local_pods) never exceed the triggers written (no trigger counted twice),
//     and equal them when the apiserver was not restarted (--apiserver-restarted=false);
//   - npagent counted relist deliveries (the apiserver restart happened) and
//     suppressed re-deliveries as redelivered;
//   - every pod the churn driver started mid-run is one point of
//     npagent_pod_enforcement_latency_seconds (its new-pod window, observed once
//     across the apiserver restart's relist), and none was counted unselected;
//   - the cluster p50, p90 and p99 recording rule has a value for each;
//   - with --dashboard, every panel query answers with a number, for "All"
//     and for each node the instance variable lists, and every
//     exemplar-enabled query has exemplars (checkDashboard);
//   - an exemplar names a trace Jaeger has, whose spans include policy.program
//     with its delivery, queue and commit children;
//   - the writer's trace is reachable from it (--trace-parenting, as npagent
//     was run): with link (npagent's default, KEP-5915) policy.program is a
//     root with a span link (Jaeger: a FOLLOWS_FROM reference) to a span of
//     another trace, which Jaeger has and which is churn's policy.change; with
//     child, policy.program's parent is churn's policy.change in the same trace.
package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

const (
	latencyMetric    = "npagent_policy_programming_latency_seconds"
	suppressedMetric = "npagent_policy_programming_suppressed_total"
	pendingMetric    = "npagent_seen_pending"
	deliveriesMetric = "npagent_policy_deliveries_total"
	podWindowMetric  = "npagent_pod_enforcement_latency_seconds"
	unselectedMetric = "npagent_pod_enforcement_unselected_total"
)

func main() {
	prom := flag.String("prometheus", "", "Prometheus base URL (required)")
	jaeger := flag.String("jaeger", "", "Jaeger query base URL (required)")
	agent := flag.String("agent", "", "npagent HTTP base URL (required)")
	churnFile := flag.String("churn-summary", "", "the churn driver's JSON summary (required)")
	timeout := flag.Duration("timeout", 90*time.Second, "how long to wait for each stage to settle")
	parenting := flag.String("trace-parenting", "link", "npagent's --trace-parenting: link (follow policy.program's span link to the writer's trace) or child (its parent)")
	slowestFile := flag.String("slowest-object-file", "", "write the object of the slowest exemplar's trace there, as npagent explain names it (pe/<ns>/<name>, cpe/<name>); empty: not written")
	dashboard := flag.String("dashboard", "", "a Grafana dashboard JSON (deploy/grafana/npagent.json): run each panel's query against Prometheus; empty: not checked")
	restarted := flag.Bool("apiserver-restarted", true, "the apiserver was restarted during the churn: expect relists; "+
		"false: expect every written trigger to be accounted for exactly")
	flag.Parse()
	if *parenting != "link" && *parenting != "child" {
		fmt.Fprintf(os.Stderr, "verify: --trace-parenting=%q: want link or child\n", *parenting)
		os.Exit(2)
	}
	if *prom == "" || *jaeger == "" || *agent == "" || *churnFile == "" {
		fmt.Fprintln(os.Stderr, "verify: --prometheus, --jaeger, --agent and --churn-summary are required")
		os.Exit(2)
	}
	v := &verifier{prom: *prom, jaeger: *jaeger, agent: *agent, timeout: *timeout, restarted: *restarted, dashboard: *dashboard, slowestFile: *slowestFile,
		link: *parenting == "link", http: &http.Client{Timeout: 10 * time.Second}}
	if err := v.run(*churnFile); err != nil {
		fmt.Fprintf(os.Stderr, "verify: %v\n", err)
		os.Exit(1)
	}
	if len(v.failures) > 0 {
		fmt.Println("\nCHAIN BROKEN:")
		for _, f := range v.failures {
			fmt.Println("  -", f)
		}
		os.Exit(1)
	}
	fmt.Println("\nchain intact: every check passed")
}

type verifier struct {
	prom, jaeger, agent string
	timeout             time.Duration
	restarted           bool   // the apiserver restarted mid-run
	dashboard           string // the Grafana dashboard whose queries must answer ("": not checked)
	slowestFile         string // where to write the slowest exemplar's object ("": nowhere)
	link                bool   // npagent links its root to the writer's context (else parents it)
	http                *http.Client
	failures            []string
}

func (v *verifier) fail(format string, args ...any) {
	v.failures = append(v.failures, fmt.Sprintf(format, args...))
}

type churnSummary struct {
	TriggersWritten int `json:"triggers_written"`
	Creates         int `json:"creates"`
	Updates         int `json:"updates"`
	Recreates       int `json:"recreates"`
	Retries         int `json:"retries"`
	Errors          int `json:"errors"`
	Objects         int `json:"objects"`
	NewPods         int `json:"new_pods"`
}

func (v *verifier) run(churnFile string) error {
	raw, err := os.ReadFile(churnFile)
	if err != nil {
		return fmt.Errorf("churn summary: %w", err)
	}
	var churn churnSummary
	if err := json.Unmarshal(raw, &churn); err != nil {
		return fmt.Errorf("churn summary %s: %w", churnFile, err)
	}

	// 1. npagent settles: nothing pending.
	var agentMetrics string
	err = v.poll("npagent to have no pending trigger", func() (bool, error) {
		agentMetrics, err = v.get(v.agent + "/metrics")
		if err != nil {
			return false, err
		}
		return sampleSum(agentMetrics, pendingMetric) == 0, nil
	})
	if err != nil {
		v.fail("npagent still has %v pending triggers: %v", sampleSum(agentMetrics, pendingMetric), err)
	}
	reported := sampleSum(agentMetrics, latencyMetric+"_count")
	suppressed := map[string]float64{}
	for _, reason := range []string{"redelivered", "stale", "before_start", "invalid_annotation", "no_local_pods", "deleted", "overflow"} {
		suppressed[reason] = sampleSum(agentMetrics, suppressedMetric, `reason="`+reason+`"`)
	}

	deliveries := map[string]float64{}
	for _, cause := range []string{"add", "update", "resync", "relist", "requeue", "delete"} {
		deliveries[cause] = sampleSum(agentMetrics, deliveriesMetric, `cause="`+cause+`"`)
	}

	// 2. Prometheus holds what npagent reported.
	var promCount float64
	err = v.poll("Prometheus histogram_count to equal npagent's reported count", func() (bool, error) {
		promCount, err = v.query("sum(histogram_count(" + latencyMetric + "))")
		return err == nil && promCount == reported, err
	})
	if err != nil {
		v.fail("Prometheus histogram_count = %v, npagent reported %v: %v", promCount, reported, err)
	}
	p50, err50 := v.query("histogram_quantile(0.5, sum(" + latencyMetric + "))")
	p99, err99 := v.query("histogram_quantile(0.99, sum(" + latencyMetric + "))")
	var podP99 float64
	var errPod error
	if churn.NewPods > 0 {
		podP99, errPod = v.query("histogram_quantile(0.99, sum(" + podWindowMetric + "))")
	}
	if err := errors.Join(err50, err99, errPod); err != nil {
		v.fail("latency quantiles: %v", err)
	}
	promSuppressed, err := v.queryVector("sum by (reason) (" + suppressedMetric + ")")
	if err != nil {
		v.fail("suppressed counter in Prometheus: %v", err)
	}

	// The SLO recording rules (deploy/prometheus) evaluated in this Prometheus.
	ruleQ, err := v.ruleQuantiles()
	if err != nil {
		v.fail("recording rule %s: %v", quantileRule, err)
	}
	// Every query of the Grafana dashboard answers.
	var dash dashboardResult
	if v.dashboard != "" {
		dash, err = v.checkDashboard(v.dashboard)
		if err != nil {
			v.fail("dashboard %s: %v", v.dashboard, err)
		}
		for _, f := range dash.failures {
			v.fail("dashboard %s: %s", v.dashboard, f)
		}
	}

	// 3. Exemplars and one trace.
	exemplars, err := v.exemplars()
	if err != nil {
		v.fail("exemplars: %v", err)
	}

	fmt.Println()
	fmt.Println("=== npagent demo summary ===")
	fmt.Printf("triggers written by the churn driver: %d (creates %d, updates %d, recreates %d; %d writes retried while the apiserver restarted, %d failed)\n",
		churn.TriggersWritten, churn.Creates, churn.Updates, churn.Recreates, churn.Retries, churn.Errors)
	fmt.Printf("triggers reported by npagent:        %.0f (Prometheus histogram_count: %.0f)\n", reported, promCount)
	fmt.Printf("suppressed by npagent (its /metrics): redelivered %.0f, stale %.0f, before_start %.0f, deleted %.0f, overflow %.0f, no_local_pods %.0f, invalid_annotation %.0f\n",
		suppressed["redelivered"], suppressed["stale"], suppressed["before_start"], suppressed["deleted"],
		suppressed["overflow"], suppressed["no_local_pods"], suppressed["invalid_annotation"])
	fmt.Printf("suppressed in Prometheus by reason:   %s\n", formatVector(promSuppressed))
	fmt.Printf("informer deliveries by cause:         add %.0f, update %.0f, resync %.0f, relist %.0f, requeue %.0f, delete %.0f\n",
		deliveries["add"], deliveries["update"], deliveries["resync"], deliveries["relist"], deliveries["requeue"], deliveries["delete"])
	fmt.Printf("programming latency p50 %s, p99 %s\n", seconds(p50), seconds(p99))
	fmt.Printf("SLO recording rules (%s): p50 %s, p90 %s, p99 %s\n", quantileRule,
		seconds(ruleQ["0.5"]), seconds(ruleQ["0.9"]), seconds(ruleQ["0.99"]))
	if v.dashboard == "" {
		fmt.Println("dashboard: not checked (no --dashboard)")
	} else {
		verdict := "every query answered"
		if len(dash.failures) > 0 {
			verdict = fmt.Sprintf("%d queries FAILED (listed below)", len(dash.failures))
		}
		fmt.Printf("dashboard %s: %d panels, %d queries, each run for %s: %s; %d exemplars for its %d exemplar queries\n",
			v.dashboard, dash.panels, dash.queries, strings.Join(dash.variableSets, " and "), verdict, dash.exemplars, dash.exemplarQueries)
	}
	accounted := reported + suppressed["deleted"] + suppressed["overflow"] + suppressed["no_local_pods"]
	fmt.Printf("accounting: reported + deleted + overflow + no_local_pods = %.0f of %d written", accounted, churn.TriggersWritten)
	if unseen := float64(churn.TriggersWritten) - accounted; unseen > 0 {
		fmt.Printf(" (%.0f never seen by the agent: versions overwritten while its watch was down; a relist delivers only the latest)", unseen)
	}
	fmt.Println()
	fmt.Printf("exemplars in Prometheus: %d\n", len(exemplars))
	windows, unselected := sampleSum(agentMetrics, podWindowMetric+"_count"), sampleSum(agentMetrics, unselectedMetric)
	fmt.Printf("new-pod windows: %.0f observed (p99 %s) of %d pods started mid-run, %.0f counted unselected\n",
		windows, seconds(podP99), churn.NewPods, unselected)
	if windows != float64(churn.NewPods) || unselected != 0 {
		v.fail("%d pods started mid-run: want as many new-pod windows observed (got %.0f) and none counted unselected (got %.0f)", churn.NewPods, windows, unselected)
	}

	if reported == 0 {
		v.fail("npagent reported no trigger")
	}
	if accounted > float64(churn.TriggersWritten) {
		v.fail("npagent accounted for %.0f triggers but only %d were written: a trigger was counted twice", accounted, churn.TriggersWritten)
	}
	if v.restarted && deliveries["relist"] == 0 {
		v.fail("no relist delivery counted, although the apiserver restarted")
	}
	if !v.restarted && accounted != float64(churn.TriggersWritten) {
		v.fail("%d triggers written but %.0f accounted for, with no apiserver restart to explain a gap", churn.TriggersWritten, accounted)
	}
	if suppressed["redelivered"] == 0 {
		v.fail("no re-delivery was suppressed, although the apiserver restarted (relist) and informers resync")
	}
	if len(exemplars) == 0 {
		v.fail("Prometheus has no exemplar for %s", latencyMetric)
		return nil
	}
	// The slowest exemplar is the most interesting trace to show.
	ex := slices.MaxFunc(exemplars, func(a, b exemplar) int { return cmp.Compare(a.value, b.value) })
	fmt.Printf("\ntrace of the slowest exemplar (%s, trace_id %s):\n", seconds(ex.value), ex.traceID)
	if err := v.printTrace(ex.traceID); err != nil {
		v.fail("trace %s from Jaeger: %v", ex.traceID, err)
	}
	return nil
}

// poll calls cond every 500ms until it returns true or v.timeout passes.
func (v *verifier) poll(what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(v.timeout)
	var last error
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		last = err
		if time.Now().After(deadline) {
			if last != nil {
				return fmt.Errorf("timed out after %v waiting for %s (last error: %v)", v.timeout, what, last)
			}
			return fmt.Errorf("timed out after %v waiting for %s", v.timeout, what)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func (v *verifier) get(u string) (string, error) {
	resp, err := v.http.Get(u)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("GET %s: %w", u, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s: %.200s", u, resp.Status, body)
	}
	return string(body), nil
}

type promVector []struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

func (v *verifier) queryVector(q string) (promVector, error) {
	body, err := v.get(v.prom + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		return nil, err
	}
	var r struct {
		Status string `json:"status"`
		Data   struct {
			Result promVector `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		return nil, fmt.Errorf("query %s: %w", q, err)
	}
	return r.Data.Result, nil
}

// query returns the single value of an instant query (0 with an error when empty).
func (v *verifier) query(q string) (float64, error) {
	vec, err := v.queryVector(q)
	if err != nil {
		return 0, err
	}
	if len(vec) == 0 {
		return 0, fmt.Errorf("query %s: empty result", q)
	}
	s, _ := vec[0].Value[1].(string)
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("query %s: value %q: %w", q, s, err)
	}
	return f, nil
}

type exemplar struct {
	traceID string
	value   float64
}

func (v *verifier) exemplars() ([]exemplar, error) {
	return v.queryExemplars(latencyMetric, time.Hour)
}

// queryExemplars returns the exemplars with a trace_id of the series query
// selects, over the last window.
func (v *verifier) queryExemplars(query string, window time.Duration) ([]exemplar, error) {
	now := time.Now()
	q := url.Values{
		"query": {query},
		"start": {strconv.FormatInt(now.Add(-window).Unix(), 10)},
		"end":   {strconv.FormatInt(now.Unix(), 10)},
	}
	body, err := v.get(v.prom + "/api/v1/query_exemplars?" + q.Encode())
	if err != nil {
		return nil, err
	}
	var r struct {
		Data []struct {
			Exemplars []struct {
				Labels map[string]string `json:"labels"`
				Value  string            `json:"value"`
			} `json:"exemplars"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		return nil, fmt.Errorf("query_exemplars: %w", err)
	}
	var out []exemplar
	for _, series := range r.Data {
		for _, e := range series.Exemplars {
			f, _ := strconv.ParseFloat(e.Value, 64)
			if id := e.Labels["trace_id"]; id != "" {
				out = append(out, exemplar{traceID: id, value: f})
			}
		}
	}
	return out, nil
}

type jaegerSpan struct {
	TraceID       string    `json:"traceID"`
	SpanID        string    `json:"spanID"`
	OperationName string    `json:"operationName"`
	References    []spanRef `json:"references"`
	StartTime     int64     `json:"startTime"` // µs
	Duration      int64     `json:"duration"`  // µs
	ProcessID     string    `json:"processID"`
	Tags          []struct {
		Key   string `json:"key"`
		Value any    `json:"value"`
	} `json:"tags"`
}

// spanRef is a Jaeger reference: the parent is CHILD_OF; an OpenTelemetry span
// link arrives as FOLLOWS_FROM, with the linked span's trace id.
type spanRef struct {
	RefType string `json:"refType"`
	TraceID string `json:"traceID"`
	SpanID  string `json:"spanID"`
}

type jaegerTrace struct {
	Spans     []jaegerSpan `json:"spans"`
	Processes map[string]struct {
		ServiceName string `json:"serviceName"`
	} `json:"processes"`
}

// fetchTrace fetches a trace from Jaeger, waiting until ready says it has arrived
// (its spans may come in several batches).
func (v *verifier) fetchTrace(traceID string, ready func(jaegerTrace) bool) (jaegerTrace, error) {
	var trace jaegerTrace
	err := v.poll("Jaeger to hold trace "+traceID, func() (bool, error) {
		body, err := v.get(v.jaeger + "/api/traces/" + traceID)
		if err != nil {
			return false, err
		}
		var r struct {
			Data []json.RawMessage `json:"data"`
		}
		if err := json.Unmarshal([]byte(body), &r); err != nil || len(r.Data) == 0 {
			return false, err
		}
		trace = jaegerTrace{}
		return json.Unmarshal(r.Data[0], &trace) == nil && ready(trace), nil
	})
	return trace, err
}

// printTrace fetches the exemplar's trace from Jaeger (waiting for it to arrive),
// prints its span tree, and follows it to the writer's trace: through
// policy.program's span link (link mode: the writer's trace is fetched and
// printed too) or its parent (child mode).
func (v *verifier) printTrace(traceID string) error {
	trace, err := v.fetchTrace(traceID, func(t jaegerTrace) bool { return hasSpan(t.Spans, "commit") })
	if err != nil {
		return err
	}
	printTree(os.Stdout, trace)
	if v.slowestFile != "" {
		ref, err := explainRef(trace)
		if err == nil {
			err = os.WriteFile(v.slowestFile, []byte(ref+"\n"), 0o644)
		}
		if err != nil {
			v.fail("trace %s: the object to explain: %v", traceID, err)
		}
	}
	for _, want := range []string{"policy.program", "delivery", "queue", "commit"} {
		if !hasSpan(trace.Spans, want) {
			v.fail("trace %s has no %s span", traceID, want)
		}
	}
	ref, problem := writerRef(trace, v.link)
	if problem != "" {
		v.fail("trace %s: %s", traceID, problem)
		return nil
	}
	writer := trace
	if v.link {
		writer, err = v.fetchTrace(ref.TraceID, func(t jaegerTrace) bool { return spanByID(t.Spans, ref.SpanID) != nil })
		if err != nil {
			v.fail("the writer's trace %s, linked from policy.program: %v", ref.TraceID, err)
			return nil
		}
		fmt.Printf("\npolicy.program links to the writer's span %s in trace %s:\n", ref.SpanID, ref.TraceID)
		printTree(os.Stdout, writer)
	}
	if problem := writerSpanProblem(writer, ref); problem != "" {
		v.fail("trace %s: %s", traceID, problem)
	}
	return nil
}

// explainRef names the object of npagent's trace as npagent explain takes it, from
// its root span's attributes: pe/<namespace>/<name> or cpe/<name>.
func explainRef(trace jaegerTrace) (string, error) {
	for _, sp := range trace.Spans {
		if sp.OperationName != "policy.program" {
			continue
		}
		tags := map[string]string{}
		for _, t := range sp.Tags {
			tags[t.Key] = fmt.Sprint(t.Value)
		}
		name := tags["npagent.policy.name"]
		switch kind := tags["npagent.policy.kind"]; {
		case name == "":
			return "", errors.New("policy.program has no npagent.policy.name")
		case kind == "PolicyEndpoint" && tags["k8s.namespace.name"] != "":
			return "pe/" + tags["k8s.namespace.name"] + "/" + name, nil
		case kind == "ClusterPolicyEndpoint":
			return "cpe/" + name, nil
		default:
			return "", fmt.Errorf("policy.program has kind %q, namespace %q", kind, tags["k8s.namespace.name"])
		}
	}
	return "", errors.New("no policy.program span")
}

// writerRef finds, in npagent's trace, the reference from policy.program to the
// writer's span: with link, a FOLLOWS_FROM reference into another trace (and no
// parent); without, its CHILD_OF parent. problem says what is wrong instead.
func writerRef(trace jaegerTrace, link bool) (ref spanRef, problem string) {
	var root *jaegerSpan
	for i := range trace.Spans {
		if trace.Spans[i].OperationName == "policy.program" {
			root = &trace.Spans[i]
		}
	}
	if root == nil {
		return spanRef{}, "no policy.program span"
	}
	var parent, linked []spanRef
	for _, r := range root.References {
		switch {
		case r.RefType == "CHILD_OF":
			parent = append(parent, r)
		case r.RefType == "FOLLOWS_FROM" && !sameID(r.TraceID, root.TraceID):
			linked = append(linked, r)
		}
	}
	if link {
		if len(parent) > 0 {
			return spanRef{}, fmt.Sprintf("policy.program has parent %s; with --trace-parenting=link it should be a root", parent[0].SpanID)
		}
		if len(linked) != 1 {
			return spanRef{}, fmt.Sprintf("policy.program has %d span links to another trace, want 1 to the writer's context", len(linked))
		}
		return linked[0], ""
	}
	if len(parent) != 1 {
		return spanRef{}, fmt.Sprintf("policy.program has %d parents, want the writer's span", len(parent))
	}
	return parent[0], ""
}

// writerSpanProblem checks that the span ref names is in trace and is the churn
// driver's policy.change.
func writerSpanProblem(trace jaegerTrace, ref spanRef) string {
	s := spanByID(trace.Spans, ref.SpanID)
	if s == nil {
		return fmt.Sprintf("the writer's span %s is not in trace %s", ref.SpanID, ref.TraceID)
	}
	if service := trace.Processes[s.ProcessID].ServiceName; s.OperationName != "policy.change" || service != "churn" {
		return fmt.Sprintf("the writer's span %s is %s/%s, want churn/policy.change", ref.SpanID, service, s.OperationName)
	}
	return ""
}

func spanByID(spans []jaegerSpan, id string) *jaegerSpan {
	for i := range spans {
		if sameID(spans[i].SpanID, id) {
			return &spans[i]
		}
	}
	return nil
}

// sameID compares hex ids as Jaeger prints them (a trace id whose high half is
// zero may be printed with 16 digits).
func sameID(a, b string) bool {
	return strings.TrimLeft(strings.ToLower(a), "0") == strings.TrimLeft(strings.ToLower(b), "0")
}

// printTree prints a trace's span tree, each span with its offset from the
// trace start and its duration.
func printTree(out io.Writer, trace jaegerTrace) {
	byID := map[string]bool{}
	children := map[string][]jaegerSpan{}
	for _, s := range trace.Spans {
		byID[s.SpanID] = true
	}
	var roots []jaegerSpan
	var start int64 = 1<<63 - 1
	for _, s := range trace.Spans {
		start = min(start, s.StartTime)
		parent := ""
		for _, r := range s.References {
			if r.RefType == "CHILD_OF" {
				parent = r.SpanID
			}
		}
		if parent == "" || !byID[parent] {
			roots = append(roots, s)
		} else {
			children[parent] = append(children[parent], s)
		}
	}
	byStart := func(a, b jaegerSpan) int { return cmp.Compare(a.StartTime, b.StartTime) }
	w := bufio.NewWriter(out)
	var walk func(s jaegerSpan, prefix string, last bool, depth int)
	walk = func(s jaegerSpan, prefix string, last bool, depth int) {
		branch, next := "├─ ", "│  "
		if last {
			branch, next = "└─ ", "   "
		}
		if depth == 0 {
			branch, next = "", ""
		}
		fmt.Fprintf(w, "  %s%s%s/%s  +%s  %s%s\n", prefix, branch, trace.Processes[s.ProcessID].ServiceName, s.OperationName,
			time.Duration(s.StartTime-start)*time.Microsecond, time.Duration(s.Duration)*time.Microsecond, spanNote(s))
		kids := children[s.SpanID]
		slices.SortFunc(kids, byStart)
		for i, k := range kids {
			walk(k, prefix+next, i == len(kids)-1, depth+1)
		}
	}
	slices.SortFunc(roots, byStart)
	for _, r := range roots {
		walk(r, "", true, 0)
	}
	w.Flush()
}

// spanNote shows the few attributes that make a span recognisable.
func spanNote(s jaegerSpan) string {
	var parts []string
	for _, t := range s.Tags {
		switch t.Key {
		case "k8s.node.name", "npagent.policy.name", "npagent.commit.attempts", "npagent.commit.pods", "churn.operation", "error":
			parts = append(parts, fmt.Sprintf("%s=%v", t.Key, t.Value))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return "  [" + strings.Join(parts, " ") + "]"
}

func hasSpan(spans []jaegerSpan, name string) bool {
	return slices.ContainsFunc(spans, func(s jaegerSpan) bool { return s.OperationName == name })
}

// sampleSum sums the samples of name whose label set contains every label, in a
// Prometheus or OpenMetrics text exposition. The value is the field after the
// label set, so a timestamp or an exemplar ("# {trace_id=...} 0.5") after it is
// not mistaken for it.
func sampleSum(exposition, name string, labels ...string) float64 {
	var sum float64
	for line := range strings.SplitSeq(exposition, "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok {
			continue
		}
		var set string
		switch {
		case strings.HasPrefix(rest, "{"):
			end := strings.Index(rest, "} ")
			if end < 0 {
				continue
			}
			set, rest = rest[:end+1], rest[end+2:]
		case strings.HasPrefix(rest, " "):
		default:
			continue // another metric whose name starts with this one
		}
		matches := true
		for _, l := range labels {
			matches = matches && strings.Contains(set, l)
		}
		f := strings.Fields(rest)
		if len(f) == 0 || !matches {
			continue
		}
		if x, err := strconv.ParseFloat(f[0], 64); err == nil {
			sum += x
		}
	}
	return sum
}

func formatVector(vec promVector) string {
	var parts []string
	for _, s := range vec {
		parts = append(parts, fmt.Sprintf("%s=%v", s.Metric["reason"], s.Value[1]))
	}
	slices.Sort(parts)
	if len(parts) == 0 {
		return "(none)"
	}
	return strings.Join(parts, " ")
}

func seconds(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(10 * time.Microsecond).String()
}
