package otlptest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/npagent/npagent/internal/testenv"
)

// Collector is a running otelcol process.
type Collector struct {
	// GRPCAddr is where its OTLP/gRPC receiver listens (host:port).
	GRPCAddr string
	// HTTPAddr is where its OTLP/HTTP receiver listens (host:port; paths
	// /v1/traces and /v1/metrics), or "" when its config has none.
	HTTPAddr string

	tb     testing.TB
	bin    string
	config string
	env    []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	logs *testenv.LogBuffer
}

// StartCollector runs a collector that forwards traces, metrics and logs from an
// OTLP receiver, gRPC and HTTP each on a free loopback port, to sinkURL
// (otlp_http, sending queue off), and waits until both listen. It is killed at
// cleanup.
func StartCollector(tb testing.TB, sinkURL string) *Collector {
	tb.Helper()
	addr, httpAddr := FreeLoopbackAddr(tb), FreeLoopbackAddr(tb)
	cfg := fmt.Sprintf(`receivers:
  otlp:
    protocols:
      grpc:
        endpoint: %s
      http:
        endpoint: %s
exporters:
  otlp_http:
    endpoint: %s
    sending_queue:
      enabled: false
service:
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [otlp_http]
    metrics:
      receivers: [otlp]
      exporters: [otlp_http]
    logs:
      receivers: [otlp]
      exporters: [otlp_http]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
`, addr, httpAddr, sinkURL)
	path := filepath.Join(tb.TempDir(), "otelcol.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		tb.Fatal(err)
	}
	return runCollector(tb, path, addr, httpAddr)
}

// RunCollector runs a collector with the config file at path, whose OTLP/gRPC
// receiver listens on grpcAddr, with env (KEY=VALUE) added to its environment,
// and waits until it listens. It is killed at cleanup.
func RunCollector(tb testing.TB, path, grpcAddr string, env ...string) *Collector {
	tb.Helper()
	return runCollector(tb, path, grpcAddr, "", env...)
}

func runCollector(tb testing.TB, path, grpcAddr, httpAddr string, env ...string) *Collector {
	tb.Helper()
	c := &Collector{GRPCAddr: grpcAddr, HTTPAddr: httpAddr, tb: tb, bin: testenv.ToolPath(tb, "otelcol"), config: path, env: env}
	c.Start()
	tb.Cleanup(c.Kill)
	return c
}

// Start starts the collector again after Kill and waits until its receivers
// listen.
func (c *Collector) Start() {
	c.tb.Helper()
	c.mu.Lock()
	c.logs = &testenv.LogBuffer{}
	c.cmd = exec.Command(c.bin, "--config", c.config)
	c.cmd.Env = append(os.Environ(), c.env...)
	c.cmd.Stdout, c.cmd.Stderr = c.logs, c.logs
	err := c.cmd.Start()
	c.mu.Unlock()
	if err != nil {
		c.tb.Fatalf("start collector: %v", err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for _, addr := range []string{c.GRPCAddr, c.HTTPAddr} {
		for addr != "" {
			conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
			if err == nil {
				conn.Close()
				break
			}
			if time.Now().After(deadline) {
				logs := c.Logs()
				c.Kill()
				c.tb.Fatalf("collector did not listen on %s within 60s; its output:\n%s", addr, logs)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// Kill stops the collector with SIGKILL: the outage a crash causes, no drain.
func (c *Collector) Kill() {
	c.mu.Lock()
	cmd := c.cmd
	c.cmd = nil
	c.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
}

// Logs is what the collector (since its last Start) wrote to stdout and stderr.
func (c *Collector) Logs() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.logs == nil {
		return ""
	}
	return c.logs.String()
}

// FreeLoopbackAddr is a 127.0.0.1 address with a port free at the time of the call.
func FreeLoopbackAddr(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
