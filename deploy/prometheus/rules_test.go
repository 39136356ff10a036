// Package prometheus_test checks the Prometheus rules in this directory with the
// promtool of the Prometheus version the demo runs (hack/tools.sh promtool).
package prometheus_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/npagent/npagent/internal/telemetry"
	"github.com/npagent/npagent/internal/testenv"
)

const (
	rulesFile = "npagent.rules.yaml"
	testsFile = "npagent.rules.test.yaml"
)

// TestPromtool runs `promtool check rules` (syntax, PromQL, duplicate rules as
// errors), `promtool test rules` (the unit tests in npagent.rules.test.yaml) and
// `promtool check config` on prometheus.yml, the example configuration.
func TestPromtool(t *testing.T) {
	promtool := testenv.ToolPath(t, "promtool")
	for _, args := range [][]string{
		{"check", "rules", "--lint=all", "--lint-fatal", rulesFile},
		{"test", "rules", testsFile},
		{"check", "config", "prometheus.yml"}, // the settings the dashboard needs, with the rules
	} {
		t.Run(args[0], func(t *testing.T) {
			out, err := exec.Command(promtool, args...).CombinedOutput()
			if err != nil {
				t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
			}
			t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
		})
	}
}

// TestMetricNames keeps the rules in step with the instrument names: each metric
// the rules read is an instrument of internal/telemetry as Prometheus names it
// (dots to underscores, the unit appended, _total on counters).
func TestMetricNames(t *testing.T) {
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	rules := string(b)
	prom := func(name, suffix string) string { return strings.ReplaceAll(name, ".", "_") + suffix }
	for _, name := range []string{
		prom(telemetry.LatencyName, "_seconds"),
		prom(telemetry.SuppressedName, "_total"),
		prom(telemetry.DeliveriesName, "_total"),
		prom(telemetry.CommitFailuresName, "_total"),
		prom(telemetry.CommitDurationName, "_seconds"),
		prom(telemetry.SeenOldestPendingAgeName, "_seconds"),
		prom(telemetry.WatchStalledName, ""),
		prom(telemetry.WatchLastEventAgeName, "_seconds"),
		prom(telemetry.WatchErrorsName, "_total"),
		prom(telemetry.PodsIsolatedName, "_total"),
		prom(telemetry.MapEntriesName, ""),
		prom(telemetry.MapCapacityName, ""),
		prom(telemetry.AuditModeName, ""),
	} {
		if !strings.Contains(rules, name) {
			t.Errorf("%s does not use %s", rulesFile, name)
		}
	}
}
