package main

// The explain and wait subcommands, as binaries, against the agent binary on a real
// kube-apiserver (the in-memory dataplane; a local pod is a real veth with a host
// route, which the agent's route resolver finds).

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/explain"
	"github.com/npagent/npagent/internal/testenv"
)

// shortTempDir is a temporary directory with a short path (a unix socket's path
// is bounded), removed at cleanup.
func shortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "npd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// subcommand is one run of the binary with a subcommand.
type subcommand struct {
	cmd            *exec.Cmd
	stdout, stderr bytes.Buffer
	done           chan struct{}
	started        time.Time
	ended          time.Time
}

// startSubcommand runs the binary with args in the background.
func startSubcommand(t *testing.T, args ...string) *subcommand {
	t.Helper()
	s := &subcommand{cmd: exec.Command(buildAgent(t), args...), done: make(chan struct{})}
	s.cmd.Stdout, s.cmd.Stderr = &s.stdout, &s.stderr
	s.cmd.Env = append(os.Environ(), "NPAGENT_DEBUG_SOCKET=") // only the flag names the socket
	s.started = time.Now()
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start npagent %s: %v", strings.Join(args, " "), err)
	}
	go func() {
		s.cmd.Wait()
		s.ended = time.Now()
		close(s.done)
	}()
	t.Cleanup(func() {
		select {
		case <-s.done:
		default:
			s.cmd.Process.Kill()
			<-s.done
		}
	})
	return s
}

// wait waits for the subcommand to exit and returns its code.
func (s *subcommand) wait(t *testing.T, within time.Duration) int {
	t.Helper()
	select {
	case <-s.done:
	case <-time.After(within):
		t.Fatalf("npagent %s still running after %v\nstdout: %s\nstderr: %s", strings.Join(s.cmd.Args[1:], " "), within, &s.stdout, &s.stderr)
	}
	return s.cmd.ProcessState.ExitCode()
}

// runSubcommand runs the binary with args and returns its exit code and output.
func runSubcommand(t *testing.T, within time.Duration, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	s := startSubcommand(t, args...)
	code = s.wait(t, within)
	return code, s.stdout.String(), s.stderr.String()
}

