package main

// Integration tests: the agent binary, built from this package, against a real
// kube-apiserver and etcd (internal/testenv). Only the dataplane is the in-memory
// backend, because enforcement is not what these tests are about (internal/bpfmaps
// tests the kernel side as root).

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vishvananda/netlink"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/testenv"
	"github.com/npagent/npagent/internal/testenv/netlab"
	"github.com/npagent/npagent/internal/testenv/skip"
)

const (
	testNodeName = "node-under-test"
	latencyCount = "npagent_policy_programming_latency_seconds_count"
	suppressed   = "npagent_policy_programming_suppressed_total"
)

// testNodeIP is the agent's node IP: it programs the pods whose hostIP is this.
const testNodeIP = "192.0.2.10"

var (
	buildOnce sync.Once
	agentBin  string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if agentBin != "" {
		os.RemoveAll(filepath.Dir(agentBin))
	}
	os.Exit(code)
}

// buildAgent builds this package's binary once per test process (removed by TestMain).
func buildAgent(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "npagent-bin-")
		if err != nil {
			buildErr = err
			return
		}
		agentBin = filepath.Join(dir, "npagent")
		cmd := exec.Command("go", "build", "-ldflags", "-X main.version=v0.0.0-integration", "-o", agentBin, ".")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatalf("build agent: %v", buildErr)
	}
	return agentBin
}

// agentProcess is one running agent binary.
type agentProcess struct {
	cmd    *exec.Cmd
	addr   chan string // the /metrics address, once logged
	url    string      // of /metrics
	health chan string // the probes' address, once logged
	// healthURL is where /livez, /healthz and /readyz are served: their own
	// listener, or url when the agent serves them beside /metrics (before
	// --health-addr).
	healthURL string
	done      chan struct{}
	exit      error
	mu        sync.Mutex
	stderr    strings.Builder
}

func (a *agentProcess) logs() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stderr.String()
}

// startAgent runs the binary with the memory dataplane and an HTTP port of its own
// choosing, and waits until it logs the port.
func startAgent(t *testing.T, kubeconfig, stateFile string, extra ...string) *agentProcess {
	t.Helper()
	return startAgentEnv(t, nil, kubeconfig, stateFile, extra...)
}

// startAgentEnv is startAgent with env added to the agent's environment.
func startAgentEnv(t testing.TB, env []string, kubeconfig, stateFile string, extra ...string) *agentProcess {
	t.Helper()
	args := append([]string{
		"--kubeconfig=" + kubeconfig,
		"--node-name=" + testNodeName,
		"--node-ip=" + testNodeIP,
		"--dataplane=memory",
		"--state-file=" + stateFile,
		"--metrics-addr=127.0.0.1:0",
		"--health-addr=127.0.0.1:0",
		"--log-format=json",
		"--log-level=debug",
		"--resync-period=1s",
		"--debug-socket=" + filepath.Join(shortTempDir(t), "debug.sock"), // not the host's /run
	}, extra...)
	a := &agentProcess{cmd: exec.Command(buildAgent(t), args...), addr: make(chan string, 1), health: make(chan string, 1), done: make(chan struct{})}
	// OTLP off: no collector in this test; /metrics is what is checked.
	a.cmd.Env = append(append(os.Environ(), "OTEL_TRACES_EXPORTER=none", "OTEL_METRICS_EXPORTER=none"), env...)
	stderr, err := a.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := a.cmd.Start(); err != nil {
		t.Fatalf("start agent: %v", err)
	}
	go a.scan(stderr)
	t.Cleanup(func() {
		select {
		case <-a.done:
		default:
			a.cmd.Process.Kill()
			<-a.done
		}
		if t.Failed() {
			t.Logf("agent (pid %d) log:\n%s", a.cmd.Process.Pid, a.logs())
		}
	})
	a.waitHTTP(t)
	return a
}

