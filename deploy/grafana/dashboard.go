// Package grafana reads npagent's Grafana dashboard (npagent.json, Grafana's
// dashboard JSON model) so that tests can check it: every panel's PromQL
// query, with the dashboard's template variables substituted the way Grafana
// substitutes them. The unit test in this directory checks each query with
// promtool's PromQL parser and against the metric names npagent and its
// recording rules define; the demo's verify step runs each one against a
// Prometheus after a churn run.
package grafana

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
)

// File is the dashboard's name in this directory.
const File = "npagent.json"

// Dashboard is the part of Grafana's dashboard JSON model the checks read.
type Dashboard struct {
	Title      string  `json:"title"`
	UID        string  `json:"uid"`
	Panels     []Panel `json:"panels"`
	Templating struct {
		List []Variable `json:"list"`
	} `json:"templating"`
}

// Panel is a panel or a row (a row may nest its panels when collapsed).
type Panel struct {
	ID         int        `json:"id"`
	Type       string     `json:"type"`
	Title      string     `json:"title"`
	Datasource Datasource `json:"datasource"`
	Targets    []Target   `json:"targets"`
	Panels     []Panel    `json:"panels"`
}

// Datasource names a datasource by type and uid; the uid is "${datasource}"
// when the dashboard's datasource variable chooses it.
type Datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// Target is one query of a panel.
type Target struct {
	RefID        string     `json:"refId"`
	Expr         string     `json:"expr"`
	LegendFormat string     `json:"legendFormat"`
	Exemplar     bool       `json:"exemplar"`
	Format       string     `json:"format"`
	Instant      bool       `json:"instant"`
	Datasource   Datasource `json:"datasource"`
}

// Variable is a template variable. For a query variable, Query holds its
// query (Grafana writes either a string or an object with a "query" field).
type Variable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	RawQuery   json.RawMessage `json:"query"`
	IncludeAll bool            `json:"includeAll"`
	AllValue   string          `json:"allValue"`
	Multi      bool            `json:"multi"`
	Datasource *Datasource     `json:"datasource"`
}

// Query returns the variable's query text.
func (v Variable) Query() string {
	var s string
	if json.Unmarshal(v.RawQuery, &s) == nil {
		return s
	}
	var o struct {
		Query string `json:"query"`
	}
	_ = json.Unmarshal(v.RawQuery, &o)
	return o.Query
}

// Load reads a dashboard file.
func Load(path string) (*Dashboard, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	var d Dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("dashboard %s: %w", path, err)
	}
	return &d, nil
}

// Query is one target of one panel.
type Query struct {
	Panel  Panel
	Target Target
}

// Name names the query in messages: the panel's title and the target's refId.
func (q Query) Name() string {
	return fmt.Sprintf("panel %d %q, query %s", q.Panel.ID, q.Panel.Title, q.Target.RefID)
}

// Queries returns every target of every panel, rows' nested panels included,
// in the dashboard's order.
func (d *Dashboard) Queries() []Query {
	var out []Query
	var walk func([]Panel)
	walk = func(ps []Panel) {
		for _, p := range ps {
			for _, t := range p.Targets {
				out = append(out, Query{Panel: p, Target: t})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

// DataPanels returns every panel that is not a row, rows' nested panels included.
func (d *Dashboard) DataPanels() []Panel {
	var out []Panel
	var walk func([]Panel)
	walk = func(ps []Panel) {
		for _, p := range ps {
			if p.Type != "row" {
				out = append(out, p)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

// Variable returns the template variable called name.
func (d *Dashboard) Variable(name string) (Variable, bool) {
	for _, v := range d.Templating.List {
		if v.Name == name {
			return v, true
		}
	}
	return Variable{}, false
}

// LastFiveMinutes holds Grafana's built-in interval variables as Grafana sets
// them for a "Last 5 minutes" view of a Prometheus scraped (or written to)
// every 15s: $__rate_interval is max(4 × 15s, $__interval + 15s).
var LastFiveMinutes = map[string]string{
	"__range":         "5m",
	"__rate_interval": "1m",
	"__interval":      "15s",
}

var varRef = regexp.MustCompile(`\$(?:\{(\w+)\}|(\w+))`)

// Expand substitutes the variables of expr ($name or ${name}) from vars, as
// Grafana does before it sends a query; a variable vars does not hold is an
// error, so no query leaves with a "$" Prometheus would reject.
func Expand(expr string, vars ...map[string]string) (string, error) {
	var missing []string
	out := varRef.ReplaceAllStringFunc(expr, func(ref string) string {
		m := varRef.FindStringSubmatch(ref)
		name := m[1] + m[2]
		for _, vs := range vars {
			if v, ok := vs[name]; ok {
				return v
			}
		}
		missing = append(missing, ref)
		return ref
	})
	if len(missing) > 0 {
		return "", fmt.Errorf("no value for %s in %q", strings.Join(missing, ", "), expr)
	}
	return out, nil
}

// AllValues maps every query variable to the value Grafana sends when "All" is
// selected (its allValue; ".*" when it has none, as for a regex matcher).
func (d *Dashboard) AllValues() map[string]string {
	out := map[string]string{}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		out[v.Name] = ".*"
		if v.AllValue != "" {
			out[v.Name] = v.AllValue
		}
	}
	return out
}

var labelValues = regexp.MustCompile(`^\s*label_values\(\s*(.+)\s*,\s*(\w+)\s*\)\s*$`)

// LabelValuesQuery splits a variable query of the form label_values(selector,
// label) into its selector and label.
func LabelValuesQuery(q string) (selector, label string, ok bool) {
	m := labelValues.FindStringSubmatch(q)
	if m == nil {
		return "", "", false
	}
	return m[1], m[2], true
}
