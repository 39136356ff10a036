// Command template prints a chart of deploy/charts rendered as helm template does, with
// Helm's Go packages (no helm binary), or writes examples/deploy from the npagent chart.
//
//	go run ./deploy/charts/template [-chart npagent] [-name npagent] [-namespace npagent] [-set key=value]...
//	go run ./deploy/charts/template -examples examples/deploy
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"helm.sh/helm/v3/pkg/strvals"

	"github.com/npagent/npagent/deploy/charts"
)

type setFlags []string

func (s *setFlags) String() string     { return strings.Join(*s, ",") }
func (s *setFlags) Set(v string) error { *s = append(*s, v); return nil }

func main() {
	var (
		chart    = flag.String("chart", "npagent", "chart directory name under deploy/charts")
		name     = flag.String("name", "npagent", "release name")
		ns       = flag.String("namespace", "npagent", "release namespace")
		examples = flag.String("examples", "", "write the npagent chart's default rendering to this directory instead of printing")
		sets     setFlags
	)
	flag.Var(&sets, "set", "a value, as helm --set (repeatable)")
	flag.Parse()
	if err := run(*chart, charts.Release{Name: *name, Namespace: *ns}, sets, *examples); err != nil {
		fmt.Fprintln(os.Stderr, "template:", err)
		os.Exit(1)
	}
}

func run(chart string, rel charts.Release, sets []string, examples string) error {
	if examples != "" {
		if len(sets) > 0 || chart != "npagent" || rel != charts.ExampleRelease {
			return fmt.Errorf("-examples writes the npagent chart's defaults for %s/%s: no -set, -chart, -name or -namespace", charts.ExampleRelease.Namespace, charts.ExampleRelease.Name)
		}
		files, err := charts.Examples()
		if err != nil {
			return err
		}
		for _, f := range files {
			if err := os.WriteFile(examples+"/"+f.Name, []byte(f.Content), 0o644); err != nil {
				return err
			}
			fmt.Printf("==> %s/%s\n", examples, f.Name)
		}
		return nil
	}
	values := map[string]any{}
	for _, s := range sets {
		if err := strvals.ParseInto(s, values); err != nil {
			return fmt.Errorf("-set %s: %w", s, err)
		}
	}
	r, err := charts.Render(charts.Dir(chart), rel, values)
	if err != nil {
		return err
	}
	fmt.Print(r.String())
	return nil
}