// waitHTTP waits until the agent logs where it serves /metrics and the probes.
func (a *agentProcess) waitHTTP(t testing.TB) {
	t.Helper()
	for a.url == "" || a.healthURL == "" {
		select {
		case addr := <-a.addr:
			a.url = "http://" + addr
		case addr := <-a.health:
			a.healthURL = "http://" + addr
		case <-a.done:
			t.Fatalf("agent exited before serving HTTP: %v\n%s", a.exit, a.logs())
		case <-time.After(60 * time.Second):
			t.Fatalf("agent did not serve HTTP within 60s:\n%s", a.logs())
		}
	}
}

// scan keeps the agent's log and picks the HTTP address out of it.
func (a *agentProcess) scan(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		a.mu.Lock()
		a.stderr.WriteString(line + "\n")
		a.mu.Unlock()
		var rec struct{ Msg, Addr string }
		if json.Unmarshal([]byte(line), &rec) == nil {
			switch rec.Msg {
			case "serving /metrics":
				a.addr <- rec.Addr
			case "serving /livez, /healthz and /readyz":
				a.health <- rec.Addr
			case "serving /metrics, /livez, /healthz and /readyz": // one listener for all
				a.addr <- rec.Addr
				a.health <- rec.Addr
			}
		}
	}
	a.exit = a.cmd.Wait()
	close(a.done)
}

// stop sends SIGTERM and returns the exit code.
func (a *agentProcess) stop(t testing.TB) int {
	t.Helper()
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	select {
	case <-a.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("agent did not exit within 30s of SIGTERM:\n%s", a.logs())
	}
	return a.cmd.ProcessState.ExitCode()
}

func (a *agentProcess) get(t testing.TB, path string) (int, string) {
	t.Helper()
	base := a.url
	switch path {
	case "/livez", "/healthz", "/readyz":
		base = a.healthURL
	}
	resp, err := http.Get(base + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// metric sums the samples of name whose labels contain every one of labels
// (`key="value"`), in the text exposition of /metrics.
func (a *agentProcess) metric(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	code, body := a.get(t, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics = %d", code)
	}
	return testenv.SumSamples(body, name, labels...)
}

// addLocalPod gives the agent a local pod the way a CNI does: a host-side interface
// (one end of a veth pair) and a host route to the pod's IP through it, which is what the route
// resolver looks up. It needs CAP_NET_ADMIN; the link and its route are removed at
// cleanup. The IP is derived from the test's pid so parallel test processes differ.
func addLocalPod(t *testing.T) string {
	t.Helper()
	if !skip.Root() {
		skip.Unmet(t, "needs root (CAP_NET_ADMIN) to add the interface and host route of a local pod for the route resolver")
	}
	pid := os.Getpid()
	la := netlink.NewLinkAttrs()
	la.Name = fmt.Sprintf("npt%d", pid%1000000)
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: fmt.Sprintf("npp%d", pid%1000000)}); err != nil {
		t.Fatalf("add veth %s: %v", la.Name, err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(la.Name); err == nil {
			netlink.LinkDel(l)
		}
	})
	link, err := netlink.LinkByName(la.Name)
	if err != nil {
		t.Fatalf("link %s: %v", la.Name, err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		t.Fatalf("set %s up: %v", la.Name, err)
	}
	ip := net.IPv4(10, 250, byte(pid>>8), byte(pid%250+1))
	route := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: &net.IPNet{IP: ip, Mask: net.CIDRMask(32, 32)}, Scope: netlink.SCOPE_LINK}
	if err := netlink.RouteAdd(route); err != nil {
		t.Fatalf("add route %s dev %s: %v", route.Dst, la.Name, err)
	}
	return ip.String()
}

func policyEndpoint(name, podIP string, trigger time.Time) *v1alpha1.PolicyEndpoint {
	proto := corev1.ProtocolTCP
	port := int32(80)
	return &v1alpha1.PolicyEndpoint{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "default",
			Annotations: map[string]string{v1alpha1.AnnotationLastChangeTriggerTime: trigger.UTC().Format(time.RFC3339Nano)},
		},
		Spec: v1alpha1.PolicyEndpointSpec{
			PolicyRef:    v1alpha1.PolicyReference{Name: name, Namespace: "default"},
			PodIsolation: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			PodSelectorEndpoints: []v1alpha1.PodEndpoint{{
				HostIP: v1alpha1.NetworkAddress(testNodeIP), PodIP: v1alpha1.NetworkAddress(podIP),
				Name: name + "-pod", Namespace: "default",
			}},
			Ingress: []v1alpha1.EndpointInfo{{CIDR: "10.0.0.0/8", Ports: []v1alpha1.Port{{Protocol: &proto, Port: &port}}}},
		},
	}
}

