package telemetry

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/npagent/npagent/internal/report"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// metricsReference is the generated docs/reference/metrics.md (make docs).
const metricsReference = "docs/reference/metrics.md"

// openValues are attributes whose values come from the objects, not from a set the
// code fixes: the reference describes them instead of listing what this test saw.
var openValues = map[string]string{
	"field": "the rejected object's field, without indexes (e.g. `spec.egress.domainName`, `spec.namespaceShare`)",
}

// fillOnes sets every number in v to 1, every bool to true and every duration to
// 1s, through arrays and structs, and gives every map one zero key: a Counts in
// which every series the callbacks can observe is present, including fields
// added after this test was written.
func fillOnes(v reflect.Value) {
	switch v.Kind() {
	case reflect.Struct:
		if v.Type() == reflect.TypeOf(time.Time{}) {
			v.Set(reflect.ValueOf(time.Now().Add(-time.Second)))
			return
		}
		for i := range v.NumField() {
			if v.Field(i).CanSet() {
				fillOnes(v.Field(i))
			}
		}
	case reflect.Array:
		for i := range v.Len() {
			fillOnes(v.Index(i))
		}
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fillOnes(e)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if v.Type() == reflect.TypeOf(time.Duration(0)) {
			v.SetInt(int64(time.Second))
			return
		}
		v.SetInt(1)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(1)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(1)
	}
}

// instrumentType names the instrument kind a metric's data comes from.
func instrumentType(d metricdata.Aggregation) string {
	switch d := d.(type) {
	case metricdata.Sum[int64]:
		if d.IsMonotonic {
			return "counter"
		}
		return "up-down counter"
	case metricdata.Sum[float64]:
		if d.IsMonotonic {
			return "counter"
		}
		return "up-down counter"
	case metricdata.Gauge[int64], metricdata.Gauge[float64]:
		return "gauge"
	case metricdata.ExponentialHistogram[float64], metricdata.ExponentialHistogram[int64]:
		return "exponential histogram"
	case metricdata.Histogram[float64], metricdata.Histogram[int64]:
		return "histogram"
	}
	return fmt.Sprintf("%T", d)
}

// attributeSets are the attribute sets of a metric's data points.
func attributeSets(d metricdata.Aggregation) []attribute.Set {
	var sets []attribute.Set
	add := func(s attribute.Set) { sets = append(sets, s) }
	switch d := d.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			add(p.Attributes)
		}
	case metricdata.Sum[float64]:
		for _, p := range d.DataPoints {
			add(p.Attributes)
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			add(p.Attributes)
		}
	case metricdata.Gauge[float64]:
		for _, p := range d.DataPoints {
			add(p.Attributes)
		}
	case metricdata.ExponentialHistogram[float64]:
		for _, p := range d.DataPoints {
			add(p.Attributes)
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			add(p.Attributes)
		}
	}
	return sets
}

