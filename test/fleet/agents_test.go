package fleet

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/npagent/npagent/internal/testenv"
	"github.com/npagent/npagent/internal/testenv/skip"
)

// buildAgent builds cmd/npagent into dir.
func buildAgent(t testing.TB, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "npagent")
	cmd := exec.Command("go", "build", "-ldflags", "-X main.version=v0.0.0-fleet", "-o", bin, "./cmd/npagent")
	cmd.Dir = testenv.RepoRoot()
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/npagent: %v\n%s", err, out)
	}
	t.Logf("built %s in %v", bin, time.Since(start).Round(time.Millisecond)) // often most of a small run's time
	return bin
}

// node is one agent's node: its name, IP and local pods (each a veth of its own
// with a host route to the pod's IP, as a CNI makes them).
type node struct {
	name, ip string
	pods     []string
	agent    *agentProcess
}

// nodeIP is the i-th node's IP (10.200.0.0/16: no interface of the host holds it).
func nodeIP(i int) string { return fmt.Sprintf("10.200.%d.%d", i/250, i%250+1) }

// podIP is the j-th local pod of the i-th node (10.201.0.0/16).
func podIP(i, j int) string { return fmt.Sprintf("10.201.%d.%d", i, j+1) }

// addPods gives each node its local pods: a veth per pod, up, with a host route to
// the pod's IP (the route resolver's answer). Root: CAP_NET_ADMIN. Removed at cleanup.
func addPods(t testing.TB, nodes []*node, perNode int) {
	t.Helper()
	if !skip.Root() {
		skip.Unmet(t, "needs root (CAP_NET_ADMIN) to add the host-side interfaces and host routes of the agents' local pods")
	}
	pid := os.Getpid() % 10000
	for i, n := range nodes {
		for j := range perNode {
			la := netlink.NewLinkAttrs()
			la.Name = fmt.Sprintf("nfl%d-%d", pid, i*perNode+j)
			peer := fmt.Sprintf("nfp%d-%d", pid, i*perNode+j)
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: peer}); err != nil {
				t.Fatalf("add veth %s: %v", la.Name, err)
			}
			name := la.Name
			t.Cleanup(func() {
				if l, err := netlink.LinkByName(name); err == nil {
					_ = netlink.LinkDel(l)
				}
			})
			link, err := netlink.LinkByName(name)
			if err != nil {
				t.Fatalf("link %s: %v", name, err)
			}
			if err := netlink.LinkSetUp(link); err != nil {
				t.Fatalf("set %s up: %v", name, err)
			}
			ip := net.ParseIP(podIP(i, j))
			route := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: &net.IPNet{IP: ip, Mask: net.CIDRMask(32, 32)}, Scope: netlink.SCOPE_LINK}
			if err := netlink.RouteAdd(route); err != nil {
				t.Fatalf("add route %s dev %s: %v", route.Dst, name, err)
			}
			n.pods = append(n.pods, ip.String())
		}
	}
}

// agentProcess is one running agent.
type agentProcess struct {
	cmd       *exec.Cmd
	metrics   string // base URL of /metrics
	health    string // base URL of /readyz
	addrs     chan [2]string
	done      chan struct{}
	exit      error
	mu        sync.Mutex
	tail      []string // the last lines of its log
	errorLogs int
	errorMsgs map[string]int // by message
}

const logTail = 60

// startAgent runs bin as n's agent with args, env added to its environment; it
// returns at once (waitHTTP waits for its listeners).
func startAgent(t testing.TB, bin string, env, args []string) *agentProcess {
	t.Helper()
	a := &agentProcess{cmd: exec.Command(bin, args...), addrs: make(chan [2]string, 1), done: make(chan struct{})}
	a.cmd.Env = append(os.Environ(), env...)
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
			_ = a.cmd.Process.Kill()
			<-a.done
		}
	})
	return a
}

func (a *agentProcess) pid() int { return a.cmd.Process.Pid }

// scan keeps the tail of the agent's log, counts its errors and picks the HTTP
// addresses out of it.
func (a *agentProcess) scan(r io.Reader) {
	var metrics, health string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		var rec struct{ Msg, Addr, Level string }
		_ = json.Unmarshal([]byte(line), &rec)
		a.mu.Lock()
		if a.tail = append(a.tail, line); len(a.tail) > logTail {
			a.tail = a.tail[1:]
		}
		if rec.Level == "ERROR" {
			a.errorLogs++
			if a.errorMsgs == nil {
				a.errorMsgs = map[string]int{}
			}
			a.errorMsgs[rec.Msg]++
		}
		a.mu.Unlock()
		switch rec.Msg {
		case "serving /metrics":
			metrics = rec.Addr
		case "serving /livez, /healthz and /readyz":
			health = rec.Addr
		case "serving /metrics, /livez, /healthz and /readyz":
			metrics, health = rec.Addr, rec.Addr
		}
		if metrics != "" && health != "" {
			a.addrs <- [2]string{metrics, health}
			metrics, health = "", "-" // once
		}
	}
	a.exit = a.cmd.Wait()
	close(a.done)
}

func (a *agentProcess) logs() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return strings.Join(a.tail, "\n")
}

func (a *agentProcess) errors() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.errorLogs
}

// errorMessages adds the agent's ERROR lines, counted by message, to into.
func (a *agentProcess) errorMessages(into map[string]int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for m, n := range a.errorMsgs {
		into[m] += n
	}
}

// waitHTTP waits until the agent logs where it serves /metrics and the probes.
func (a *agentProcess) waitHTTP(t testing.TB) {
	t.Helper()
	select {
	case addrs := <-a.addrs:
		a.metrics, a.health = "http://"+addrs[0], "http://"+addrs[1]
	case <-a.done:
		t.Fatalf("agent exited before serving HTTP: %v\n%s", a.exit, a.logs())
	case <-time.After(2 * time.Minute):
		t.Fatalf("agent did not serve HTTP within 2m:\n%s", a.logs())
	}
}

var httpClient = &http.Client{Timeout: 10 * time.Second}

// ready reports whether the agent's /readyz answers 200.
func (a *agentProcess) ready() bool {
	resp, err := httpClient.Get(a.health + "/readyz")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode == http.StatusOK
}

// metric sums the samples of name whose labels hold every one of labels, from the
// agent's /metrics; -1 when it cannot be read.
func (a *agentProcess) metric(name string, labels ...string) float64 {
	return scrapeSum(a.metrics+"/metrics", name, labels...)
}

// scrapeSum sums the samples of name whose labels hold every one of labels, from the
// Prometheus text at url; -1 when it cannot be read.
func scrapeSum(url, name string, labels ...string) float64 {
	resp, err := httpClient.Get(url)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return -1
	}
	return testenv.SumSamples(string(body), name, labels...)
}