// startControlPlane runs a real apiserver and writes a kubeconfig for it.
func startControlPlane(t testing.TB) (cp *testenv.ControlPlane, kubeconfig, stateFile string) {
	t.Helper()
	skipIfShort(t)
	cp = testenv.Start(t)
	// The agent's Node, as a cluster has it: the agent reads its addresses.
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNodeName}}
	if err := cp.Client.Create(context.Background(), node); err != nil {
		t.Fatalf("create Node %s: %v", testNodeName, err)
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: testNodeIP}}
	if err := cp.Client.Status().Update(context.Background(), node); err != nil {
		t.Fatalf("Node %s status: %v", testNodeName, err)
	}
	dir := t.TempDir()
	kubeconfig = filepath.Join(dir, "kubeconfig")
	testenv.WriteKubeconfig(t, cp.Config, kubeconfig)
	return cp, kubeconfig, filepath.Join(dir, "state", "seen.state") // the agent creates the directory
}

// TestAgentLifecycle: the binary against a real apiserver serves /livez and /healthz
// at once, turns ready after its informers sync, stays alive (the loop records its
// progress and is not stalled), serves its metrics, warns that the memory
// dataplane enforces nothing, and on SIGTERM exits 0 with the state file written.
func TestAgentLifecycle(t *testing.T) {
	_, kubeconfig, stateFile := startControlPlane(t)

	a := startAgent(t, kubeconfig, stateFile)
	for _, p := range []string{"/livez", "/healthz"} {
		if code, body := a.get(t, p); code != http.StatusOK {
			t.Fatalf("%s = %d %q, want 200", p, code, body)
		}
	}
	testenv.Eventually(t, 30*time.Second, "/readyz 200", func() bool { code, _ := a.get(t, "/readyz"); return code == http.StatusOK })
	// Resyncs every second keep the loop busy: still alive, still ready.
	time.Sleep(2 * time.Second)
	if code, body := a.get(t, "/livez"); code != http.StatusOK || body != "ok\n" {
		t.Fatalf("/livez on a healthy, synced agent = %d %q, want 200 ok", code, body)
	}
	if code, body := a.get(t, "/readyz"); code != http.StatusOK || body != "ok\n" {
		t.Fatalf("/readyz = %d %q, want 200 ok (nothing degraded)", code, body)
	}
	if _, body := a.get(t, "/metrics"); !strings.Contains(body, "npagent_") {
		t.Fatalf("/metrics serves no npagent metric:\n%s", body)
	}
	if !strings.Contains(a.logs(), "in-memory dataplane: no enforcement") {
		t.Error("the memory dataplane was chosen without the no-enforcement warning in the log")
	}
	if !strings.Contains(a.logs(), "v0.0.0-integration") {
		t.Error("the start log does not carry the version set with -ldflags -X main.version")
	}

	if code := a.stop(t); code != 0 {
		t.Fatalf("exit code after SIGTERM = %d, want 0:\n%s", code, a.logs())
	}
	if fi, err := os.Stat(stateFile); err != nil || fi.Size() == 0 {
		t.Fatalf("state file after shutdown: %v (size %d)", err, sizeOf(fi))
	}
	if !strings.Contains(a.logs(), "npagent stopped") {
		t.Error("no final log line after SIGTERM")
	}
}

