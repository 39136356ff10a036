package main

// The agent's messages, read from the binary as an operator reads them: each says
// what is wrong and what to do, once, in the log's format.

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/npagent/npagent/internal/testenv"
)

// runBinary runs the agent binary with args and env only (no KUBECONFIG,
// KUBERNETES_SERVICE_HOST or NPAGENT_* of the test's environment) and returns its
// exit code and output. The agent must exit by itself within 30s.
func runBinary(t *testing.T, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	bin := buildAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(),
		"OTEL_TRACES_EXPORTER=none", "OTEL_METRICS_EXPORTER=none", "NPAGENT_DEBUG_SOCKET="}, env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("npagent %s did not exit within 30s:\n%s", strings.Join(args, " "), errOut.String())
	}
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatalf("run npagent: %v", err)
	}
	return cmd.ProcessState.ExitCode(), out.String(), errOut.String()
}

// offlineFlags start the agent as far as its kubeconfig, with nothing it could
// not do unprivileged.
func offlineFlags() []string {
	return []string{"--node-name=n", "--node-ip=192.0.2.10", "--dataplane=memory", "--state-file=",
		"--metrics-addr=127.0.0.1:0", "--health-addr=127.0.0.1:0", "--debug-socket="}
}

// TestAgentWithoutKubeconfigSaysHowToGiveOne: a kubeconfig path where no file is,
// an empty kubeconfig, or none at all outside a pod each end the agent (exit 1)
// with a message naming the three ways to reach the apiserver, not client-go's
// "try setting KUBERNETES_MASTER".
func TestAgentWithoutKubeconfigSaysHowToGiveOne(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty-kubeconfig")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		env  []string
		args []string
		want []string
	}{
		{"flag names no file", nil, []string{"--kubeconfig=/nonexistent/kubeconfig"},
			[]string{"/nonexistent/kubeconfig", "no kubeconfig file there", "--kubeconfig", "$KUBECONFIG", "service account"}},
		{"variable names no file", []string{"KUBECONFIG=/nonexistent/kubeconfig"}, nil,
			[]string{"/nonexistent/kubeconfig", "no kubeconfig file there", "--kubeconfig", "$KUBECONFIG", "service account"}},
		{"empty file", nil, []string{"--kubeconfig=" + empty},
			[]string{empty, "no cluster, user or context", "current-context", "service account"}},
		{"none, outside a pod", nil, nil,
			[]string{"no kubeconfig given and no in-cluster configuration", "--kubeconfig", "$KUBECONFIG", "service account"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, _, stderr := runBinary(t, c.env, append(offlineFlags(), c.args...)...)
			if code != 1 {
				t.Errorf("exit code %d, want 1:\n%s", code, stderr)
			}
			var missing []string
			for _, w := range c.want {
				if !strings.Contains(stderr, w) {
					missing = append(missing, w)
				}
			}
			if len(missing) > 0 {
				t.Errorf("stderr does not say %q:\n%s", missing, stderr)
			}
			if strings.Contains(stderr, "KUBERNETES_MASTER") {
				t.Errorf("stderr gives client-go's KUBERNETES_MASTER hint:\n%s", stderr)
			}
		})
	}
}

// TestAgentFlagTypoSaysSoOnce: a mistyped flag prints its error once and a
// one-line hint (exit 2), not the error twice around the whole usage.
func TestAgentFlagTypoSaysSoOnce(t *testing.T) {
	code, stdout, stderr := runBinary(t, nil, "--node-ipp=192.0.2.10")
	if code != 2 {
		t.Errorf("exit code %d, want 2", code)
	}
	want := "npagent: flag provided but not defined: -node-ipp\nRun npagent --help for the flags.\n"
	if stderr != want || stdout != "" {
		t.Errorf("a flag typo printed\nstdout: %q\nstderr (%d lines): %q\nwant only stderr %q", stdout, strings.Count(stderr, "\n"), stderr, want)
	}
}