// TestExplainAndWait: `npagent wait` exits 3 while no agent serves the socket; with
// the agent running it blocks for a pod that appears before its policy and returns
// 0 once the PolicyEndpoint that selects it is programmed; it returns 0 at once
// for a pod already programmed and 1 at the timeout for a pod whose interface is
// missing. `npagent explain` shows the versions, the report with its phases, the
// pending trigger and its age; the oldest-pending-age gauge shows the same age.
// The socket is 0600 and removed at shutdown.
func TestExplainAndWait(t *testing.T) {
	skipIfShort(t)
	podIP := addLocalPod(t)
	cp, kubeconfig, stateFile := startControlPlane(t)
	ctx := context.Background()
	sock := filepath.Join(shortTempDir(t), "debug.sock")
	socketFlag := "--debug-socket=" + sock

	// No agent: unreachable (3), for wait at its timeout and for explain at once.
	start := time.Now()
	code, _, errOut := runSubcommand(t, 20*time.Second, "wait", socketFlag, "--ip="+podIP, "--timeout=1s")
	if code != exitUnreachable || !strings.Contains(errOut, "agent unreachable") {
		t.Fatalf("wait without an agent: exit %d, stderr %q; want 3, agent unreachable", code, errOut)
	}
	if d := time.Since(start); d < time.Second {
		t.Errorf("wait without an agent gave up after %v, before its 1s timeout (the agent may be restarting)", d)
	}
	if code, _, errOut := runSubcommand(t, 20*time.Second, "explain", socketFlag, "pe/default/x"); code != exitUnreachable {
		t.Fatalf("explain without an agent: exit %d (%s), want 3", code, errOut)
	}

	a := startAgent(t, kubeconfig, stateFile, socketFlag)
	testenv.Eventually(t, 30*time.Second, "/readyz 200", func() bool { code, _ := a.get(t, "/readyz"); return code == 200 })
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Fatalf("debug socket: %v, mode %v; want a socket with mode 0600", err, fi.Mode())
	}

	// The pod exists, its policy does not: wait --policy blocks until it does.
	w := startSubcommand(t, "wait", socketFlag, "--ip="+podIP, "--policy=default/allow-web", "--timeout=60s", "--interval=100ms")
	time.Sleep(2 * time.Second)
	select {
	case <-w.done:
		t.Fatalf("wait --policy returned before the policy existed: exit %d\nstdout: %s\nstderr: %s", w.cmd.ProcessState.ExitCode(), &w.stdout, &w.stderr)
	default:
	}
	created := time.Now()
	pe := policyEndpoint("allow-web", podIP, created)
	pe.Annotations[v1alpha1.AnnotationTraceParent] = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	if err := cp.Client.Create(ctx, pe); err != nil {
		t.Fatalf("create PolicyEndpoint default/allow-web: %v", err)
	}
	if code := w.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("wait --policy after the policy was programmed: exit %d\nstdout: %s\nstderr: %s", code, &w.stdout, &w.stderr)
	}
	if !w.ended.After(created) || !strings.Contains(w.stdout.String(), "programmed") || !strings.Contains(w.stderr.String(), "policy default/allow-web does not select the pod yet") {
		t.Errorf("wait --policy: ended %v (policy created %v)\nstdout: %s\nstderr: %s", w.ended, created, &w.stdout, &w.stderr)
	}

	// Already programmed, by name: at once.
	code, out, errOut := runSubcommand(t, 10*time.Second, "wait", socketFlag, "--pod=default/allow-web-pod", "--timeout=10s")
	if code != 0 || !strings.Contains(out, "pe/default/allow-web@") {
		t.Fatalf("wait --pod for a programmed pod: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}

	// explain --json: the version, the report and its phases.
	if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(pe), pe); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = runSubcommand(t, 10*time.Second, "explain", socketFlag, "--json", "pe/default/allow-web")
	var ex explain.ObjectExplain
	if err := json.Unmarshal([]byte(out), &ex); code != 0 || err != nil {
		t.Fatalf("explain --json: exit %d, %v\nstdout: %s\nstderr: %s", code, err, out, errOut)
	}
	if ex.State != explain.StateProgrammed || ex.UID != string(pe.UID) || ex.ResourceVersion != pe.ResourceVersion ||
		ex.WriterTraceID != "0af7651916cd43dd8448eb211c80319c" || fmt.Sprint(ex.LocalPods) != "["+podIP+"]" || ex.Node != testNodeName {
		t.Errorf("explain: %+v", ex)
	}
	if len(ex.Versions) != 1 || ex.Versions[0].ResourceVersion != pe.ResourceVersion || ex.Versions[0].Outcome != explain.StateProgrammed ||
		!ex.Versions[0].HasLocalWork() || ex.Versions[0].Received.IsZero() {
		t.Errorf("versions: %+v", ex.Versions)
	}
	if len(ex.Reports) != 1 {
		t.Fatalf("reports: %+v, want one", ex.Reports)
	}
	r := ex.Reports[0]
	if len(r.Attempts) != 1 || r.Attempts[0].Phases.Merge <= 0 || r.Delivery <= 0 || r.Queue <= 0 || r.Compute <= 0 || r.Latency <= 0 || r.Pods != 1 {
		t.Errorf("report: %+v; want one attempt with its merge phase, delivery, queue and compute", r)
	}

	// The human forms.
	code, out, _ = runSubcommand(t, 10*time.Second, "explain", socketFlag, "pe/default/allow-web")
	for _, want := range []string{"pe/default/allow-web on node " + testNodeName, "PROGRAMMED", "VERSIONS", pe.ResourceVersion, "REPORTS", "delivery", "queue", "compute", "lock wait", "merge", "0af7651916cd43dd8448eb211c80319c"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("explain (exit %d) does not show %q:\n%s", code, want, out)
		}
	}
	t.Logf("npagent explain pe/default/allow-web:\n%s", out)
	code, out, _ = runSubcommand(t, 10*time.Second, "explain", podIP, socketFlag)
	if code != 0 || !strings.Contains(out, "PROGRAMMED") || !strings.Contains(out, "pe/default/allow-web") {
		t.Errorf("explain %s (exit %d):\n%s", podIP, code, out)
	}
	t.Logf("npagent explain %s:\n%s", podIP, out)

	// A pod whose interface is missing: its trigger stays pending, and ages.
	stuckIP := fmt.Sprintf("10.253.%d.%d", os.Getpid()>>8&0xff, os.Getpid()%250+1)
	stuck := policyEndpoint("stuck", stuckIP, time.Now())
	if err := cp.Client.Create(ctx, stuck); err != nil {
		t.Fatalf("create default/stuck: %v", err)
	}
	testenv.Eventually(t, 20*time.Second, "default/stuck pending for more than a second", func() bool {
		_, out, _ := runSubcommand(t, 10*time.Second, "explain", socketFlag, "--json", "pe/default/stuck")
		ex = explain.ObjectExplain{}
		return json.Unmarshal([]byte(out), &ex) == nil && len(ex.Pending) == 1 && ex.Pending[0].Age > time.Second
	})
	if ex.State != explain.StateWaiting || ex.Programmed || !strings.Contains(ex.Detail, stuckIP) {
		t.Errorf("stuck: %+v", ex)
	}
	if age := a.metric(t, "npagent_seen_oldest_pending_age_seconds"); age < 1 {
		t.Errorf("npagent_seen_oldest_pending_age_seconds = %v with a trigger pending for over a second", age)
	}
	code, out, _ = runSubcommand(t, 10*time.Second, "explain", socketFlag, "pe/default/stuck")
	if code != 0 || !strings.Contains(out, "WAITING-FOR-INTERFACES") || !strings.Contains(out, "PENDING") || !strings.Contains(out, "AGE") {
		t.Errorf("explain stuck (exit %d):\n%s", code, out)
	}
	t.Logf("npagent explain pe/default/stuck:\n%s", out)
	start = time.Now()
	code, _, errOut = runSubcommand(t, 20*time.Second, "wait", socketFlag, "--ip="+stuckIP, "--timeout=2s")
	if code != exitNotProgrammed || !strings.Contains(errOut, "waiting-for-interfaces") || time.Since(start) < 2*time.Second {
		t.Errorf("wait for the stuck pod: exit %d after %v, stderr %q; want 1 at the 2s timeout, naming the wait", code, time.Since(start), errOut)
	}

	// Bad command lines: 2.
	for _, args := range [][]string{{"wait", socketFlag}, {"wait", socketFlag, "--ip=10.0.0.1", "--pod=a/b"}, {"explain", socketFlag, "po/x"}, {"wait", "--policy=a/b/c", "--ip=10.0.0.1"}} {
		if code, _, _ := runSubcommand(t, 10*time.Second, args...); code != exitUsage {
			t.Errorf("npagent %s: exit %d, want 2", strings.Join(args, " "), code)
		}
	}
	if code, out, _ := runSubcommand(t, 10*time.Second, "explain", socketFlag, "cpe/none"); code != exitNotProgrammed || !strings.Contains(out, "not found") {
		t.Errorf("explain of an unknown object: exit %d\n%s", code, out)
	}

	if code := a.stop(t); code != 0 {
		t.Fatalf("agent exit code after SIGTERM = %d", code)
	}
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Errorf("debug socket after shutdown: %v, want removed", err)
	}
}