// TestAgentMeasuresEachTriggerOnceAcrossRestarts: a PolicyEndpoint with a pod on
// this node is programmed and its trigger measured once; resyncs do not measure it
// again; neither does a restarted agent holding the state file; a change made while
// no agent runs is measured by the next one, once.
func TestAgentMeasuresEachTriggerOnceAcrossRestarts(t *testing.T) {
	skipIfShort(t)
	podIP := addLocalPod(t)
	cp, kubeconfig, stateFile := startControlPlane(t)
	ctx := context.Background()

	a := startAgent(t, kubeconfig, stateFile)
	testenv.Eventually(t, 30*time.Second, "/readyz 200", func() bool { code, _ := a.get(t, "/readyz"); return code == http.StatusOK })
	pe := policyEndpoint("allow-web", podIP, time.Now())
	if err := cp.Client.Create(ctx, pe); err != nil {
		t.Fatalf("create PolicyEndpoint default/allow-web: %v", err)
	}
	testenv.Eventually(t, 30*time.Second, "the trigger of default/allow-web to be reported", func() bool {
		return a.metric(t, latencyCount, `npagent_policy_kind="PolicyEndpoint"`) >= 1
	})
	// Resyncs every second re-deliver the object: counted, never measured again.
	testenv.Eventually(t, 10*time.Second, "a resync to be counted as redelivered", func() bool {
		return a.metric(t, suppressed, `reason="redelivered"`) >= 2
	})
	if n := a.metric(t, latencyCount); n != 1 {
		t.Fatalf("latency observations after resyncs = %v, want 1", n)
	}
	if code := a.stop(t); code != 0 {
		t.Fatalf("exit code after SIGTERM = %d, want 0", code)
	}

	// Restart with the state file: the initial list re-delivers allow-web, whose
	// trigger the previous process reported.
	b := startAgent(t, kubeconfig, stateFile)
	testenv.Eventually(t, 30*time.Second, "/readyz 200 after restart", func() bool { code, _ := b.get(t, "/readyz"); return code == http.StatusOK })
	testenv.Eventually(t, 10*time.Second, "the re-listed trigger to be counted as redelivered", func() bool {
		return b.metric(t, suppressed, `reason="redelivered"`) >= 2
	})
	if n := b.metric(t, latencyCount); n != 0 {
		t.Fatalf("after a restart the already-reported trigger was measured again: %v observations", n)
	}
	if code := b.stop(t); code != 0 {
		t.Fatalf("exit code after SIGTERM = %d, want 0", code)
	}

	// A change while no agent runs: the next agent measures it, once, although it
	// is older than that agent's start.
	if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(pe), pe); err != nil {
		t.Fatalf("get default/allow-web: %v", err)
	}
	pe.Annotations[v1alpha1.AnnotationLastChangeTriggerTime] = time.Now().UTC().Format(time.RFC3339Nano)
	pe.Spec.Ingress[0].CIDR = "10.1.0.0/16"
	if err := cp.Client.Update(ctx, pe); err != nil {
		t.Fatalf("update default/allow-web: %v", err)
	}
	time.Sleep(500 * time.Millisecond)
	c := startAgent(t, kubeconfig, stateFile)
	testenv.Eventually(t, 30*time.Second, "the change made while the agent was down to be reported", func() bool {
		return c.metric(t, latencyCount) >= 1
	})
	testenv.Eventually(t, 10*time.Second, "resyncs after the report", func() bool {
		return c.metric(t, suppressed, `reason="redelivered"`) >= 2
	})
	if n := c.metric(t, latencyCount); n != 1 {
		t.Fatalf("latency observations = %v, want exactly 1", n)
	}
	if n := c.metric(t, suppressed, `reason="before_start"`); n != 0 {
		t.Errorf("the change made during the downtime was counted before_start %v times", n)
	}
	if code := c.stop(t); code != 0 {
		t.Fatalf("exit code after SIGTERM = %d, want 0", code)
	}
}

// deadAPIServer returns a kubeconfig naming an address where nothing listens.
func deadAPIServer(t *testing.T) (kubeconfig, addr string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr = ln.Addr().String()
	ln.Close() // nothing listens there now
	kubeconfig = filepath.Join(t.TempDir(), "kubeconfig")
	testenv.WriteKubeconfig(t, &rest.Config{Host: "https://" + addr, TLSClientConfig: rest.TLSClientConfig{Insecure: true}}, kubeconfig)
	return kubeconfig, addr
}

