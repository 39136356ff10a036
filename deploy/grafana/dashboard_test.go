package grafana

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/npagent/npagent/internal/telemetry"
	"github.com/npagent/npagent/internal/testenv"
	"sigs.k8s.io/yaml"
)

const rulesFile = "../prometheus/npagent.rules.yaml"

func load(t *testing.T) *Dashboard {
	t.Helper()
	d, err := Load(File)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// expanded returns every query's expr with the variables as Grafana sends them
// for "All" over the last five minutes.
func expanded(t *testing.T, d *Dashboard) []string {
	t.Helper()
	var out []string
	for _, q := range d.Queries() {
		e, err := Expand(q.Target.Expr, d.AllValues(), LastFiveMinutes)
		if err != nil {
			t.Fatalf("%s: %v", q.Name(), err)
		}
		out = append(out, e)
	}
	return out
}

// TestModel checks the dashboard's structure: the datasource is a variable and
// every panel and query uses it, cluster and instance are variables with an
// "All" option, titles and refIds are unique, every variable reference in a
// query resolves, and the latency heatmap asks for exemplars.
func TestModel(t *testing.T) {
	d := load(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("dashboard has no uid or title")
	}
	ds, ok := d.Variable("datasource")
	if !ok || ds.Type != "datasource" || ds.Query() != "prometheus" {
		t.Errorf("want a datasource variable of type prometheus, got %+v (found %v)", ds, ok)
	}
	for _, name := range []string{"cluster", "instance"} {
		v, ok := d.Variable(name)
		if !ok || v.Type != "query" || !v.IncludeAll || v.AllValue != ".*" {
			t.Errorf("want a query variable %s with an All option matching .*, got %+v (found %v)", name, v, ok)
			continue
		}
		if v.Datasource == nil || v.Datasource.UID != "${datasource}" {
			t.Errorf("variable %s does not query the datasource variable: %+v", name, v.Datasource)
		}
		if _, label, ok := LabelValuesQuery(v.Query()); !ok || label != name {
			t.Errorf("variable %s: query %q is not label_values(..., %s)", name, v.Query(), name)
		}
	}
	titles := map[string]bool{}
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
	}
	panels := d.DataPanels()
	if len(panels) == 0 {
		t.Fatal("no panels")
	}
	for _, p := range panels {
		if p.Title == "" || titles[p.Title] {
			t.Errorf("panel %d: title %q empty or used twice", p.ID, p.Title)
		}
		titles[p.Title] = true
		if p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource %+v, want the datasource variable", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if tg.RefID == "" || refs[tg.RefID] {
				t.Errorf("panel %q: refId %q empty or used twice", p.Title, tg.RefID)
			}
			refs[tg.RefID] = true
			if tg.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q query %s: datasource %+v, want the datasource variable", p.Title, tg.RefID, tg.Datasource)
			}
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q query %s: empty expr", p.Title, tg.RefID)
			}
		}
	}
	expanded(t, d) // fails on a variable the dashboard does not define
	heatmapWithExemplars := slices.ContainsFunc(d.Queries(), func(q Query) bool {
		return q.Panel.Type == "heatmap" && q.Target.Exemplar && strings.Contains(q.Target.Expr, latencyMetric)
	})
	if !heatmapWithExemplars {
		t.Errorf("no heatmap panel of %s with exemplars enabled", latencyMetric)
	}
}

var latencyMetric = promName(telemetry.LatencyName, "_seconds")

func promName(name, suffix string) string { return strings.ReplaceAll(name, ".", "_") + suffix }

// instruments are npagent's instruments as Prometheus names them (dots to
// underscores, the unit "s" as _seconds, _total on counters; histograms are
// native, so no _bucket, _sum or _count).
var instruments = []string{
	latencyMetric,
	promName(telemetry.SuppressedName, "_total"),
	promName(telemetry.RejectedName, "_total"),
	promName(telemetry.DeliveriesName, "_total"),
	promName(telemetry.InvalidObjectsName, "_total"),
	promName(telemetry.TraceparentInvalidName, "_total"),
	promName(telemetry.CommitDurationName, "_seconds"),
	promName(telemetry.CommitFailuresName, "_total"),
	promName(telemetry.SeenObjectsName, ""),
	promName(telemetry.SeenPendingName, ""),
	promName(telemetry.SeenOldestPendingAgeName, "_seconds"),
	promName(telemetry.WatchStalledName, ""),
	promName(telemetry.WatchEstablishedName, ""),
	promName(telemetry.WatchLastEventAgeName, "_seconds"),
	promName(telemetry.WatchErrorsName, "_total"),
	promName(telemetry.WatchRelistsName, "_total"),
	promName(telemetry.PodsIsolatedName, "_total"),
	promName(telemetry.MapEntriesName, ""),
	promName(telemetry.MapCapacityName, ""),
	promName(telemetry.SpansDroppedName, "_total"),
	promName(telemetry.MetricExportsFailedName, "_total"),
	promName(telemetry.VerdictsName, "_total"),
	promName(telemetry.PodLatencyName, "_seconds"),
	promName(telemetry.AuditModeName, ""),
}