// TestWaitWhileTheAgentStarts: an agent still waiting for its apiserver answers on
// the debug socket (503, "agent starting"): wait keeps waiting and, at its timeout,
// exits 1 (not programmed), not 3 (unreachable).
func TestWaitWhileTheAgentStarts(t *testing.T) {
	skipIfShort(t)
	kubeconfig, _ := deadAPIServer(t)
	sock := filepath.Join(shortTempDir(t), "debug.sock")
	a := startAgent(t, kubeconfig, filepath.Join(t.TempDir(), "seen.state"), "--apiserver-timeout=1s", "--debug-socket="+sock)
	testenv.Eventually(t, 20*time.Second, "the debug socket", func() bool { _, err := os.Stat(sock); return err == nil })
	code, _, errOut := runSubcommand(t, 20*time.Second, "wait", "--debug-socket="+sock, "--pod=default/p", "--timeout=2s")
	if code != exitNotProgrammed || !strings.Contains(errOut, "agent starting") {
		t.Errorf("wait on a starting agent: exit %d, stderr %q; want 1, naming the agent starting", code, errOut)
	}
	if code := a.stop(t); code != 0 {
		t.Fatalf("agent exit code after SIGTERM = %d", code)
	}
}

// TestListenDebug: the socket is 0600 from the start; a stale socket (its agent
// killed) is replaced; a live one, or a file that is not a socket, is refused; and
// the socket is removed when the listener closes.
func TestListenDebug(t *testing.T) {
	dir := shortTempDir(t)
	path := filepath.Join(dir, "sub", "debug.sock")
	ln, err := listenDebug(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v (%v), want 0600", fi.Mode(), err)
	}
	if di, err := os.Stat(filepath.Dir(path)); err != nil || di.Mode().Perm() != 0o700 {
		t.Errorf("created directory mode %v (%v), want 0700", di.Mode(), err)
	}
	if _, err := listenDebug(path); err == nil || !strings.Contains(err.Error(), "answers on it") {
		t.Errorf("second listen on a live socket: %v, want refused", err)
	}
	// A killed agent leaves its socket behind: simulate with a listener that
	// does not unlink.
	ln.(*unlinkListener).Listener.Close()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("stale socket missing: %v", err)
	}
	ln, err = listenDebug(path)
	if err != nil {
		t.Fatalf("listen over a stale socket: %v", err)
	}
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Errorf("socket after Close: %v, want removed", err)
	}
	if err := os.WriteFile(path, []byte("not a socket"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := listenDebug(path); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("listen over a regular file: %v, want refused", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "not a socket" {
		t.Errorf("the regular file was touched: %q", b)
	}
}

func TestDebugSocketFlag(t *testing.T) {
	for _, bad := range []string{"relative/debug.sock", "/" + strings.Repeat("d", maxDebugSocketPath)} {
		_, err := parseConfig([]string{"--node-ip=10.0.0.1", "--debug-socket=" + bad}, envMap(nil), &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), "--debug-socket") {
			t.Errorf("--debug-socket=%s: err = %v, want an error naming the flag", bad, err)
		}
	}
	c, err := parseConfig([]string{"--node-ip=10.0.0.1", "--debug-socket="}, envMap(nil), &bytes.Buffer{})
	if err != nil || c.DebugSocket != "" {
		t.Errorf("--debug-socket= (off): %q, %v", c.DebugSocket, err)
	}
}

// TestPrintObjectFailedAttempts: the human form of an object whose commits fail
// names the state, the pending trigger with its failure count, and each failed
// attempt with its phases and error.
func TestPrintObjectFailedAttempts(t *testing.T) {
	at := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	ex := explain.ObjectExplain{
		Node: "n1", At: at, Kind: "PolicyEndpoint", Namespace: "shop", Name: "web", UID: "u1", ResourceVersion: "7",
		State: explain.StateFailed, Detail: "commit pod 10.0.0.1 (ifindex 4): map full",
		Pending: []explain.PendingInfo{{Trigger: at.Add(-90 * time.Second), Received: at.Add(-89 * time.Second), Age: 90 * time.Second, Waiting: 89 * time.Second, Failures: 3}},
		FailedAttempts: []explain.AttemptInfo{{Start: at.Add(-80 * time.Second), LockWait: 2 * time.Millisecond, Duration: 5 * time.Millisecond,
			Err: "commit pod 10.0.0.1 (ifindex 4): map full"}},
	}
	ex.FailedAttempts[0].Phases.Write = 4 * time.Millisecond
	var b bytes.Buffer
	printObject(&b, &ex)
	for _, want := range []string{"pe/shop/web on node n1", "FAILED: commit pod 10.0.0.1 (ifindex 4): map full", "PENDING", "1m30s", "FAILED ATTEMPTS", "lock wait 2ms, commit 5ms (write 4ms)", "02:58:40.000Z"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("output does not show %q:\n%s", want, b.String())
		}
	}
}

