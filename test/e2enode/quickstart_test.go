package e2enode

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/npagent/npagent/docs"
	"github.com/npagent/npagent/internal/testenv"
)

// quickStartDocs are the pages QuickStartLocal runs, in order: the local quick start,
// then the uninstall it ends with. Not the migration how-to: beyond its first check,
// its steps need EKS with the AWS VPC CNI (eni/vlan interfaces, node-group labels, a
// registry image, the CNI's enableNetworkPolicy), as the page says.
var quickStartDocs = []string{"docs/tutorials/quickstart-local.md", "docs/how-to/uninstall.md"}

// quickStartVars are the variables the local quick start tells the reader to set
// (its section 0), with this node's values. Its export steps are not run: these are.
func (n *Node) quickStartVars(version string) map[string]string {
	u, _ := url.Parse(n.CP.Config.Host)
	return map[string]string{
		"VERSION":              version,
		"CONTAINERD_ADDRESS":   n.ctrSock,
		"POD_INTERFACE_PREFIX": "veth",
		"POD_IMAGE":            PauseImage, // imported at the node's start: nothing is pulled
		"APISERVER_HOST":       u.Hostname(),
		"APISERVER_PORT":       u.Port(),
	}
}

// quickStartNotRun are the steps the check does not run, by the start of their
// command, and why.
var quickStartNotRun = map[string]string{
	"export ":    "the page's variables: the check sets them to this node's values",
	"make image": "make e2e-node has just built the image at the version the check sets",
}

var (
	explainProgrammed = regexp.MustCompile(`(?m)^\s*state\s+PROGRAMMED\b`)
	explainLatency    = regexp.MustCompile(`(?m)^\s*trigger \S+\s+rv \d+\s+latency (\S+)`)
	latencyCount      = regexp.MustCompile(`(?m)^npagent_policy_programming_latency_seconds_count(?:\{[^}]*\})? (\S+)$`)
)

// quickStartExpect checks what the pages say a step prints, by a regular expression
// its command matches.
var quickStartExpect = []struct {
	in    string
	check func(out string) (string, error)
}{
	{"kubectl get nodes", func(out string) (string, error) {
		if !strings.Contains(out, NodeName) {
			return "", fmt.Errorf("node %s not listed", NodeName)
		}
		return "", nil
	}},
	{"rollout status daemonset/npagent", func(out string) (string, error) {
		if !strings.Contains(out, `daemon set "npagent" successfully rolled out`) {
			return "", fmt.Errorf("not rolled out")
		}
		return "", nil
	}},
	{"kubectl -n shop get policyendpoints$", func(out string) (string, error) {
		if !strings.Contains(out, "web-") {
			return "", fmt.Errorf("no PolicyEndpoint web-… listed")
		}
		return "", nil
	}},
	{"npagent explain pod/shop/web", func(out string) (string, error) {
		if !strings.Contains(out, "web-") || !strings.Contains(strings.ToLower(out), "programmed") {
			return "", fmt.Errorf("the pod's PolicyEndpoint web-… not shown programmed")
		}
		return "", nil
	}},
	{"npagent explain pe/shop/", func(out string) (string, error) {
		if !explainProgrammed.MatchString(out) {
			return "", fmt.Errorf("no `state PROGRAMMED`")
		}
		m := explainLatency.FindStringSubmatch(out)
		if m == nil {
			return "", fmt.Errorf("no report with a latency: the controller's trigger was not measured")
		}
		return "the real controller's trigger measured: latency " + m[1], nil
	}},
	{"npagent_policy_programming_latency_seconds_count", func(out string) (string, error) {
		m := latencyCount.FindStringSubmatch(out)
		if m == nil {
			return "", fmt.Errorf("no npagent_policy_programming_latency_seconds_count sample")
		}
		if c, err := strconv.ParseFloat(m[1], 64); err != nil || c < 1 {
			return "", fmt.Errorf("count %s, want 1 or more", m[1])
		}
		return "latency histogram count " + m[1], nil
	}},
}

// startPolicyController runs the AWS Network Policy Controller (the real one, built
// from its module) against the node's apiserver, as the managed controller runs
// beside an EKS cluster: it turns NetworkPolicies into PolicyEndpoints stamped with
// their trigger time.
func (n *Node) startPolicyController(t *testing.T) {
	t.Helper()
	bin := testenv.ToolPath(t, "aws-network-policy-controller")
	p := n.run(t, "aws-network-policy-controller", bin, "--kubeconfig="+n.Kubeconfig,
		"--enable-configmap-check=false", "--enable-leader-election=false",
		"--metrics-bind-addr=127.0.0.1:0", "--health-probe-bind-addr=127.0.0.1:0")
	n.startProc(t, p)
}

