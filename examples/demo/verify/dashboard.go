package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/npagent/npagent/deploy/grafana"
)

// dashboardResult is what the dashboard check found.
type dashboardResult struct {
	panels, queries int
	variableSets    []string // e.g. "instance=All", "instance=<uuid>"
	exemplars       int      // exemplars returned for the exemplar-enabled queries
	exemplarQueries int
	failures        []string // the last round's, each naming its panel
}

// checkDashboard runs every query of the Grafana dashboard at path against
// Prometheus the way Grafana would for a "Last 5 minutes" view: variables
// expanded (cluster and instance as "All", then instance as each node the
// instance variable lists), range targets through /api/v1/query_range,
// instant targets through /api/v1/query, and each exemplar-enabled target
// through /api/v1/query_exemplars. A query fails on an error, on no series,
// and on series without a single number (only NaN: e.g. a quantile of an empty
// window) or, for histograms, without an observation; an exemplar query fails
// without an exemplar carrying a trace_id. It polls until nothing fails or the
// timeout passes (recording rules lag one evaluation interval).
func (v *verifier) checkDashboard(path string) (dashboardResult, error) {
	d, err := grafana.Load(path)
	if err != nil {
		return dashboardResult{}, err
	}
	res := dashboardResult{panels: len(d.DataPanels()), queries: len(d.Queries())}
	all := d.AllValues()
	sets := []map[string]string{all}
	res.variableSets = []string{"all variables All"}
	// The instance variable's own query lists the nodes: each must answer too.
	inst, ok := d.Variable("instance")
	if !ok {
		return res, fmt.Errorf("dashboard %s has no instance variable", path)
	}
	nodes, err := v.labelValues(inst, all)
	if err != nil {
		return res, fmt.Errorf("variable instance: %w", err)
	}
	if len(nodes) == 0 {
		return res, fmt.Errorf("variable instance: %q lists no node", inst.Query())
	}
	for _, n := range nodes {
		set := map[string]string{}
		for k, val := range all {
			set[k] = val
		}
		set["instance"] = promRegexLiteral(n)
		sets = append(sets, set)
		res.variableSets = append(res.variableSets, "instance="+n)
	}
	err = v.poll("every dashboard query to answer", func() (bool, error) {
		res.failures, res.exemplars, res.exemplarQueries = nil, 0, 0
		for _, q := range d.Queries() {
			for i, set := range sets {
				expr, err := grafana.Expand(q.Target.Expr, set, grafana.LastFiveMinutes)
				if err != nil {
					res.failures = append(res.failures, fmt.Sprintf("%s: %v", q.Name(), err))
					continue
				}
				if problem := v.panelQuery(expr, q.Target.Instant); problem != "" {
					res.failures = append(res.failures, fmt.Sprintf("%s (%s): %s: %s", q.Name(), res.variableSets[i], problem, expr))
				}
				if q.Target.Exemplar && i == 0 {
					res.exemplarQueries++
					n, err := v.exemplarCount(expr)
					res.exemplars += n
					if err != nil || n == 0 {
						res.failures = append(res.failures, fmt.Sprintf("%s: exemplars enabled but /api/v1/query_exemplars returned none with a trace_id (err %v): %s", q.Name(), err, expr))
					}
				}
			}
		}
		return len(res.failures) == 0, nil
	})
	return res, err
}

// promRegexLiteral escapes a label value for a =~ matcher, as Grafana formats a
// regex variable's value.
func promRegexLiteral(s string) string {
	return strings.ReplaceAll(regexp.QuoteMeta(s), `\`, `\\`)
}

// labelValues answers a label_values(selector, label) variable query.
func (v *verifier) labelValues(variable grafana.Variable, vars map[string]string) ([]string, error) {
	sel, label, ok := grafana.LabelValuesQuery(variable.Query())
	if !ok {
		return nil, fmt.Errorf("query %q is not label_values(selector, label)", variable.Query())
	}
	sel, err := grafana.Expand(sel, vars)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	q := url.Values{"match[]": {sel},
		"start": {strconv.FormatInt(now.Add(-5*time.Minute).Unix(), 10)}, "end": {strconv.FormatInt(now.Unix(), 10)}}
	body, err := v.get(v.prom + "/api/v1/label/" + label + "/values?" + q.Encode())
	if err != nil {
		return nil, err
	}
	var r struct {
		Status string   `json:"status"`
		Data   []string `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		return nil, err
	}
	return r.Data, nil
}