// prometheusNames maps each npagent family's HELP text on /metrics to its name, so
// the reference gives the name a scrape (and the dashboard) uses.
func prometheusNames(t *testing.T, tel *inMemory) map[string]string {
	names := map[string]string{}
	for _, line := range strings.Split(scrape(t, tel), "\n") {
		rest, ok := strings.CutPrefix(line, "# HELP ")
		if !ok {
			continue
		}
		name, help, _ := strings.Cut(rest, " ")
		if strings.HasPrefix(name, "npagent_") {
			names[strings.NewReplacer(`\\`, `\`, `\n`, "\n").Replace(help)] = name
		}
	}
	return names
}

// renderMetricsReference collects every instrument with every series the code can
// produce and writes the reference table.
func renderMetricsReference(t *testing.T) string {
	tel := newInMemory(t)
	var c report.Counts
	fillOnes(reflect.ValueOf(&c).Elem())
	tel.ObserveCounts(func(dst *report.Counts) { *dst = c })
	trigger := time.Now().Add(-time.Second)
	a := report.Attempt{Start: trigger.Add(time.Millisecond), End: trigger.Add(2 * time.Millisecond)}
	for k := range report.NumKinds {
		r := report.Record{Kind: report.Kind(k), Namespace: "ns", Name: "n", UID: "u", ResourceVersion: "1",
			Trigger: trigger, Received: trigger, WorkerStart: trigger, ComputeStart: trigger, ComputeEnd: trigger,
			Attempts: []report.Attempt{a}, Pods: 1, Entries: 1, TraceParent: "not a traceparent"}
		tel.Report(&r)
		skewed, none := r, r
		skewed.Trigger = a.End.Add(time.Second) // clock_skew
		none.Attempts = nil                     // no_commit
		tel.Report(&skewed)
		tel.Report(&none)
		tel.Committed(report.Kind(k), &a)
		failed := a
		failed.Err = "x"
		tel.Committed(report.Kind(k), &failed)
	}
	ready := time.Now().Add(-time.Second)
	tel.PodProgrammed(&report.PodRecord{Namespace: "ns", Name: "p", UID: "pu", Node: "node", NetworkReady: ready,
		Source: report.SourceReadyToStartContainers, Programmed: ready.Add(40 * time.Millisecond), Objects: []string{"PolicyEndpoint ns/n"}})
	tel.PodUnselected()
	if err := tel.ObserveVerdicts(func() VerdictCounts {
		return VerdictCounts{Counts: []Verdict{{Direction: "ingress", Denied: true, Reason: "policy_default_deny", Namespace: "ns",
			Pod: "p", PolicyKind: "PolicyEndpoint", PolicyName: "n", Rule: -1, Packets: 1, Bytes: 60}}, Lost: 1}
	}); err != nil {
		t.Fatal(err)
	}
	if err := tel.ObserveFlows(func(c *report.FlowCounts) { fillOnes(reflect.ValueOf(c).Elem()) }); err != nil {
		t.Fatal(err)
	}
	rm := tel.collect(t)
	prom := prometheusNames(t, tel)

	var b strings.Builder
	b.WriteString(`# Metrics

<!-- Generated by make docs from the instruments themselves (internal/telemetry/reference_test.go): do not edit. -->

Every metric npagent exports, over OTLP (the OpenTelemetry name) and on ` + "`/metrics`" + ` (the
Prometheus name, as a scrape and the dashboard see it). The latency and commit-duration
histograms are base-2 exponential histograms: native histograms in Prometheus, carried
only by the protobuf exposition (a text-format scrape sees their ` + "`_count`" + ` and ` + "`_sum`" + `
alone). Every metric also carries the resource (` + "`service.name`" + `, ` + "`service.instance.id`" + ` =
the node name unless ` + "`OTEL_RESOURCE_ATTRIBUTES`" + ` sets it, ` + "`k8s.node.name`" + `); over
` + "`/metrics`" + ` the scrape adds ` + "`job`" + ` and ` + "`instance`" + `. What the latency measures and what the
suppression reasons mean: [what is measured](../explanation/measurement.md).

`)
	type row struct{ name, text string }
	var rows []row
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			values := map[string]map[string]bool{}
			for _, set := range attributeSets(m.Data) {
				for _, kv := range set.ToSlice() {
					k := string(kv.Key)
					if values[k] == nil {
						values[k] = map[string]bool{}
					}
					values[k][kv.Value.String()] = true
				}
			}
			keys := make([]string, 0, len(values))
			for k := range values {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			var attrs []string
			for _, k := range keys {
				if d, ok := openValues[k]; ok {
					attrs = append(attrs, fmt.Sprintf("`%s`: %s", k, d))
					continue
				}
				vs := make([]string, 0, len(values[k]))
				for v := range values[k] {
					vs = append(vs, "`"+v+"`")
				}
				slices.Sort(vs)
				attrs = append(attrs, fmt.Sprintf("`%s`: %s", k, strings.Join(vs, ", ")))
			}
			promName := prom[m.Description]
			if promName == "" {
				t.Errorf("%s: no family with its description on /metrics", m.Name)
			}
			unit := m.Unit
			if unit == "" {
				unit = "1"
			}
			var r strings.Builder
			fmt.Fprintf(&r, "## `%s`\n\n%s\n\n", m.Name, m.Description)
			fmt.Fprintf(&r, "- Prometheus: `%s`\n- type: %s; unit: `%s`\n", promName, instrumentType(m.Data), unit)
			if len(attrs) == 0 {
				r.WriteString("- attributes: none\n")
			} else {
				r.WriteString("- attributes:\n")
				for _, a := range attrs {
					fmt.Fprintf(&r, "  - %s\n", a)
				}
			}
			rows = append(rows, row{m.Name, r.String()})
		}
	}
	// Every instrument name the package declares must have been collected: one
	// that records nothing here would be missing from the reference unnoticed.
	for _, name := range declaredInstrumentNames(t) {
		if !slices.ContainsFunc(rows, func(r row) bool { return r.name == name }) {
			t.Errorf("instrument %s recorded nothing in renderMetricsReference: make it record one, so the reference lists it", name)
		}
	}
	slices.SortFunc(rows, func(x, y row) int { return strings.Compare(x.name, y.name) })
	for _, r := range rows {
		b.WriteString(r.text + "\n")
	}
	return strings.TrimRight(b.String(), "\n") + "\n"
}

// TestMetricsReference: docs/reference/metrics.md lists every instrument with its
// type, unit, attributes and their values, as the code declares them; a new or
// changed metric makes it stale until make docs is run.
func TestMetricsReference(t *testing.T) {
	want := renderMetricsReference(t)
	_, file, _, _ := runtime.Caller(0)
	path := filepath.Join(filepath.Dir(file), "..", "..", filepath.FromSlash(metricsReference))
	got, err := os.ReadFile(path)
	if string(got) == want {
		return
	}
	if os.Getenv("NPAGENT_UPDATE_DOCS") == "1" {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if err != nil {
		t.Fatalf("%s: %v: run make docs", metricsReference, err)
	}
	t.Errorf("%s is stale: run make docs (it is generated from the instruments)", metricsReference)
}

// declaredInstrumentNames are the package's string constants named *Name whose
// value starts with "npagent." (its instrument names), read from the source.
func declaredInstrumentNames(t *testing.T) []string {
	_, file, _, _ := runtime.Caller(0)
	fset := token.NewFileSet()
	matches, _ := filepath.Glob(filepath.Join(filepath.Dir(file), "*.go"))
	var names []string
	for _, path := range matches {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, spec := range g.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if !strings.HasSuffix(n.Name, "Name") || i >= len(vs.Values) {
						continue
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						continue
					}
					v, _ := strconv.Unquote(lit.Value)
					if strings.HasPrefix(v, "npagent.") {
						names = append(names, v)
					}
				}
			}
		}
	}
	return names
}