// TestAgentJSONLogHasNoTextLine: with --log-format=json every line the agent
// writes is JSON, the one saying why it failed too: a fatal start error (exit 1)
// and a bad flag value after --log-format=json (exit 2).
func TestAgentJSONLogHasNoTextLine(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"fatal at start", append(offlineFlags(), "--log-format=json", "--kubeconfig=/nonexistent/kubeconfig"), 1, "no kubeconfig file there"},
		{"bad flag value", []string{"--log-format=json", "--node-ip=192.0.2.10", "--dataplane=xdp"}, 2, `--dataplane: \"xdp\" is not ebpf or memory`},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, _, stderr := runBinary(t, nil, c.args...)
			if code != c.code {
				t.Errorf("exit code %d, want %d", code, c.code)
			}
			for _, line := range strings.Split(strings.TrimSuffix(stderr, "\n"), "\n") {
				var rec map[string]any
				if err := json.Unmarshal([]byte(line), &rec); err != nil {
					t.Errorf("not a JSON line: %q", line)
				}
			}
			if !strings.Contains(stderr, `"level":"ERROR"`) || !strings.Contains(stderr, c.want) {
				t.Errorf("no ERROR record saying %s:\n%s", c.want, stderr)
			}
		})
	}
}

// TestAgentHelpGroupsTheFlags: --help (exit 0, on stdout) lists every flag once,
// under its group in order, with its variable and default, in lines of at most
// 100 columns.
func TestAgentHelpGroupsTheFlags(t *testing.T) {
	code, stdout, stderr := runBinary(t, nil, "--help")
	if code != 0 || stderr != "" {
		t.Errorf("--help: exit code %d, stderr %d bytes; want 0, the usage on stdout only", code, len(stderr))
	}
	stdout += stderr
	for i, line := range strings.Split(stdout, "\n") {
		if len(line) > helpWidth {
			t.Errorf("line %d has %d columns, want at most %d: %q", i+1, len(line), helpWidth, line)
		}
	}
	last := -1
	for _, title := range []string{"Node and cluster:", "Dataplane:", "Enforcement:", "Telemetry:", "Health and debug:", "State:"} {
		i := strings.Index(stdout, "\n"+title+"\n")
		if i < 0 || i < last {
			t.Errorf("group %q missing or out of order", title)
		}
		last = i
	}
	for name, env := range flagEnv {
		if n := strings.Count(stdout, "  --"+name+" ["+env+"]\n"); n != 1 {
			t.Errorf("--%s [%s] listed %d times, want once", name, env, n)
		}
	}
	for _, def := range []string{`(default "127.0.0.1:9438")`, `(default "/var/lib/npagent/seen.state")`, `(default "ebpf")`} {
		if !strings.Contains(stdout, def) {
			t.Errorf("--help does not show %s", def)
		}
	}
}

// TestHelpGroupsEveryFlag: every flag defined is in exactly one group of --help.
func TestHelpGroupsEveryFlag(t *testing.T) {
	grouped := map[string]int{}
	for _, g := range flagGroups {
		for _, name := range g.flags {
			grouped[name]++
		}
	}
	fs := newFlagSet(&config{}, &rawFlags{})
	n := 0
	fs.VisitAll(func(f *flag.Flag) {
		n++
		if grouped[f.Name] != 1 {
			t.Errorf("--%s is in %d groups of --help, want 1", f.Name, grouped[f.Name])
		}
	})
	if len(grouped) != n {
		t.Errorf("%d flags grouped, %d defined", len(grouped), n)
	}
}