// TestAgentUnreachableAPIServerIsRetried: with nothing listening at the apiserver's
// address the agent does not exit: it is alive, not ready, /readyz names the address
// as unreachable, and SIGTERM during the retries exits 0 at once.
func TestAgentUnreachableAPIServerIsRetried(t *testing.T) {
	skipIfShort(t)
	kubeconfig, addr := deadAPIServer(t)
	a := startAgent(t, kubeconfig, filepath.Join(t.TempDir(), "seen.state"), "--apiserver-timeout=2s")
	testenv.Eventually(t, 20*time.Second, "/readyz to name the unreachable apiserver", func() bool {
		code, body := a.get(t, "/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "apiserver unreachable") && strings.Contains(body, addr)
	})
	if code, body := a.get(t, "/livez"); code != http.StatusOK {
		t.Errorf("/livez while the apiserver is unreachable = %d %q, want 200", code, body)
	}
	// Past the first retries (1s, 2s): still running, still saying why.
	time.Sleep(3500 * time.Millisecond)
	select {
	case <-a.done:
		t.Fatalf("agent exited with the apiserver unreachable: %v\n%s", a.exit, a.logs())
	default:
	}
	if n := strings.Count(a.logs(), "apiserver probe failed; retrying"); n < 2 {
		t.Errorf("%d failed probes logged, want the retries logged", n)
	}
	start := time.Now()
	if code := a.stop(t); code != 0 {
		t.Fatalf("exit code after SIGTERM while waiting for the apiserver = %d, want 0:\n%s", code, a.logs())
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v to exit after SIGTERM while waiting for the apiserver", d)
	}
}

// lateAPIServer is an apiserver address for the agent's kubeconfig, before the
// apiserver exists. Until up, every connection is closed at once (as an apiserver
// that is not listening yet; the port stays ours). After up, it forwards to a real
// apiserver with that apiserver's credentials, as kubectl proxy does.
type lateAPIServer struct {
	srv   *httptest.Server
	proxy atomic.Pointer[httputil.ReverseProxy]
}

func newLateAPIServer(t *testing.T) *lateAPIServer {
	l := &lateAPIServer{}
	l.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p := l.proxy.Load(); p != nil {
			p.ServeHTTP(w, r)
			return
		}
		if c, _, err := w.(http.Hijacker).Hijack(); err == nil {
			c.Close()
		}
	}))
	t.Cleanup(l.srv.Close)
	return l
}

// up forwards to the apiserver rc reaches from now on.
func (l *lateAPIServer) up(t *testing.T, rc *rest.Config) {
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
	l.proxy.Store(&httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(target) },
		Transport:     rt,
		FlushInterval: -1, // watches stream
	})
}