// TestPrintPodStrictDenied: the human form of a pod strict mode denies says so.
func TestPrintPodStrictDenied(t *testing.T) {
	ex := explain.PodExplain{Node: "n1", Namespace: "shop", Name: "web", IP: "10.0.0.7", OnNode: true, Synced: true,
		Ifindex: 9, Programmed: true, StrictDenied: true, Objects: []explain.PodObject{}}
	var b bytes.Buffer
	printPod(&b, &ex)
	for _, want := range []string{"pod shop/web (10.0.0.7) on node n1", "denied by strict mode until a policy selects it", "ifindex 9"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("output does not show %q:\n%s", want, b.String())
		}
	}
	if strings.Contains(b.String(), "nothing to enforce") {
		t.Errorf("a strict-denied pod shown as having nothing to enforce:\n%s", b.String())
	}
}

// TestPrintObjectNotes: the human form shows the agent's notes on the object (the
// trigger annotation missing, so nothing is measured), under its trigger.
func TestPrintObjectNotes(t *testing.T) {
	ex := explain.ObjectExplain{Node: "n1", At: time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC), Kind: "PolicyEndpoint",
		Namespace: "shop", Name: "web", UID: "u1", ResourceVersion: "7", State: explain.StateProgrammed,
		Notes: []string{"no networking.k8s.aws/last-change-trigger-time annotation: this version's programming latency is not measured"}}
	var b bytes.Buffer
	printObject(&b, &ex)
	if !strings.Contains(b.String(), "  note        no networking.k8s.aws/last-change-trigger-time annotation") {
		t.Errorf("output does not show the note:\n%s", b.String())
	}
}