// quickStartLocal runs the local quick start and the uninstall page literally, step
// by step, with kubectl, helm and ctr on PATH, against the node and the real
// controller. The node's own release (the earlier checks') is uninstalled first and
// its namespace deleted, so the page's first steps meet the cluster a reader has.
func (n *Node) quickStartLocal(t *testing.T, version string) {
	t.Helper()
	ctx := context.Background()
	n.UninstallAgent(t, "npagent", "npagent")
	if err := n.Kube.CoreV1().Namespaces().Delete(ctx, "npagent", metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	n.waitFor(t, "namespace npagent gone", 2*time.Minute, func() error {
		if _, err := n.Kube.CoreV1().Namespaces().Get(ctx, "npagent", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%v)", err)
		}
		return nil
	})
	n.startPolicyController(t)

	// The reader's shell: the CLIs on PATH, the kubeconfig, Helm's and kubectl's
	// caches in the node's folder, the page's variables; the checkout's deploy and bin
	// folders in a working folder of its own, so the files the pages write stay there.
	pathDirs := []string{
		filepath.Dir(testenv.ToolPath(t, "kubectl")),
		filepath.Dir(testenv.ToolPath(t, "helm")),
		filepath.Dir(n.ctr),
		os.Getenv("PATH"),
	}
	work := filepath.Join(n.Dir, "quickstart")
	must(t, os.MkdirAll(work, 0o755))
	for _, d := range []string{"deploy", "bin"} {
		must(t, os.Symlink(filepath.Join(testenv.RepoRoot(), d), filepath.Join(work, d)))
	}
	env := append(os.Environ(),
		"PATH="+strings.Join(pathDirs, ":"),
		"KUBECONFIG="+n.Kubeconfig,
		"KUBECACHEDIR="+filepath.Join(n.Dir, "kube-cache"),
		"HELM_CACHE_HOME="+filepath.Join(n.Dir, "helm", "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(n.Dir, "helm", "config"),
		"HELM_DATA_HOME="+filepath.Join(n.Dir, "helm", "data"),
	)
	vars := n.quickStartVars(version)
	for k, v := range vars {
		env = append(env, k+"="+v)
	}
	state := filepath.Join(n.Dir, "quickstart.env")
	must(t, os.WriteFile(state, nil, 0o644))

	start := time.Now()
	for _, doc := range quickStartDocs {
		b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), doc))
		if err != nil {
			t.Fatal(err)
		}
		steps, _ := docs.ShellSteps(string(b))
		var exported []string
		for i, s := range steps {
			if rest, ok := strings.CutPrefix(s.Cmd, "export "); ok {
				for _, kv := range strings.Fields(rest) {
					k, _, _ := strings.Cut(kv, "=")
					exported = append(exported, k)
				}
			}
			if why := notRun(s.Cmd); why != "" {
				t.Logf("%s:%d: not run (%s): %s", doc, s.Line, why, s.Cmd)
				continue
			}
			out, err := runStep(work, env, state, s.Script, 4*time.Minute)
			if err != nil {
				t.Fatalf("%s:%d: step %d failed: %s\n%v\noutput:\n%s", doc, s.Line, i+1, s.Cmd, err, out)
			}
			for _, e := range quickStartExpect {
				if !regexp.MustCompile(e.in).MatchString(s.Cmd) {
					continue
				}
				note, err := e.check(out)
				if err != nil {
					t.Fatalf("%s:%d: %s: %v, though the page says so; output:\n%s", doc, s.Line, s.Cmd, err, out)
				}
				if note != "" {
					t.Logf("%s:%d: %s", doc, s.Line, note)
				}
			}
			t.Logf("%s:%d: ok: %s", doc, s.Line, s.Cmd)
		}
		// The page's variables are the ones this check sets: a new one is a step the
		// check could not follow.
		if len(exported) > 0 {
			want := slices.Sorted(func(yield func(string) bool) {
				for k := range vars {
					if !yield(k) {
						return
					}
				}
			})
			sort.Strings(exported)
			if !slices.Equal(exported, want) {
				t.Fatalf("%s exports %v; this check sets %v", doc, exported, want)
			}
		}
	}
	t.Logf("quick start and uninstall followed literally in %v", time.Since(start).Round(time.Millisecond))

	// Uninstalled as the page says: nothing of npagent attached or pinned.
	if entries, err := os.ReadDir("/sys/fs/bpf/npagent"); err == nil && len(entries) > 0 {
		t.Fatalf("after the uninstall page /sys/fs/bpf/npagent holds %d entries", len(entries))
	}
}

func notRun(cmd string) string {
	for prefix, why := range quickStartNotRun {
		if strings.HasPrefix(cmd, prefix) {
			return why
		}
	}
	return ""
}

// runStep runs one step's script with bash -euo pipefail in dir, the shell variables
// of the steps before it restored from state (and its own saved there), and returns
// its output.
func runStep(dir string, env []string, state, script string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	file := state + ".step.sh"
	// set -a: variables a step sets without export (AGENT=$(...)) are kept too.
	body := "set -a\nsource " + state + "\n" + script + "\nexport -p > " + state + ".new\n"
	if err := os.WriteFile(file, []byte(body), 0o644); err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", file)
	cmd.Dir, cmd.Env = dir, env
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), err
	}
	return string(out), os.Rename(state+".new", state)
}
