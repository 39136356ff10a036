package docs

import (
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/strvals"
	"sigs.k8s.io/yaml"

	"github.com/npagent/npagent/deploy/charts"
)

// commandDocs are the pages whose shell steps TestDocumentedCommandsWork runs
// against the repository: the quick starts and the how-tos a newcomer follows
// command by command.
var commandDocs = []string{
	"README.md",
	"docs/tutorials/quickstart.md",
	"docs/tutorials/quickstart-local.md",
	"docs/how-to/install.md",
	"docs/how-to/migrate-from-aws-node-agent.md",
	"docs/how-to/upgrade.md",
	"docs/how-to/uninstall.md",
	"docs/how-to/strict-mode.md",
}

// mergeValues merges src into dst, maps recursively (helm's order: later wins).
func mergeValues(dst, src map[string]any) {
	for k, v := range src {
		if sm, ok := v.(map[string]any); ok {
			if dm, ok := dst[k].(map[string]any); ok {
				mergeValues(dm, sm)
				continue
			}
		}
		dst[k] = v
	}
}

// TestDocumentedCommandsWork runs the documents' commands that the repository can
// answer for, so a renamed value, target or object breaks the test, not the reader:
// every helm install and upgrade of the chart is rendered with its -f files (the
// page's own here-documents) and --set values through the chart's schema and
// templates; every make target exists; every daemonset/<name> the page names is
// one the page's helm command renders; every npagent subcommand exists. The steps
// that need a cluster (kubectl, skopeo) are checked for those names only.
func TestDocumentedCommandsWork(t *testing.T) {
	root := repoRoot()
	makefile, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	subcommands := map[string]bool{"explain": true, "wait": true, "cleanup": true, "version": true}
	for _, doc := range commandDocs {
		b, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		steps, files := ShellSteps(string(b))
		// A page that asks the reader to export variables (the local quick start)
		// writes files with them: rendered with the page's example values.
		exports := map[string]string{}
		for _, s := range steps {
			if rest, ok := strings.CutPrefix(s.Cmd, "export "); ok {
				for _, kv := range strings.Fields(rest) {
					if k, v, ok := strings.Cut(kv, "="); ok {
						exports[k] = v
					}
				}
			}
		}
		for name, body := range files {
			files[name] = os.Expand(body, func(k string) string {
				if v, ok := exports[k]; ok {
					return v
				}
				return "$" + k
			})
		}
		daemonSets := map[string]bool{}
		var daemonSetRefs []Step
		for _, s := range steps {
			f := strings.Fields(s.Cmd)
			switch {
			case f[0] == "make" && len(f) > 1:
				for _, target := range f[1:] {
					if strings.Contains(target, "=") {
						continue
					}
					if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(target) + `:`).Match(makefile) {
						t.Errorf("%s:%d: make %s: no such target in the Makefile", doc, s.Line, target)
					}
				}
			case f[0] == "helm" && len(f) > 3 && (f[1] == "install" || f[1] == "upgrade"):
				rel := charts.Release{Name: f[2], Namespace: "default"}
				if f[3] != "deploy/charts/npagent" {
					t.Errorf("%s:%d: helm %s of %q, not the repository's chart", doc, s.Line, f[1], f[3])
					continue
				}
				values := map[string]any{}
				for i := 4; i < len(f); i++ {
					arg, next := f[i], ""
					if i+1 < len(f) {
						next = strings.Trim(f[i+1], `'"`)
					}
					switch arg {
					case "--namespace", "-n":
						rel.Namespace = next
						i++
					case "-f", "--values":
						body, ok := files[next]
						if !ok {
							t.Errorf("%s:%d: -f %s: the page writes no such file", doc, s.Line, next)
						}
						var v map[string]any
						if err := yaml.Unmarshal([]byte(body), &v); err != nil {
							t.Errorf("%s:%d: -f %s: %v", doc, s.Line, next, err)
						}
						mergeValues(values, v)
						i++
					case "--set":
						if err := strvals.ParseInto(next, values); err != nil {
							t.Errorf("%s:%d: --set %s: %v", doc, s.Line, next, err)
						}
						i++
					case "--set-string":
						if err := strvals.ParseIntoString(next, values); err != nil {
							t.Errorf("%s:%d: --set-string %s: %v", doc, s.Line, next, err)
						}
						i++
					case "--reuse-values":
					default:
						t.Errorf("%s:%d: helm %s: this test does not know %q", doc, s.Line, f[1], arg)
					}
				}
				r, err := charts.Render(charts.Dir("npagent"), rel, maps.Clone(values))
				if err != nil {
					t.Errorf("%s:%d: %s\n\tthe chart refuses it: %v", doc, s.Line, s.Cmd, err)
					continue
				}
				for _, m := range regexp.MustCompile(`(?m)^kind: DaemonSet\nmetadata:\n  name: (\S+)`).FindAllStringSubmatch(r.String(), -1) {
					daemonSets[m[1]] = true
				}
			case f[0] == "npagent" || (f[0] == "kubectl" && strings.Contains(s.Cmd, " -- npagent ")):
				after, _ := strings.CutPrefix(s.Cmd, "npagent ")
				if f[0] == "kubectl" {
					_, after, _ = strings.Cut(s.Cmd, " -- npagent ")
				}
				if sub := strings.Fields(after); len(sub) == 0 || !subcommands[sub[0]] {
					t.Errorf("%s:%d: %q: not an npagent subcommand", doc, s.Line, after)
				}
			}
			if strings.Contains(s.Cmd, "daemonset/") {
				daemonSetRefs = append(daemonSetRefs, s)
			}
		}
		for _, s := range daemonSetRefs {
			if len(daemonSets) == 0 {
				continue // the page installs nothing itself: the reader's release
			}
			for _, m := range regexp.MustCompile(`daemonset/([a-z0-9-]+)`).FindAllStringSubmatch(s.Cmd, -1) {
				if !daemonSets[m[1]] {
					t.Errorf("%s:%d: daemonset/%s: the page's helm command renders %v", doc, s.Line, m[1], daemonSets)
				}
			}
		}
	}
}
