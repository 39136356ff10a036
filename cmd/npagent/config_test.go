package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/reconcile"
	"github.com/npagent/npagent/internal/telemetry"
	"k8s.io/klog/v2"
)

// envMap is a getenv over a fixed map, so tests never read the process environment.
func envMap(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestParseConfigDefaults(t *testing.T) {
	c, err := parseConfig(nil, envMap(map[string]string{"NODE_IP": "10.0.0.5", "NODE_NAME": "node-a"}), &bytes.Buffer{})
	if err != nil {
		t.Fatalf("parseConfig: %v", err)
	}
	want := config{
		NodeName:              "node-a",
		NodeIP:                netip.MustParseAddr("10.0.0.5"),
		Dataplane:             dataplaneEBPF,
		BPFFSPath:             bpfmaps.DefaultPinPath,
		StateFile:             "/var/lib/npagent/seen.state",
		TriggerAnnotation:     v1alpha1.AnnotationLastChangeTriggerTime,
		TraceParentAnnotation: v1alpha1.AnnotationTraceParent,
		TraceParenting:        telemetry.ParentingLink, // KEP-5915: a span link, not a parent
		ResyncPeriod:          10 * time.Minute,
		Workers:               2,
		MetricsAddr:           "10.0.0.5:9090",  // the node IP, not every interface
		HealthAddr:            "127.0.0.1:9438", // loopback: out of the pods' reach
		StallTimeout:          2 * time.Minute,
		WatchStallTimeout:     time.Minute,
		APIServerTimeout:      10 * time.Second,
		ShutdownTimeout:       10 * time.Second,
		LogLevel:              slog.LevelInfo,
		LogFormat:             "text",
		FastTraceFraction:     1,
		MaxEntriesPerObject:   16384,
		MapEntriesV4:          bpfmaps.DefaultEntriesV4,
		MapEntriesV6:          bpfmaps.DefaultEntriesV6,
		NamespaceEntryShare:   50, // percent: half of each trie stays for the other namespaces
		ConntrackEntries:      bpfmaps.DefaultConntrackEntries,
		VerdictSeriesLimit:    telemetry.DefaultVerdictSeriesLimit,
		MaxTriggerSkew:        5 * time.Second,
		WatermarkMaxAge:       time.Hour,
		DebugSocket:           "/run/npagent/debug.sock",
		EnforcingMode:         reconcile.EnforcingStandard, // as the AWS agent: open until programmed
		PodConditionQPS:       5,                           // the condition itself is off unless asked for (the chart does)
		FlowEvents:            bpfmaps.FlowEventsDeny,      // denials reported, rate-limited per pod
		FlowEventsRate:        100,
		FlowEventsBurst:       200,
		FlowLogMaxSize:        10, // the file itself is off unless asked for
		FlowLogMaxFiles:       5,
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("defaults:\n got %+v\nwant %+v", c, want)
	}
}

func TestParseConfigEnvFallbackAndFlagPrecedence(t *testing.T) {
	env := map[string]string{
		"KUBECONFIG":                      "/etc/kube/config",
		"NODE_NAME":                       "env-node",
		"NODE_IP":                         "10.0.0.5",
		"NPAGENT_DATAPLANE":               "memory",
		"NPAGENT_BPFFS_PATH":              "/sys/fs/bpf/other",
		"NPAGENT_STATE_FILE":              "/tmp/state",
		"NPAGENT_TRIGGER_ANNOTATION":      "example.com/trigger",
		"NPAGENT_TRACEPARENT_ANNOTATION":  "example.com/tp",
		"NPAGENT_TRACE_PARENTING":         "child",
		"NPAGENT_RESYNC_PERIOD":           "30s",
		"NPAGENT_WORKERS":                 "4",
		"NPAGENT_METRICS_ADDR":            "127.0.0.1:9999",
		"NPAGENT_HEALTH_ADDR":             "[::1]:9998",
		"NPAGENT_STALL_TIMEOUT":           "45s",
		"NPAGENT_WATCH_STALL_TIMEOUT":     "90s",
		"NPAGENT_APISERVER_TIMEOUT":       "3s",
		"NPAGENT_SHUTDOWN_TIMEOUT":        "4s",
		"NPAGENT_LOG_LEVEL":               "debug",
		"NPAGENT_LOG_FORMAT":              "json",
		"NPAGENT_SLOW_TRACE_THRESHOLD":    "250ms",
		"NPAGENT_FAST_TRACE_FRACTION":     "0.1",
		"NPAGENT_DROP_FQDN_ALLOW_RULES":   "true",
		"NPAGENT_AUDIT_MODE":              "true",
		"NPAGENT_MAX_ENTRIES_PER_OBJECT":  "500",
		"NPAGENT_MAX_ENTRIES_IPV4":        "1024",
		"NPAGENT_MAX_ENTRIES_IPV6":        "512",
		"NPAGENT_NAMESPACE_ENTRY_SHARE":   "12.5",
		"NPAGENT_CONNTRACK_ENTRIES":       "1024",
		"NPAGENT_VERDICT_SERIES_LIMIT":    "300",
		"NPAGENT_MAX_TRIGGER_SKEW":        "2s",
		"NPAGENT_WATERMARK_MAX_AGE":       "30m",
		"NPAGENT_DEBUG_SOCKET":            "/run/other/debug.sock",
		"NPAGENT_NODE_CIDRS":              "169.254.20.10/32, fd00:10::/64,10.9.8.7/24",
		"NPAGENT_POD_INTERFACE_PREFIXES":  "eni, vlan,",
		"NPAGENT_NODE_ADDRESS_INTERFACES": "cilium_host, veth*",
		"NPAGENT_ENFORCING_MODE":          "strict",
		"NPAGENT_NODE_EGRESS":             "policy",
		"NPAGENT_POD_CONDITION":           "true",
		"NPAGENT_POD_CONDITION_QPS":       "2.5",
		"NPAGENT_FLOW_EVENTS":             "all",
		"NPAGENT_FLOW_EVENTS_RATE":        "20",
		"NPAGENT_FLOW_EVENTS_BURST":       "40",
		"NPAGENT_FLOW_LOG_FILE":           "/var/log/npagent/flows.log",
		"NPAGENT_FLOW_LOG_MAX_SIZE":       "50",
		"NPAGENT_FLOW_LOG_MAX_FILES":      "3",
		"NPAGENT_RELAY_URL":               "https://npagent-relay.npagent.svc:443",
		"NPAGENT_RELAY_CA":                "/etc/npagent/relay-ca/ca.crt",
	}
	// Every flag has a variable, and the table above covers each of them.
	for flagName, v := range flagEnv {
		if _, ok := env[v]; !ok {
			t.Errorf("--%s: its variable $%s is not exercised by this test", flagName, v)
		}
	}

	c, err := parseConfig(nil, envMap(env), &bytes.Buffer{})
	if err != nil {
		t.Fatalf("parseConfig from environment: %v", err)
	}
	want := config{
		Kubeconfig:            "/etc/kube/config",
		NodeName:              "env-node",
		NodeIP:                netip.MustParseAddr("10.0.0.5"),
		Dataplane:             dataplaneMemory,
		BPFFSPath:             "/sys/fs/bpf/other",
		StateFile:             "/tmp/state",
		TriggerAnnotation:     "example.com/trigger",
		TraceParentAnnotation: "example.com/tp",
		TraceParenting:        telemetry.ParentingChild,
		ResyncPeriod:          30 * time.Second,
		Workers:               4,
		MetricsAddr:           "127.0.0.1:9999",
		HealthAddr:            "[::1]:9998",
		StallTimeout:          45 * time.Second,
		WatchStallTimeout:     90 * time.Second,
		APIServerTimeout:      3 * time.Second,
		ShutdownTimeout:       4 * time.Second,
		LogLevel:              slog.LevelDebug,
		LogFormat:             "json",
		SlowTraceThreshold:    250 * time.Millisecond,
		FastTraceFraction:     0.1,
		DropFQDNAllowRules:    true,
		AuditMode:             true,
		MaxEntriesPerObject:   500,
		MapEntriesV4:          1024,
		MapEntriesV6:          512,
		NamespaceEntryShare:   12.5,
		ConntrackEntries:      1024,
		VerdictSeriesLimit:    300,
		MaxTriggerSkew:        2 * time.Second,
		WatermarkMaxAge:       30 * time.Minute,
		DebugSocket:           "/run/other/debug.sock",
		NodeCIDRs: []netip.Prefix{netip.MustParsePrefix("169.254.20.10/32"), netip.MustParsePrefix("fd00:10::/64"),
			netip.MustParsePrefix("10.9.8.0/24")}, // masked
		PodInterfacePrefixes: []string{"eni", "vlan"},
		NodeAddrInterfaces:   []string{"cilium_host", "veth*"},
		EnforcingMode:        reconcile.EnforcingStrict,
		NodeEgress:           bpfmaps.NodeEgressPolicy,
		PodCondition:         true,
		PodConditionQPS:      2.5,
		FlowEvents:           bpfmaps.FlowEventsAll,
		FlowEventsRate:       20,
		FlowEventsBurst:      40,
		FlowLogFile:          "/var/log/npagent/flows.log",
		FlowLogMaxSize:       50,
		FlowLogMaxFiles:      3,
		RelayURL:             "https://npagent-relay.npagent.svc:443",
		RelayCA:              "/etc/npagent/relay-ca/ca.crt",
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("from environment:\n got %+v\nwant %+v", c, want)
	}

	// A flag on the command line wins over its variable.
	c, err = parseConfig([]string{"--node-ip=192.0.2.1", "--workers=7", "--state-file=", "--dataplane=ebpf"}, envMap(env), &bytes.Buffer{})
	if err != nil {
		t.Fatalf("parseConfig with flags: %v", err)
	}
	if c.NodeIP != netip.MustParseAddr("192.0.2.1") || c.Workers != 7 || c.StateFile != "" || c.Dataplane != dataplaneEBPF {
		t.Errorf("flags did not win over the environment: %+v", c)
	}
	if c.NodeName != "env-node" {
		t.Errorf("node name = %q, want env-node from $NODE_NAME", c.NodeName)
	}
}

func TestParseConfigRejectsBadValuesNamingTheFlag(t *testing.T) {
	base := map[string]string{"NODE_IP": "10.0.0.5", "NODE_NAME": "n"}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want []string // substrings of the error
	}{
		{"missing node ip", nil, map[string]string{"NODE_IP": ""}, []string{"--node-ip", "NODE_IP", "required"}},
		{"bad node ip", []string{"--node-ip=10.0.0"}, nil, []string{"--node-ip", `"10.0.0"`}},
		{"bad dataplane", []string{"--dataplane=xdp"}, nil, []string{"--dataplane", `"xdp"`}},
		{"empty bpffs path", []string{"--bpffs-path="}, nil, []string{"--bpffs-path"}},
		{"empty trigger annotation", []string{"--trigger-annotation="}, nil, []string{"--trigger-annotation"}},
		{"negative resync", []string{"--resync-period=-1s"}, nil, []string{"--resync-period", "negative"}},
		{"zero workers", []string{"--workers=0"}, nil, []string{"--workers"}},
		{"zero entries per object", []string{"--max-entries-per-object=0"}, nil, []string{"--max-entries-per-object"}},
		{"zero IPv4 map entries", []string{"--max-entries-ipv4=0"}, nil, []string{"--max-entries-ipv4"}},
		{"negative IPv6 map entries", []string{"--max-entries-ipv6=-1"}, nil, []string{"--max-entries-ipv6"}},
		{"namespace share above 100%", []string{"--namespace-entry-share=150"}, nil, []string{"--namespace-entry-share", "150", "from 0 to 100"}},
		{"negative namespace share", nil, map[string]string{"NPAGENT_NAMESPACE_ENTRY_SHARE": "-5"}, []string{"--namespace-entry-share", "-5"}},
		{"NaN namespace share", []string{"--namespace-entry-share=NaN"}, nil, []string{"--namespace-entry-share", "NaN"}},
		{"no connection table entries", []string{"--conntrack-entries=0"}, nil, []string{"--conntrack-entries"}},
		{"no verdict series", []string{"--verdict-series-limit=0"}, nil, []string{"--verdict-series-limit"}},
		{"bad flow events", []string{"--flow-events=some"}, nil, []string{"--flow-events", `"some"`}},
		{"negative flow event rate", nil, map[string]string{"NPAGENT_FLOW_EVENTS_RATE": "-1"}, []string{"--flow-events-rate", "-1"}},
		{"no flow event burst", []string{"--flow-events-burst=0"}, nil, []string{"--flow-events-burst"}},
		{"relative flow log file", []string{"--flow-log-file=flows.log"}, nil, []string{"--flow-log-file", "absolute"}},
		{"no flow log size", []string{"--flow-log-max-size=0"}, nil, []string{"--flow-log-max-size"}},
		{"no flow log files", []string{"--flow-log-max-files=0"}, nil, []string{"--flow-log-max-files"}},
		{"bad metrics addr", []string{"--metrics-addr=9090"}, nil, []string{"--metrics-addr", `"9090"`}},
		{"bad health addr", []string{"--health-addr=9438"}, nil, []string{"--health-addr", `"9438"`}},
		{"health addr shared with metrics", []string{"--health-addr=127.0.0.1:9437", "--metrics-addr=127.0.0.1:9437"}, nil, []string{"--health-addr", "listener of their own"}},
		{"zero stall timeout", []string{"--stall-timeout=0s"}, nil, []string{"--stall-timeout"}},
		{"zero watch stall timeout", []string{"--watch-stall-timeout=0s"}, nil, []string{"--watch-stall-timeout"}},
		{"zero apiserver timeout", []string{"--apiserver-timeout=0s"}, nil, []string{"--apiserver-timeout"}},
		{"zero shutdown timeout", []string{"--shutdown-timeout=0s"}, nil, []string{"--shutdown-timeout"}},
		{"bad log level", []string{"--log-level=loud"}, nil, []string{"--log-level", `"loud"`}},
		{"bad log format", []string{"--log-format=xml"}, nil, []string{"--log-format", `"xml"`}},
		{"bad trace parenting", []string{"--trace-parenting=parent"}, nil, []string{"--trace-parenting", `"parent"`}},
		{"negative slow threshold", []string{"--slow-trace-threshold=-1ms"}, nil, []string{"--slow-trace-threshold"}},
		{"fraction above one", []string{"--fast-trace-fraction=1.5"}, nil, []string{"--fast-trace-fraction", "0..1"}},
		{"fraction NaN", []string{"--fast-trace-fraction=NaN"}, nil, []string{"--fast-trace-fraction"}},
		{"unparsable flag", []string{"--workers=many"}, nil, []string{"-workers"}},
		{"unknown flag", []string{"--no-such-flag"}, nil, []string{"no-such-flag"}},
		{"positional argument", []string{"start"}, nil, []string{`"start"`}},
		{"bad env duration", nil, map[string]string{"NPAGENT_RESYNC_PERIOD": "soon"}, []string{"--resync-period", "$NPAGENT_RESYNC_PERIOD", `"soon"`}},
		{"bad env int", nil, map[string]string{"NPAGENT_WORKERS": "x"}, []string{"--workers", "$NPAGENT_WORKERS"}},
		{"bad env ip", nil, map[string]string{"NODE_IP": "nope"}, []string{"--node-ip", `"nope"`}},
		{"bad node cidr", []string{"--node-cidrs=10.0.0.0/8,10.1.2.3"}, nil, []string{"--node-cidrs", `"10.1.2.3"`}},
		{"bad enforcing mode", []string{"--enforcing-mode=Strict"}, nil, []string{"--enforcing-mode", `"Strict"`, "standard or strict"}},
		{"empty enforcing mode", []string{"--enforcing-mode="}, nil, []string{"--enforcing-mode", `""`}},
		{"bad env enforcing mode", nil, map[string]string{"NPAGENT_ENFORCING_MODE": "deny"}, []string{"--enforcing-mode", `"deny"`}},
		{"bad node egress", []string{"--node-egress=deny"}, nil, []string{"node-egress", `"deny"`, "allow or policy"}},
		{"bad env node egress", nil, map[string]string{"NPAGENT_NODE_EGRESS": "Policy"}, []string{"--node-egress", "NPAGENT_NODE_EGRESS", `"Policy"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := map[string]string{}
			for k, v := range base {
				env[k] = v
			}
			for k, v := range tt.env { // "" removes a base variable
				env[k] = v
			}
			_, err := parseConfig(tt.args, envMap(env), &bytes.Buffer{})
			if err == nil {
				t.Fatalf("parseConfig(%q) accepted a bad value", tt.args)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestParseConfigReportsEveryBadFlagAtOnce(t *testing.T) {
	_, err := parseConfig([]string{"--workers=0", "--log-format=xml", "--dataplane=x"},
		envMap(map[string]string{"NODE_IP": "10.0.0.5", "NODE_NAME": "n"}), &bytes.Buffer{})
	for _, f := range []string{"--workers", "--log-format", "--dataplane"} {
		if err == nil || !strings.Contains(err.Error(), f) {
			t.Errorf("error %v does not name %s", err, f)
		}
	}
}

func TestHelpListsFlagsWithTheirVariables(t *testing.T) {
	var usage bytes.Buffer
	_, err := parseConfig([]string{"--help"}, envMap(nil), &usage)
	if !errors.Is(err, errHelp) {
		t.Fatalf("--help: err = %v, want flag.ErrHelp", err)
	}
	if exitCode(err) != 0 {
		t.Errorf("--help exit code = %d, want 0", exitCode(err))
	}
	for flagName, v := range flagEnv {
		if !strings.Contains(usage.String(), "--"+flagName+" ["+v+"]") {
			t.Errorf("usage does not list --%s [%s]:\n%s", flagName, v, usage.String())
		}
	}
}

func TestRunRejectsBadFlagsWithUsageError(t *testing.T) {
	var stderr bytes.Buffer
	err := run(context.Background(), []string{"--dataplane=xdp", "--node-ip=10.0.0.1"}, envMap(nil), &bytes.Buffer{}, &stderr)
	var ue usageError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "--dataplane") {
		t.Fatalf("run: err = %v, want a usageError naming --dataplane", err)
	}
	if got := exitCode(err); got != 2 {
		t.Errorf("exit code = %d, want 2", got)
	}
}

func TestVersionCommand(t *testing.T) {
	var stdout bytes.Buffer
	if err := run(context.Background(), []string{"version"}, envMap(nil), &stdout, &bytes.Buffer{}); err != nil {
		t.Fatalf("version: %v", err)
	}
	if got, want := stdout.String(), "npagent "+agentVersion()+"\n"; got != want || agentVersion() == "" {
		t.Errorf("version printed %q, want %q", got, want)
	}

	old := version
	version = "v9.9.9-test"
	defer func() { version = old }()
	stdout.Reset()
	if err := run(context.Background(), []string{"version"}, envMap(nil), &stdout, &bytes.Buffer{}); err != nil {
		t.Fatalf("version: %v", err)
	}
	if got := stdout.String(); got != "npagent v9.9.9-test\n" {
		t.Errorf("with -X main.version: printed %q", got)
	}
}

func TestMetricsAddrDefaultsToTheNodeIP(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"IPv4 node", nil, map[string]string{"NODE_IP": "10.0.0.5"}, "10.0.0.5:9090"},
		{"IPv6 node", nil, map[string]string{"NODE_IP": "fd00::5"}, "[fd00::5]:9090"},
		{"IPv4-mapped node", []string{"--node-ip=::ffff:10.0.0.6"}, nil, "10.0.0.6:9090"},
		{"explicit empty flag", []string{"--metrics-addr="}, map[string]string{"NODE_IP": "10.0.0.5"}, "10.0.0.5:9090"},
		{"every interface, explicitly", []string{"--metrics-addr=:9090"}, map[string]string{"NODE_IP": "10.0.0.5"}, ":9090"},
		{"localhost", nil, map[string]string{"NODE_IP": "10.0.0.5", "NPAGENT_METRICS_ADDR": "127.0.0.1:9437"}, "127.0.0.1:9437"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			env := map[string]string{"NODE_NAME": "n"}
			for k, v := range tt.env {
				env[k] = v
			}
			c, err := parseConfig(tt.args, envMap(env), &bytes.Buffer{})
			if err != nil {
				t.Fatalf("parseConfig: %v", err)
			}
			if c.MetricsAddr != tt.want {
				t.Errorf("metrics addr = %q, want %q", c.MetricsAddr, tt.want)
			}
		})
	}
}

func TestHTTPServerBounds(t *testing.T) {
	for name, srv := range map[string]*http.Server{"metrics": newHTTPServer(http.NotFoundHandler(), nil), "health": newHealthServer(http.NotFoundHandler(), nil)} {
		for _, tt := range []struct {
			name string
			got  time.Duration
		}{
			{"ReadHeaderTimeout", srv.ReadHeaderTimeout},
			{"ReadTimeout", srv.ReadTimeout},
			{"WriteTimeout", srv.WriteTimeout},
			{"IdleTimeout", srv.IdleTimeout},
		} {
			if tt.got <= 0 || tt.got > time.Minute {
				t.Errorf("%s: %s = %v, want set, at most a minute", name, tt.name, tt.got)
			}
		}
		if srv.ReadHeaderTimeout > srv.ReadTimeout {
			t.Errorf("%s: ReadHeaderTimeout %v > ReadTimeout %v", name, srv.ReadHeaderTimeout, srv.ReadTimeout)
		}
		if srv.MaxHeaderBytes <= 0 || srv.MaxHeaderBytes > 64<<10 {
			t.Errorf("%s: MaxHeaderBytes = %d, want a small bound", name, srv.MaxHeaderBytes)
		}
	}
}

// TestHTTPServerLimitsRequestsInFlight holds httpMaxInFlight requests in a handler
// and checks the next one is answered 503 at once, and served again once one ends.
func TestHTTPServerLimitsRequestsInFlight(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, httpMaxInFlight)
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			entered <- struct{}{}
			<-release
		}
		w.Write([]byte("ok"))
	})
	ts := httptest.NewUnstartedServer(nil)
	ts.Config = newHTTPServer(slow, nil)
	ts.Start()
	defer ts.Close()

	done := make(chan int, httpMaxInFlight)
	for range httpMaxInFlight {
		go func() {
			resp, err := http.Get(ts.URL + "/slow")
			if err != nil {
				done <- -1
				return
			}
			resp.Body.Close()
			done <- resp.StatusCode
		}()
	}
	for range httpMaxInFlight {
		select {
		case <-entered:
		case <-time.After(10 * time.Second):
			t.Fatal("the slow requests did not all reach the handler")
		}
	}
	resp, err := http.Get(ts.URL + "/fast")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("request beyond %d in flight = %d (Retry-After %q), want 503 with Retry-After",
			httpMaxInFlight, resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	close(release)
	for range httpMaxInFlight {
		if code := <-done; code != http.StatusOK {
			t.Errorf("held request = %d, want 200", code)
		}
	}
	resp, err = http.Get(ts.URL + "/fast")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("after the held requests ended = %d, want 200", resp.StatusCode)
	}
}

func TestHTTPHandler(t *testing.T) {
	var liveErr error
	var readyErr error = errors.New("informer caches not synced yet")
	var notes []string
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("npagent_metric 1\n")) })
	h := newHealthHandler(func() error { return liveErr }, func() ([]string, error) { return notes, readyErr })
	m := newMetricsHandler(metrics)

	serve := func(h http.Handler, path string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code, rec.Body.String()
	}
	get := func(path string) (int, string) { return serve(h, path) }
	for _, p := range []string{"/livez", "/healthz"} {
		if code, _ := get(p); code != http.StatusOK {
			t.Errorf("%s = %d, want 200", p, code)
		}
	}
	if code, body := get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "informer caches not synced") {
		t.Errorf("/readyz before sync = %d %q, want 503 with the reason", code, body)
	}
	readyErr = nil
	if code, _ := get("/readyz"); code != http.StatusOK {
		t.Errorf("/readyz when ready = %d, want 200", code)
	}
	notes = []string{"telemetry: OTEL_RESOURCE_ATTRIBUTES ignored"}
	if code, body := get("/readyz"); code != http.StatusOK || !strings.Contains(body, "degraded: telemetry: OTEL_RESOURCE_ATTRIBUTES ignored") {
		t.Errorf("/readyz when ready and degraded = %d %q, want 200 naming what is degraded", code, body)
	}
	liveErr = errors.New("worker slot 0: one sync in flight for 3m0s")
	for _, p := range []string{"/livez", "/healthz"} {
		if code, body := get(p); code != http.StatusInternalServerError || !strings.Contains(body, "one sync in flight") {
			t.Errorf("%s when stalled = %d %q, want 500 with the reason", p, code, body)
		}
	}
	if code, body := serve(m, "/metrics"); code != http.StatusOK || body != "npagent_metric 1\n" {
		t.Errorf("/metrics = %d %q, want the metrics handler's answer", code, body)
	}
	// Each listener serves only its own paths.
	for _, tt := range []struct {
		h    http.Handler
		path string
	}{{h, "/metrics"}, {h, "/other"}, {m, "/livez"}, {m, "/readyz"}, {m, "/other"}} {
		if code, _ := serve(tt.h, tt.path); code != http.StatusNotFound {
			t.Errorf("%s = %d, want 404", tt.path, code)
		}
	}
}

// client-go's own logs (klog) reach the agent's structured log, tagged, in its
// format: a reflector's watch error is a JSON line an operator's pipeline parses.
func TestClientGoLogsRoutedIntoTheAgentLog(t *testing.T) {
	var buf bytes.Buffer
	routeClientGoLogs(newLogger(config{LogLevel: slog.LevelInfo, LogFormat: "json"}, &buf))
	t.Cleanup(func() { klog.ClearLogger() })
	klog.ErrorS(errors.New("connection refused"), "Failed to watch", "reflector", "example")
	klog.Flush()
	line := buf.String()
	for _, want := range []string{`"component":"client-go"`, `"msg":"Failed to watch"`, `connection refused`, `"level":"ERROR"`} {
		if !strings.Contains(line, want) {
			t.Errorf("agent log %q lacks %s", line, want)
		}
	}
}

// TestParseConfigEnforcingMode: --enforcing-mode reaches the config from the flag or
// $NPAGENT_ENFORCING_MODE, the flag winning.
func TestParseConfigFlowEvents(t *testing.T) {
	env := map[string]string{"NODE_IP": "10.0.0.5", "NODE_NAME": "n", "NPAGENT_FLOW_EVENTS": "all", "NPAGENT_FLOW_LOG_FILE": "/var/log/npagent/flows.log"}
	c, err := parseConfig([]string{"--flow-events-rate=5", "--flow-events-burst=10", "--flow-log-max-files=2"}, envMap(env), &bytes.Buffer{})
	if err != nil {
		t.Fatalf("parseConfig: %v", err)
	}
	if c.FlowEvents != bpfmaps.FlowEventsAll || c.FlowEventsRate != 5 || c.FlowEventsBurst != 10 || c.FlowLogFile != "/var/log/npagent/flows.log" ||
		c.FlowLogMaxFiles != 2 {
		t.Errorf("flow events config %v rate %v burst %d file %q files %d", c.FlowEvents, c.FlowEventsRate, c.FlowEventsBurst, c.FlowLogFile, c.FlowLogMaxFiles)
	}
	if c, err := parseConfig([]string{"--flow-events=off"}, envMap(env), &bytes.Buffer{}); err != nil || c.FlowEvents != bpfmaps.FlowEventsOff {
		t.Errorf("--flow-events=off over the environment: %v, %v", c.FlowEvents, err)
	}
}

func TestParseConfigEnforcingMode(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  string
		want reconcile.EnforcingMode
	}{
		{"default", nil, "", reconcile.EnforcingStandard},
		{"flag strict", []string{"--enforcing-mode=strict"}, "", reconcile.EnforcingStrict},
		{"env strict", nil, "strict", reconcile.EnforcingStrict},
		{"flag over env", []string{"--enforcing-mode=standard"}, "strict", reconcile.EnforcingStandard},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := map[string]string{"NODE_IP": "10.0.0.5", "NODE_NAME": "n", "NPAGENT_ENFORCING_MODE": tt.env}
			c, err := parseConfig(tt.args, envMap(env), &bytes.Buffer{})
			if err != nil {
				t.Fatalf("parseConfig: %v", err)
			}
			if c.EnforcingMode != tt.want {
				t.Errorf("enforcing mode = %q, want %q", c.EnforcingMode, tt.want)
			}
		})
	}
}