// promSeries is a series of a vector or matrix result, float or histogram.
type promSeries struct {
	Metric     map[string]string `json:"metric"`
	Value      []any             `json:"value"`      // [t, "v"]
	Values     [][]any           `json:"values"`     // [[t, "v"], ...]
	Histogram  []json.RawMessage `json:"histogram"`  // [t, {count, sum, buckets}]
	Histograms [][]any           `json:"histograms"` // [[t, {count, ...}], ...]
}

// panelQuery runs expr as Grafana would (a range query over the last five
// minutes, or an instant query) and says what is wrong with the answer, ""
// when it has at least one number.
func (v *verifier) panelQuery(expr string, instant bool) string {
	now := time.Now()
	q := url.Values{"query": {expr}}
	endpoint := "/api/v1/query_range?"
	if instant {
		endpoint = "/api/v1/query?"
		q.Set("time", strconv.FormatInt(now.Unix(), 10))
	} else {
		q.Set("start", strconv.FormatInt(now.Add(-5*time.Minute).Unix(), 10))
		q.Set("end", strconv.FormatInt(now.Unix(), 10))
		q.Set("step", "15")
	}
	// Prometheus answers a bad query with 400 and a JSON body naming the error:
	// read it whatever the status.
	resp, err := v.http.Get(v.prom + endpoint + q.Encode())
	if err != nil {
		return "error: " + err.Error()
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return "error: " + err.Error()
	}
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string          `json:"resultType"`
			Result     json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return fmt.Sprintf("%s: undecodable answer: %v", resp.Status, err)
	}
	if r.Status != "success" {
		return fmt.Sprintf("error (%s): %s", resp.Status, r.Error)
	}
	if r.Data.ResultType == "scalar" {
		var s []any
		if json.Unmarshal(r.Data.Result, &s) == nil && len(s) == 2 && isNumber(s[1]) {
			return ""
		}
		return "a scalar that is not a number"
	}
	var series []promSeries
	if err := json.Unmarshal(r.Data.Result, &series); err != nil {
		return "undecodable result: " + err.Error()
	}
	if len(series) == 0 {
		return "empty result (no series)"
	}
	for _, s := range series {
		if len(s.Value) == 2 && isNumber(s.Value[1]) {
			return ""
		}
		if slices.ContainsFunc(s.Values, func(p []any) bool { return len(p) == 2 && isNumber(p[1]) }) {
			return ""
		}
		if len(s.Histogram) == 2 && histogramCount(s.Histogram[1]) > 0 {
			return ""
		}
		for _, p := range s.Histograms {
			if len(p) == 2 {
				if b, err := json.Marshal(p[1]); err == nil && histogramCount(b) > 0 {
					return ""
				}
			}
		}
	}
	return fmt.Sprintf("%d series, none with a number (NaN only, or histograms without observations)", len(series))
}

func isNumber(v any) bool {
	s, ok := v.(string)
	if !ok {
		return false
	}
	f, err := strconv.ParseFloat(s, 64)
	return err == nil && !math.IsNaN(f) && !math.IsInf(f, 0)
}

func histogramCount(raw json.RawMessage) float64 {
	var h struct {
		Count string `json:"count"`
	}
	if json.Unmarshal(raw, &h) != nil {
		return 0
	}
	f, _ := strconv.ParseFloat(h.Count, 64)
	return f
}

// exemplarCount returns how many exemplars with a trace_id Prometheus holds
// for the series expr selects over the last five minutes.
func (v *verifier) exemplarCount(expr string) (int, error) {
	ex, err := v.queryExemplars(expr, 5*time.Minute)
	return len(ex), err
}