// recordingRules returns the names the rules file records.
func recordingRules(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []struct {
				Record string `json:"record"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	var out []string
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				out = append(out, r.Record)
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s records nothing", rulesFile)
	}
	return out
}

// TestPromtoolCheck feeds every query, variables expanded, to `promtool check
// rules` as a recording rule: PromQL syntax and types, checked by the parser
// of the Prometheus version the demo runs.
func TestPromtoolCheck(t *testing.T) {
	promtool := testenv.ToolPath(t, "promtool")
	d := load(t)
	exprs := expanded(t, d)
	var b strings.Builder
	b.WriteString("groups:\n  - name: npagent-dashboard\n    rules:\n")
	for i, q := range d.Queries() {
		fmt.Fprintf(&b, "      # %s\n      - record: npagent_dashboard:panel%d_%s\n        expr: %q\n",
			q.Name(), q.Panel.ID, q.Target.RefID, exprs[i])
	}
	path := filepath.Join(t.TempDir(), "dashboard.rules.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(promtool, "check", "rules", path).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules (record npagent_dashboard:panel<id>_<refId>): %v\n%s", err, out)
	}
	t.Logf("%d queries of %d panels: promtool check rules:\n%s", len(exprs), len(d.DataPanels()), out)
}

// marker is a label matcher promtool adds to every vector selector of a query,
// so the selectors can be read from its output.
const marker = `npagent_dashboard_selector="1"`

var selectorRE = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)?\{([^{}]*` + regexp.QuoteMeta(marker) + `[^{}]*)\}`)

// selectors returns each vector selector of expr as (metric name, matchers),
// found by Prometheus's own parser: promtool's label-matchers command rewrites
// every selector of the parsed query.
func selectors(t *testing.T, promtool, expr string) [][2]string {
	t.Helper()
	out, err := exec.Command(promtool, "--experimental", "promql", "label-matchers", "set", expr, "npagent_dashboard_selector", "1").CombinedOutput()
	if err != nil {
		t.Fatalf("promtool promql label-matchers set %q: %v\n%s", expr, err, out)
	}
	var sels [][2]string
	for _, m := range selectorRE.FindAllStringSubmatch(string(out), -1) {
		sels = append(sels, [2]string{m[1], m[2]})
	}
	return sels
}

// TestMetricNames checks that every metric a query or a variable reads is an
// instrument of internal/telemetry or a recording rule of
// deploy/prometheus/npagent.rules.yaml, and that every selector filters by the
// cluster and instance variables as far as its series carry those labels:
// instruments and per-node rules both, cluster rules cluster, the SLO
// parameters (npagent:*) neither.
func TestMetricNames(t *testing.T) {
	promtool := testenv.ToolPath(t, "promtool")
	d := load(t)
	rules := recordingRules(t)
	known := append(slices.Clone(instruments), rules...)
	wantFilters := func(name string) []string {
		switch {
		case slices.Contains(instruments, name), strings.HasPrefix(name, "cluster_instance"):
			return []string{`cluster=~"$cluster"`, `instance=~"$instance"`}
		case strings.HasPrefix(name, "cluster"):
			return []string{`cluster=~"$cluster"`}
		}
		return nil
	}
	// Expand the variables to themselves: the matchers stay readable.
	self := map[string]string{"cluster": "$cluster", "instance": "$instance"}
	used := map[string]bool{}
	for _, q := range d.Queries() {
		expr, err := Expand(q.Target.Expr, self, LastFiveMinutes)
		if err != nil {
			t.Fatalf("%s: %v", q.Name(), err)
		}
		sels := selectors(t, promtool, expr)
		if len(sels) == 0 {
			t.Errorf("%s: no vector selector in %q", q.Name(), expr)
		}
		for _, s := range sels {
			name, matchers := s[0], s[1]
			if name == "" {
				t.Errorf("%s: a selector without a metric name: {%s}", q.Name(), matchers)
				continue
			}
			used[name] = true
			if !slices.Contains(known, name) {
				t.Errorf("%s reads %s, neither an instrument of internal/telemetry nor a recording rule of %s", q.Name(), name, rulesFile)
				continue
			}
			for _, f := range wantFilters(name) {
				if !strings.Contains(matchers, f) {
					t.Errorf("%s: selector %s{%s} does not filter by %s", q.Name(), name, matchers, f)
				}
			}
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		sel, _, ok := LabelValuesQuery(v.Query())
		if !ok {
			t.Errorf("variable %s: query %q is not label_values(selector, label)", v.Name, v.Query())
			continue
		}
		name, _, _ := strings.Cut(sel, "{")
		if !slices.Contains(instruments, strings.TrimSpace(name)) {
			t.Errorf("variable %s reads %s, not an instrument of internal/telemetry", v.Name, name)
		}
	}
	t.Logf("metrics the panels read: %v", slices.Sorted(func(yield func(string) bool) {
		for n := range used {
			if !yield(n) {
				return
			}
		}
	}))
}

// labels are the label names a query may group by or show in a legend: the
// instruments' attributes as Prometheus names them, the target labels
// (instance: one agent per node; cluster, where the Prometheus sets it) and the
// recording rules' quantile label.
var labels = []string{
	promName(string(telemetry.KindKey), ""),
	promName(string(telemetry.ReasonKey), ""),
	promName(string(telemetry.CauseKey), ""),
	promName(string(telemetry.FieldKey), ""),
	promName(string(telemetry.OutcomeKey), ""),
	promName(string(telemetry.RequestKey), ""),
	promName(string(telemetry.MapKey), ""),
	promName(string(telemetry.NamespaceKey), ""),
	promName(string(telemetry.PodKey), ""),
	promName(string(telemetry.PolicyNameKey), ""),
	promName(string(telemetry.RuleKey), ""),
	promName(string(telemetry.VerdictKey), ""),
	promName(string(telemetry.DirectionKey), ""),
	promName(string(telemetry.VerdictReasonKy), ""),
	"instance", "cluster", "quantile",
}

var (
	grouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	legend   = regexp.MustCompile(`\{\{\s*(\w+)\s*\}\}`)
)

// TestLabelNames checks that every label a query groups or matches by, and
// every label its legend shows, is one npagent's series carry: a misspelled
// `by (reasn)` still answers (one series without the label), so only this
// catches it.
func TestLabelNames(t *testing.T) {
	d := load(t)
	for _, q := range d.Queries() {
		var names []string
		for _, m := range grouping.FindAllStringSubmatch(q.Target.Expr, -1) {
			for n := range strings.SplitSeq(m[1], ",") {
				if n = strings.TrimSpace(n); n != "" {
					names = append(names, n)
				}
			}
		}
		for _, m := range legend.FindAllStringSubmatch(q.Target.LegendFormat, -1) {
			names = append(names, m[1])
		}
		for _, n := range names {
			if !slices.Contains(labels, n) {
				t.Errorf("%s uses label %q, which no npagent series carries (known: %v)", q.Name(), n, labels)
			}
		}
	}
}

func TestExpand(t *testing.T) {
	got, err := Expand(`rate(m{a=~"$a", b="${b}"}[$__rate_interval]) $__range`, map[string]string{"a": ".*", "b": "x"}, LastFiveMinutes)
	if want := `rate(m{a=~".*", b="x"}[1m]) 5m`; err != nil || got != want {
		t.Errorf("Expand = %q, %v; want %q", got, err, want)
	}
	if _, err := Expand(`m{a="$nope"}`, LastFiveMinutes); err == nil || !strings.Contains(err.Error(), "$nope") {
		t.Errorf("Expand with an unknown variable: err = %v, want one naming $nope", err)
	}
}

func TestLabelValuesQuery(t *testing.T) {
	sel, label, ok := LabelValuesQuery(`label_values(m{a=~"$a", b="c"}, instance)`)
	if !ok || sel != `m{a=~"$a", b="c"}` || label != "instance" {
		t.Errorf("LabelValuesQuery = %q, %q, %v", sel, label, ok)
	}
	if _, _, ok := LabelValuesQuery(`query_result(m)`); ok {
		t.Errorf("LabelValuesQuery(query_result) ok")
	}
}
