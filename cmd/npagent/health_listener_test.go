package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// slowReader asks addr for path and reads nothing back: a client on the node's
// network (any pod can reach /metrics) that holds a request in flight. Its receive
// window and segment size are the smallest the kernel allows, so the server's
// write of a response larger than a few segments blocks until its WriteTimeout.
func slowReader(t *testing.T, addr, path string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 1); serr == nil {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_MAXSEG, 536)
			}
		})
		if err != nil {
			return err
		}
		return serr
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("slow reader: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: npagent\r\n\r\n", path); err != nil {
		t.Fatalf("slow reader: %v", err)
	}
	return c
}

// TestProbesOutlastASaturatedMetricsListener: pods can reach /metrics (node traffic
// is exempt from policy) and hold its requests in flight up to its limit; the
// liveness and readiness probes, on a listener of their own, still answer at once.
// The agent waits for an unreachable apiserver, where /livez is 200: any other
// answer is the listener's doing. /metrics is made large (a padded resource
// attribute, as a busy node's exposition is) so that a reader that does not read
// holds its request until the write timeout.
func TestProbesOutlastASaturatedMetricsListener(t *testing.T) {
	skipIfShort(t)
	kubeconfig, _ := deadAPIServer(t)
	pad := strings.Repeat("x", 100<<10)
	a := startAgentEnv(t, []string{"OTEL_RESOURCE_ATTRIBUTES=npagent.test.padding=" + pad},
		kubeconfig, filepath.Join(t.TempDir(), "seen.state"))
	metricsAddr := strings.TrimPrefix(a.url, "http://")

	// Saturate /metrics: httpMaxInFlight slow readers, then check the next scrape is
	// turned away (every slot is taken).
	for range httpMaxInFlight {
		slowReader(t, metricsAddr, "/metrics")
	}
	full := false
	for deadline := time.Now().Add(10 * time.Second); !full && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		resp, err := http.Get(a.url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		full = resp.StatusCode == http.StatusServiceUnavailable
	}
	if !full {
		t.Fatalf("/metrics still served with %d slow readers: the test does not saturate it", httpMaxInFlight)
	}

	// The probes, as the kubelet sends them (a timeout of one second, its default).
	client := &http.Client{Timeout: time.Second}
	for _, p := range []string{"/livez", "/healthz", "/readyz"} {
		start := time.Now()
		resp, err := client.Get(a.healthURL + p)
		if err != nil {
			t.Fatalf("%s with /metrics saturated: %v", p, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		want := http.StatusOK
		if p == "/readyz" {
			want = http.StatusServiceUnavailable // waiting for the apiserver, and saying so
		}
		if resp.StatusCode != want || !strings.Contains(string(body), map[bool]string{true: "ok", false: "apiserver"}[want == http.StatusOK]) {
			t.Errorf("%s with /metrics saturated = %d %q after %v, want %d from the probe itself",
				p, resp.StatusCode, body, time.Since(start).Round(time.Millisecond), want)
		}
	}
	// The health listener's own limiter is the probes' alone.
	if a.healthURL == a.url {
		t.Errorf("the probes are served on the /metrics listener %s", a.url)
	}
}