// holdingAPIServer forwards to a real apiserver with its credentials, as kubectl
// proxy does, but answers 503 to every request for ClusterPolicyEndpoints: the
// agent's probe passes, its informers never sync.
func holdingAPIServer(t *testing.T, rc *rest.Config) string {
	t.Helper()
	host := rc.Host
	if !strings.Contains(host, "://") {
		host = "https://" + host
	}
	target, err := url.Parse(host)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := rest.TransportFor(rc)
	if err != nil {
		t.Fatal(err)
	}
	proxy := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(target) }, Transport: rt, FlushInterval: -1}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/clusterpolicyendpoints") {
			http.Error(w, "held by the test", http.StatusServiceUnavailable)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	testenv.WriteKubeconfig(t, &rest.Config{Host: srv.URL}, kubeconfig)
	return kubeconfig
}

// TestExplainWhileCachesSync: while the agent's informers have not synced,
// explain does not call an object unknown (exit 1): it says the agent is still
// starting and exits 3, as for an agent not reachable yet.
func TestExplainWhileCachesSync(t *testing.T) {
	cp, _, stateFile := startControlPlane(t)
	kubeconfig := holdingAPIServer(t, cp.Config)
	sock := filepath.Join(shortTempDir(t), "debug.sock")
	a := startAgent(t, kubeconfig, stateFile, "--debug-socket="+sock)
	testenv.Eventually(t, 30*time.Second, "/readyz: caches not synced", func() bool {
		code, body := a.get(t, "/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "informer caches not synced")
	})
	code, stdout, stderr := runSubcommand(t, 20*time.Second, "explain", "--debug-socket="+sock, "pe/default/web")
	if code != exitUnreachable || !strings.Contains(stderr, "agent starting: informer caches not synced") || strings.Contains(stdout, "unknown") {
		t.Errorf("explain while the caches sync: exit %d\nstdout: %s\nstderr: %s\nwant exit 3, saying the agent is starting", code, stdout, stderr)
	}
	if code := a.stop(t); code != 0 {
		t.Fatalf("exit code after SIGTERM = %d", code)
	}
}

// TestAgentWithoutRBACNamesWhatIsForbidden: an agent whose user has no
// ClusterRole is not ready, and /readyz and the log name the resource and the
// verbs it lacks (not "retrying until the apiserver is back" and "caches not
// synced"); once the ClusterRole is bound it becomes ready without a restart.
func TestAgentWithoutRBACNamesWhatIsForbidden(t *testing.T) {
	cp, _, stateFile := startControlPlane(t)
	const user = "npagent-without-rbac"
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	testenv.WriteKubeconfig(t, cp.Config, kubeconfig)
	raw, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	raw.AuthInfos[raw.Contexts[raw.CurrentContext].AuthInfo].Impersonate = user
	if err := clientcmd.WriteToFile(*raw, kubeconfig); err != nil {
		t.Fatal(err)
	}

	a := startAgent(t, kubeconfig, stateFile, "--apiserver-timeout=2s")
	want := "forbidden: cannot list and watch policyendpoints.networking.k8s.aws: the ClusterRole bound to the agent's service account (or --kubeconfig's user) lacks list and watch"
	testenv.Eventually(t, 30*time.Second, "/readyz to name the forbidden verbs", func() bool {
		code, body := a.get(t, "/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, want)
	})
	testenv.Eventually(t, 10*time.Second, "the log to name them", func() bool {
		return strings.Contains(a.logs(), "the agent lacks RBAC permissions") && strings.Contains(a.logs(), want)
	})
	if strings.Contains(a.logs(), "retrying until the apiserver is back") {
		t.Errorf("missing RBAC logged as an apiserver outage:\n%s", a.logs())
	}

	ctx := context.Background()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: user}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"networking.k8s.aws"}, Resources: []string{"policyendpoints", "clusterpolicyendpoints"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch"}}}}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: user},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}}
	for _, o := range []client.Object{role, binding} {
		if err := cp.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	// The probe backs off up to 30s between attempts.
	testenv.Eventually(t, 60*time.Second, "/readyz 200 once the ClusterRole is bound", func() bool {
		code, _ := a.get(t, "/readyz")
		return code == http.StatusOK
	})
	if code := a.stop(t); code != 0 {
		t.Fatalf("exit code after SIGTERM = %d", code)
	}
}