// TestAgentWaitsForTheAPIServer: the agent starts before the apiserver. It serves
// /livez 200 and /readyz 503 naming the apiserver meanwhile, and turns ready when the
// apiserver comes up, without restarting.
func TestAgentWaitsForTheAPIServer(t *testing.T) {
	skipIfShort(t)
	late := newLateAPIServer(t)
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	testenv.WriteKubeconfig(t, &rest.Config{Host: late.srv.URL}, kubeconfig)

	a := startAgent(t, kubeconfig, filepath.Join(dir, "seen.state"), "--apiserver-timeout=2s")
	testenv.Eventually(t, 20*time.Second, "/readyz to name the apiserver", func() bool {
		code, body := a.get(t, "/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "apiserver unreachable") && strings.Contains(body, late.srv.URL)
	})
	if code, body := a.get(t, "/livez"); code != http.StatusOK {
		t.Fatalf("/livez while the apiserver is not up = %d %q, want 200", code, body)
	}

	cp := testenv.Start(t) // after the agent
	late.up(t, cp.Config)
	// The probe backs off up to 30s between attempts.
	testenv.Eventually(t, 90*time.Second, "/readyz 200 once the apiserver is up", func() bool {
		code, _ := a.get(t, "/readyz")
		return code == http.StatusOK
	})
	select {
	case <-a.done:
		t.Fatalf("agent exited: %v", a.exit)
	default:
	}
	if !strings.Contains(a.logs(), "apiserver probe failed; retrying") || !strings.Contains(a.logs(), "apiserver reachable") {
		t.Errorf("the log does not show the retries and the recovery:\n%s", a.logs())
	}
	if code, body := a.get(t, "/livez"); code != http.StatusOK {
		t.Errorf("/livez = %d %q, want 200", code, body)
	}
	if code := a.stop(t); code != 0 {
		t.Fatalf("exit code after SIGTERM = %d, want 0", code)
	}
}

// TestAgentMalformedOTELResourceAttributes: a malformed OTEL_RESOURCE_ATTRIBUTES
// (which telemetry rejects) does not stop the agent: it logs the problem, runs
// without the variable, becomes ready, and /readyz names what is degraded.
func TestAgentMalformedOTELResourceAttributes(t *testing.T) {
	_, kubeconfig, stateFile := startControlPlane(t)
	a := startAgentEnv(t, []string{"OTEL_RESOURCE_ATTRIBUTES=k8s.cluster.name"}, kubeconfig, stateFile)
	testenv.Eventually(t, 30*time.Second, "/readyz 200", func() bool { code, _ := a.get(t, "/readyz"); return code == http.StatusOK })
	if _, body := a.get(t, "/readyz"); !strings.Contains(body, "degraded: telemetry: OTEL_RESOURCE_ATTRIBUTES ignored") {
		t.Errorf("/readyz does not name the degraded telemetry:\n%s", body)
	}
	if !strings.Contains(a.logs(), "telemetry configuration rejected") || !strings.Contains(a.logs(), "OTEL_RESOURCE_ATTRIBUTES") {
		t.Errorf("the rejected OTEL_RESOURCE_ATTRIBUTES is not logged:\n%s", a.logs())
	}
	if _, body := a.get(t, "/metrics"); !strings.Contains(body, "npagent_") {
		t.Errorf("/metrics serves no npagent metric with degraded telemetry")
	}
	if code := a.stop(t); code != 0 {
		t.Fatalf("exit code after SIGTERM = %d, want 0", code)
	}
}

// skipIfShort skips the tests that build the binary and run a control plane under
// go test -short (make unit).
func skipIfShort(t testing.TB) {
	if testing.Short() {
		t.Skip("-short: integration test builds the agent and runs kube-apiserver and etcd")
	}
}

// TestAgentEBPFWithoutPrivilegesNamesCapabilities runs the binary as an
// unprivileged user with the eBPF dataplane: it must exit 1 and say which
// capabilities it lacks.
func TestAgentEBPFWithoutPrivilegesNamesCapabilities(t *testing.T) {
	skipIfShort(t)
	if !skip.Root() {
		skip.Unmet(t, "needs root to start the agent as an unprivileged user (uid 65534)")
	}
	// A directory the unprivileged user can read and execute from.
	dir, err := os.MkdirTemp("", "npagent-nopriv-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "npagent")
	raw, err := os.ReadFile(buildAgent(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, raw, 0o755); err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	testenv.WriteKubeconfig(t, &rest.Config{Host: "https://127.0.0.1:1", TLSClientConfig: rest.TLSClientConfig{Insecure: true}}, kubeconfig)
	if err := os.Chmod(kubeconfig, 0o644); err != nil {
		t.Fatal(err)
	}

	netlab.HostBPFFS(t) // the host's part: the agent never mounts it
	pinPath := fmt.Sprintf("/sys/fs/bpf/npagent-nopriv-%d", os.Getpid())
	t.Cleanup(func() { os.RemoveAll(pinPath) })
	cmd := exec.Command(bin, "--kubeconfig="+kubeconfig, "--node-ip=10.0.0.1", "--node-name=n",
		"--dataplane=ebpf", "--bpffs-path="+pinPath, "--state-file=", "--metrics-addr=127.0.0.1:0")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("agent started the eBPF dataplane as uid 65534:\n%s", out)
	}
	if code := cmd.ProcessState.ExitCode(); code != 1 {
		t.Errorf("exit code = %d, want 1:\n%s", code, out)
	}
	for _, want := range []string{"CAP_BPF", "CAP_NET_ADMIN", pinPath} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output does not name %s:\n%s", want, out)
		}
	}
}

func sizeOf(fi os.FileInfo) int64 {
	if fi == nil {
		return -1
	}
	return fi.Size()
}
