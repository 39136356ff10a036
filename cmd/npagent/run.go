package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/explain"
	"github.com/npagent/npagent/internal/nodeaddrs"
	"github.com/npagent/npagent/internal/podif"
	"github.com/npagent/npagent/internal/reconcile"
	"github.com/npagent/npagent/internal/relay"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/seen"
	"github.com/npagent/npagent/internal/telemetry"
	"github.com/npagent/npagent/internal/translate"
)

// usageError is a bad command line or environment: main exits 2 for it.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// loggedError is an error run already wrote to the agent's log, in its format
// (--log-format=json: a JSON line too): main exits with code and prints nothing.
type loggedError struct {
	code int
	err  error
}

func (e loggedError) Error() string { return e.err.Error() }
func (e loggedError) Unwrap() error { return e.err }

// run is the whole agent: it parses args (falling back to getenv), starts every
// part, blocks until ctx is done, then shuts down in order — stop taking work,
// finish the commit in flight, persist the seen-set, flush telemetry — and returns
// nil. It returns a usageError for a bad command line, flag.ErrHelp after printing
// usage, and any other error when the agent could not start for a local, certain
// cause (a port in use, no privileges for eBPF) or failed. What may heal by itself
// does not end it: it waits for the apiserver and the CRDs (waitForAPIServer), and
// runs with degraded telemetry when OTEL_* is malformed (openTelemetry).
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "version":
			fmt.Fprintf(stdout, "npagent %s\n", agentVersion())
			return nil
		case "explain":
			return runExplain(ctx, args[1:], getenv, stdout, stderr)
		case "wait":
			return runWait(ctx, args[1:], getenv, stdout, stderr)
		case "status":
			return runStatus(ctx, args[1:], getenv, stdout, stderr)
		case "cleanup":
			return runCleanup(ctx, args[1:], getenv, stdout, stderr)
		case "relay":
			return runRelay(ctx, args[1:], getenv, stderr)
		}
	}
	cfg, err := parseConfig(args, getenv, stdout)
	if errors.Is(err, errHelp) {
		return err
	}
	if err != nil {
		if cfg.LogFormat == "json" { // as far as parsing got: a log pipeline reads it
			newLogger(cfg, stderr).Error("invalid configuration; run npagent --help for the flags", "err", err)
			return loggedError{exitUsage, usageError{err}}
		}
		return usageError{err}
	}
	log := newLogger(cfg, stderr)
	routeClientGoLogs(log)
	if err := runAgent(ctx, cfg, log); err != nil {
		log.Error("npagent failed", "err", err)
		return loggedError{1, err}
	}
	return nil
}

// runAgent is run once the configuration is valid: each phase of the start in the
// order its failures are worth reporting (local and certain first), then the
// reconcile loop until ctx ends, then the shutdown (the defers, last first: the
// node watch, the node set, the dataplane, telemetry's flush, the debug socket,
// HTTP).
func runAgent(ctx context.Context, cfg config, log *slog.Logger) error {
	start := time.Now()
	log.Info("starting npagent", "version", agentVersion(), "node", cfg.NodeName, "node_ip", cfg.NodeIP,
		"dataplane", cfg.Dataplane, "state_file", cfg.StateFile, "metrics_addr", cfg.MetricsAddr, "health_addr", cfg.HealthAddr)

	// Bind first: a port in use is the cheapest startup error to report.
	ln, err := net.Listen("tcp", cfg.MetricsAddr)
	if err != nil {
		return fmt.Errorf("--metrics-addr %s: %w", cfg.MetricsAddr, err)
	}
	defer ln.Close()
	healthLn, err := net.Listen("tcp", cfg.HealthAddr)
	if err != nil {
		return fmt.Errorf("--health-addr %s: %w", cfg.HealthAddr, err)
	}
	defer healthLn.Close()

	health := newAgentHealth(cfg.StallTimeout)
	tel, sink, metrics := startTelemetry(ctx, cfg, health, log)
	serveErr, stopHTTP := serveHTTP(ln, healthLn, metrics, health, log)
	defer stopHTTP()
	debug, stopDebug := serveDebugSocket(cfg, health, log)
	defer stopDebug()
	if tel != nil { // flushed before the HTTP server stops (defers run last first)
		defer shutdownTelemetry(tel, cfg.ShutdownTimeout, log)
	}
	runCtx, cancelRun, httpFailed := stopOnHTTPFailure(ctx, serveErr, log)
	defer cancelRun()

	restConfig, err := loadRESTConfig(cfg.Kubeconfig)
	if err != nil {
		return err
	}
	// The dataplane before the apiserver: a missing privilege is a local, certain
	// failure, worth reporting before a network one.
	dp, err := openDataplane(cfg, log)
	if errors.Is(err, bpfmaps.ErrKernelFeature) {
		return unsupportedKernel(runCtx, err, health, log, httpFailed)
	}
	if err != nil {
		return err
	}
	defer func() {
		if err := dp.Close(); err != nil {
			log.Warn("close dataplane", "dataplane", cfg.Dataplane, "err", err)
		}
	}()
	nodes, stopNodeAddrs, err := keepNodeSet(runCtx, cfg, dp, log)
	if err != nil {
		return err
	}
	defer stopNodeAddrs() // before the dataplane closes
	health.addCheck(nodes.Health)
	if err := waitForAPIServer(runCtx, restConfig, cfg.APIServerTimeout, agentAccess(cfg.EnforcingMode, cfg.PodCondition), health, log); err != nil {
		return interruptedStart(httpFailed, log)
	}
	// The Node's own addresses (status.addresses) before the first commit.
	stopNode, err := watchNode(runCtx, restConfig, cfg.NodeName, nodes, cfg.APIServerTimeout, log.With("component", "node-addrs"))
	if err != nil {
		return err
	}
	defer stopNode()

	seenSet, err := openSeenSet(cfg, start, log)
	if err != nil {
		return err
	}
	ctrl, err := newController(runCtx, restConfig, cfg, dp, seenSet, sink, log)
	if err != nil {
		return err
	}
	if tel != nil {
		observeCounts(tel, ctrl, seenSet, nodes, dp)
		observeVerdicts(tel, ctrl, dp, log)
	}
	debug.SetSource(verdictSource{Source: ctrl, read: dp.Verdicts, judge: dp.Judge})
	stopFlows := startFlows(runCtx, cfg, ctrl, dp, tel, log.With("component", "flows"))
	health.setLoop(ctrl, func() error {
		if err := dp.Ready(); err != nil {
			return fmt.Errorf("dataplane %s not ready: %w", cfg.Dataplane, err)
		}
		return nil
	})

	runErr := ctrl.Run(runCtx)
	cancelRun() // stops the flow events too, if Run returned on its own
	stopFlows()
	health.setStopping()
	if ctx.Err() != nil {
		log.Info("signal received: stopped taking work, in-flight commits finished")
	}
	if runErr != nil && ctx.Err() == nil {
		log.Error("reconcile stopped", "err", runErr)
	}
	persistAndLogStop(cfg, seenSet, ctrl, start, log)
	return stopResult(ctx, runErr, httpFailed)
}

// startTelemetry opens telemetry, which is local: a bad OTEL_* setting degrades it
// (listed by /readyz), never stops the agent. tel is nil when it is off; then
// reports are discarded and /metrics answers 503 saying why.
func startTelemetry(ctx context.Context, cfg config, health *agentHealth, log *slog.Logger) (tel *telemetry.Telemetry, sink report.Sink, metrics http.Handler) {
	tel, degraded := openTelemetry(ctx, log.With("component", "telemetry"),
		telemetry.WithNodeName(cfg.NodeName),
		telemetry.WithInstanceID(instanceID(cfg.NodeName, os.Getenv(envResourceAttributes))),
		telemetry.WithServiceVersion(agentVersion()),
		telemetry.WithSampling(cfg.SlowTraceThreshold, cfg.FastTraceFraction),
		telemetry.WithTraceParenting(cfg.TraceParenting),
		telemetry.WithVerdictSeriesLimit(cfg.VerdictSeriesLimit),
		telemetry.WithAuditMode(cfg.AuditMode),
		telemetry.WithLogger(log.With("component", "telemetry")),
	)
	if degraded != "" {
		health.addDegraded(degraded)
	}
	if tel != nil {
		return tel, tel, tel.MetricsHandler()
	}
	return nil, report.Discard{}, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "telemetry off: "+degraded, http.StatusServiceUnavailable)
	})
}

// serveHTTP serves /metrics on ln and the probes on healthLn, from here on: /livez
// answers while the agent waits for the apiserver, and /readyz says what it waits
// for. The probes have a server of their own (newHealthServer): /metrics is open to
// every pod, and a pod holding its requests must not fail the liveness probe. Each
// server's end (http.ErrServerClosed after stop) arrives on serveErr; stop shuts
// both down within 2s.
func serveHTTP(ln, healthLn net.Listener, metrics http.Handler, health *agentHealth, log *slog.Logger) (serveErr <-chan error, stop func()) {
	errorLog := slog.NewLogLogger(log.Handler(), slog.LevelWarn)
	servers := []struct {
		srv *http.Server
		ln  net.Listener
	}{
		{newHTTPServer(newMetricsHandler(metrics), errorLog), ln},
		{newHealthServer(newHealthHandler(health.live, health.ready), errorLog), healthLn},
	}
	errs := make(chan error, len(servers))
	for _, s := range servers {
		go func() {
			err := s.srv.Serve(s.ln)
			if !errors.Is(err, http.ErrServerClosed) {
				err = fmt.Errorf("http server on %s: %w", s.ln.Addr(), err)
			}
			errs <- err
		}()
	}
	log.Info("serving /metrics", "addr", ln.Addr().String())
	log.Info("serving /livez, /healthz and /readyz", "addr", healthLn.Addr().String())
	return errs, func() {
		httpCtx, cancelHTTP := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancelHTTP()
		for _, s := range servers {
			if err := s.srv.Shutdown(httpCtx); err != nil {
				log.Warn("http server shutdown", "addr", s.ln.Addr().String(), "err", err)
			}
		}
	}
}

// serveDebugSocket serves the debug socket (npagent explain, npagent wait),
// answered 503 until the loop exists (explain.Server.SetSource). It is not worth stopping
// enforcement for: a failure degrades (listed by /readyz). stop is a no-op when
// nothing is served.
func serveDebugSocket(cfg config, health *agentHealth, log *slog.Logger) (debug *explain.Server, stop func()) {
	debug = &explain.Server{}
	if cfg.DebugSocket == "" {
		return debug, func() {}
	}
	stop, err := serveDebug(cfg.DebugSocket, debug, log)
	if err != nil {
		log.Error("debug socket not served: npagent explain and wait will not reach this agent", "debug_socket", cfg.DebugSocket, "err", err)
		health.addDegraded("debug socket " + cfg.DebugSocket + ": " + err.Error())
		return debug, func() {}
	}
	return debug, stop
}

// stopOnHTTPFailure returns the context everything runs on: ctx, or cancelled
// early when an HTTP server fails, whose error httpFailed then holds.
func stopOnHTTPFailure(ctx context.Context, serveErr <-chan error, log *slog.Logger) (runCtx context.Context, cancel context.CancelFunc, httpFailed <-chan error) {
	runCtx, cancelRun := context.WithCancel(ctx)
	failed := make(chan error, 1)
	go func() {
		select {
		case err := <-serveErr:
			if !errors.Is(err, http.ErrServerClosed) {
				log.Error("http server failed; stopping", "err", err)
				failed <- err
			}
			cancelRun()
		case <-runCtx.Done():
		}
	}()
	return runCtx, cancelRun, failed
}

// interruptedStart is runAgent's result once the start was cut short: the HTTP
// server's failure, or nil for a signal.
func interruptedStart(httpFailed <-chan error, log *slog.Logger) error {
	select {
	case err := <-httpFailed:
		return err
	default:
		log.Info("signal received while starting: exiting")
		return nil
	}
}

// unsupportedKernel keeps the agent up and never ready on a kernel that lacks a
// feature it needs (err names the feature and the kernel): /readyz answers err, the
// log says it every unsupportedKernelLogEvery, and it returns when the agent is told
// to stop. Exiting instead would put the pod in CrashLoopBackOff, whose restarts
// cannot help and whose reason (the last log lines of an exited container) is harder
// to find than a pod that stays not ready with the reason on /readyz and in its log.
func unsupportedKernel(ctx context.Context, err error, health *agentHealth, log *slog.Logger, httpFailed <-chan error) error {
	health.setWaiting(fmt.Errorf("not enforcing: %w", err))
	tick := time.NewTicker(unsupportedKernelLogEvery)
	defer tick.Stop()
	for {
		log.Error("this node's kernel cannot run npagent: staying up, not ready, enforcing nothing", "err", err)
		select {
		case <-ctx.Done():
			return interruptedStart(httpFailed, log)
		case <-tick.C:
		}
	}
}

// unsupportedKernelLogEvery repeats unsupportedKernel's log line, so the reason stays
// in a log whose older lines rotate away.
const unsupportedKernelLogEvery = 10 * time.Minute

// keepNodeSet puts the node set in the dataplane and keeps it current (nodeaddrs):
// traffic between a pod and its own node is always allowed, so the set is in place
// before any pod is programmed. stop ends the refreshes.
func keepNodeSet(ctx context.Context, cfg config, dp bpfmaps.Dataplane, log *slog.Logger) (nodes *nodeaddrs.Keeper, stop func(), err error) {
	nodes = nodeaddrs.New(nodeaddrs.Config{Dataplane: dp, Max: bpfmaps.MaxNodePrefixes,
		Sources: nodeaddrs.Sources{NodeIP: cfg.NodeIP, Extra: cfg.NodeCIDRs, Ifaces: cfg.NodeAddrInterfaces},
		List:    nodeaddrs.ListIfaces, Watch: nodeaddrs.WatchAddrs, Log: log.With("component", "node-addrs"),
		StatusNote: "node addresses: Node " + cfg.NodeName + " not read yet; only the node IP's interface and --node-cidrs are exempt"})
	stop, err = nodes.Start(ctx, nodeAddrsRefresh)
	if err != nil {
		return nil, nil, err
	}
	return nodes, stop, nil
}

// newController builds the reconcile loop from the configuration, with the last
// valid versions beside the seen-set's state: both must outlive the agent's
// container.
func newController(ctx context.Context, restConfig *rest.Config, cfg config, dp bpfmaps.Dataplane, seenSet *seen.Set, sink report.Sink, log *slog.Logger) (*reconcile.Controller, error) {
	var podSeen *seen.Set
	if cfg.PodCondition {
		podSeen = openPodSeenSet(cfg, log)
	}
	var endpoints *rest.Config // nil: the apiserver
	if cfg.RelayURL != "" {
		var err error
		if endpoints, err = relay.ClientConfig(ctx, restConfig, cfg.RelayURL,
			relay.ClientOptions{CAFile: cfg.RelayCA, Logger: log.With("component", "relay-client")}); err != nil {
			return nil, err
		}
	}
	ctrl, err := reconcile.New(restConfig, reconcile.Config{
		NodeName:              cfg.NodeName,
		NodeIP:                cfg.NodeIP,
		Dataplane:             dp,
		Seen:                  seenSet,
		Sink:                  sink,
		Resolver:              podif.NewRouteResolver(podif.WithNodeIPs(cfg.NodeIP), podif.WithInterfacePrefixes(cfg.PodInterfacePrefixes...)),
		TriggerAnnotation:     cfg.TriggerAnnotation,
		TraceParentAnnotation: cfg.TraceParentAnnotation,
		Compile: translate.Options{DropDomainAllowRules: cfg.DropFQDNAllowRules, MaxEntriesPerObject: cfg.MaxEntriesPerObject,
			MapEntriesV4: cfg.MapEntriesV4, MapEntriesV6: cfg.MapEntriesV6},
		ResyncPeriod:      cfg.ResyncPeriod,
		Workers:           cfg.Workers,
		WatchStallTimeout: cfg.WatchStallTimeout,
		Logger:            log.With("component", "reconcile"),
		LastValidDir:      lastValidDir(cfg.StateFile),
		EnforcingMode:     cfg.EnforcingMode,
		PodStatus:         cfg.PodCondition,
		PodStatusQPS:      cfg.PodConditionQPS,
		PodSeen:           podSeen,
		// 100% is 1: no bound, as 0.
		NamespaceEntryShare: cfg.NamespaceEntryShare / 100,
		EndpointsConfig:     endpoints,
	})
	if err != nil {
		return nil, fmt.Errorf("reconcile: %w", err)
	}
	return ctrl, nil
}

// observeCounts hands telemetry the counts' owners: each count has one, and
// telemetry reads them at each collection.
func observeCounts(tel *telemetry.Telemetry, ctrl *reconcile.Controller, seenSet *seen.Set, nodes *nodeaddrs.Keeper, dp bpfmaps.Dataplane) {
	tel.ObserveCounts(func(c *report.Counts) {
		ctrl.Counts(c)
		st := seenSet.Stats()
		c.Suppressed = st.Suppressed
		c.SeenObjects, c.SeenPending = int64(st.Objects), int64(st.Pending)
		if trigger, _, ok := seenSet.OldestPending(); ok {
			c.SeenOldestPendingAge = time.Since(trigger)
		}
		loop := ctrl.Stats()
		c.PodsIsolated, c.PodsStrictDenied = loop.PodsIsolated, int64(loop.PodsStrictDenied)
		c.PodsUnisolable = loop.PodsUnisolable
		c.NodeAddrsLeftOut = int64(nodes.LeftOut())
		c.Maps = mapUsage(dp)
	})
}

// persistAndLogStop persists the seen-set once the loop stopped and logs what the
// run did. A failed persist is logged: the next start measures again what it lost.
func persistAndLogStop(cfg config, seenSet *seen.Set, ctrl *reconcile.Controller, start time.Time, log *slog.Logger) {
	if err := seenSet.Persist(); err != nil {
		log.Error("persist seen-set", "state_file", cfg.StateFile, "err", err)
	}
	st, cs := seenSet.Stats(), ctrl.Stats()
	log.Info("npagent stopped", "uptime", time.Since(start).Round(time.Millisecond),
		"reported", st.Reported, "accepted", st.Accepted, "pending", st.Pending,
		"redelivered", st.Suppressed[report.Redelivered], "persists", st.Persists,
		"syncs", cs.Syncs, "commits", cs.Commits, "commits_skipped", cs.CommitsSkipped,
		"commit_failures", cs.CommitFailures, "entries_written", cs.EntriesWritten,
		"objects", cs.Objects, "pods", cs.Pods)
}

// stopResult is runAgent's result once the loop stopped: a failed HTTP server's
// error; nil when a signal asked for the stop; the loop's error (or "stopped
// without a signal") when nobody asked.
func stopResult(ctx context.Context, runErr error, httpFailed <-chan error) error {
	select {
	case err := <-httpFailed:
		return err
	default:
	}
	if ctx.Err() == nil { // nobody asked the agent to stop
		if runErr == nil {
			runErr = errors.New("stopped without a signal")
		}
		return fmt.Errorf("reconcile: %w", runErr)
	}
	return nil
}

// loadRESTConfig reads kubeconfig (a path, or a list as in $KUBECONFIG), or the
// in-cluster configuration when it is empty. Its errors say what is missing and
// the three ways to give it, not client-go's "try setting KUBERNETES_MASTER".
func loadRESTConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		rc, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("no kubeconfig given and no in-cluster configuration (%v): pass a kubeconfig file with --kubeconfig or $KUBECONFIG, or run the agent in a pod with its service account token mounted", err)
		}
		return rc, nil
	}
	var missing []string
	paths := filepath.SplitList(kubeconfig)
	for _, p := range paths {
		if _, err := os.Stat(p); err != nil {
			missing = append(missing, err.Error())
		}
	}
	if len(missing) == len(paths) {
		return nil, fmt.Errorf("--kubeconfig (or $KUBECONFIG) %s: no kubeconfig file there (%s): give the path of a readable kubeconfig file, or leave both empty in a pod to use its service account (in-cluster configuration)", kubeconfig, strings.Join(missing, "; "))
	}
	rules := &clientcmd.ClientConfigLoadingRules{Precedence: paths}
	rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
	if clientcmd.IsEmptyConfig(err) {
		return nil, fmt.Errorf("--kubeconfig (or $KUBECONFIG) %s: no cluster, user or context in it: give a kubeconfig with a current-context (kubectl config view shows it), or leave both empty in a pod to use its service account (in-cluster configuration)", kubeconfig)
	}
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig (or $KUBECONFIG) %s: %w", kubeconfig, err)
	}
	return rc, nil
}

// Backoff between apiserver probes at start: doubling from the first to the cap.
const (
	apiserverRetryFirst = time.Second
	apiserverRetryMax   = 30 * time.Second
)

// waitForAPIServer probes the apiserver (probeAPIServer) until it answers, serves
// networking.k8s.aws/v1alpha1 and grants the agent need, waiting apiserverRetryFirst, doubling up to
// apiserverRetryMax, between attempts. An apiserver that is down or slow at start,
// CRDs not installed yet or RBAC not granted yet, is not a reason to exit: the DaemonSet would crash-loop
// and back off for minutes after the apiserver is back. Meanwhile each failure is
// logged and is what /readyz answers; /livez stays 200. It returns nil once the
// probe passes, or ctx's error when ctx ends first.
func waitForAPIServer(ctx context.Context, rc *rest.Config, timeout time.Duration, need []access, health *agentHealth, log *slog.Logger) error {
	health.setWaiting(fmt.Errorf("apiserver %s: not probed yet", rc.Host))
	delay := apiserverRetryFirst
	for attempt := 1; ; attempt++ {
		err := probeAPIServer(ctx, rc, timeout, need)
		if err == nil {
			log.Info("apiserver reachable, CRDs served, access granted", "apiserver", rc.Host, "attempts", attempt)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		health.setWaiting(err)
		msg := "apiserver probe failed; retrying (not ready meanwhile)"
		if errors.Is(err, errForbidden) { // not the apiserver's fault: RBAC
			msg = "apiserver probe failed: the agent lacks RBAC permissions; retrying until they are granted (not ready meanwhile)"
		}
		log.Warn(msg, "apiserver", rc.Host, "attempt", attempt, "retry_in", delay, "err", err)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		delay = min(2*delay, apiserverRetryMax)
	}
}

// probeAPIServer asks the apiserver for its version, for the
// networking.k8s.aws/v1alpha1 group and whether the agent may do need
// (checkAccess), within timeout, so that an unreachable address, missing CRDs or
// missing RBAC are named (in the log and /readyz) before any informer starts
// retrying silently.
func probeAPIServer(ctx context.Context, rc *rest.Config, timeout time.Duration, need []access) error {
	probeConfig := rest.CopyConfig(rc)
	probeConfig.Timeout = timeout
	dc, err := discovery.NewDiscoveryClientForConfig(probeConfig)
	if err != nil {
		return fmt.Errorf("apiserver %s: client: %w", rc.Host, err)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := dc.RESTClient().Get().AbsPath("/version").Do(ctx).Error(); err != nil {
		return fmt.Errorf("apiserver unreachable: %s (probe GET /version, timeout %v): %w", rc.Host, timeout, err)
	}
	group := "/apis/" + v1alpha1.SchemeGroupVersion.String()
	if err := dc.RESTClient().Get().AbsPath(group).Do(ctx).Error(); err != nil {
		return fmt.Errorf("CRDs not served: apiserver %s: GET %s: %w (are the PolicyEndpoint and ClusterPolicyEndpoint CRDs installed? The AWS Network Policy Controller installs them; config/crd holds compatible copies for a local control plane)", rc.Host, group, err)
	}
	cs, err := kubernetes.NewForConfig(probeConfig)
	if err != nil {
		return fmt.Errorf("apiserver %s: client: %w", rc.Host, err)
	}
	return checkAccess(ctx, cs, need)
}

// openDataplane opens the backend --dataplane names. The in-memory backend polices
// nothing, and says so loudly.
func openDataplane(cfg config, log *slog.Logger) (bpfmaps.Dataplane, error) {
	if cfg.Dataplane == dataplaneMemory {
		log.Warn("in-memory dataplane: no enforcement; policies are computed and measured but no packet is policed",
			"dataplane", dataplaneMemory)
		return bpfmaps.NewMemoryWithLimits(mapLimits(cfg)), nil
	}
	if cfg.AuditMode {
		log.Warn("AUDIT MODE: NETWORK POLICY IS NOT ENFORCED on this node: packets the policy denies pass, counted as would_deny (npagent.policy.verdicts); restart without --audit-mode to enforce",
			"audit_mode", true)
	}
	dp, err := bpfmaps.OpenEBPF(bpfmaps.EBPFOptions{PinPath: cfg.BPFFSPath, Limits: mapLimits(cfg), ConntrackEntries: cfg.ConntrackEntries,
		NodeEgress: cfg.NodeEgress, Audit: cfg.AuditMode})
	if errors.Is(err, bpfmaps.ErrPinnedCapacity) {
		return nil, fmt.Errorf("--dataplane=ebpf: %w (Limits.EntriesV4 is --max-entries-ipv4, Limits.EntriesV6 --max-entries-ipv6, ConntrackEntries --conntrack-entries; Resizing the maps: docs/how-to/resize-maps.md)", err)
	}
	if err != nil {
		if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) || errors.Is(err, os.ErrPermission) {
			return nil, fmt.Errorf("--dataplane=ebpf: %w (needs CAP_BPF and CAP_NET_ADMIN, and the host's bpffs mounted at %s; or --dataplane=memory for no enforcement)", err, cfg.BPFFSPath)
		}
		return nil, fmt.Errorf("--dataplane=ebpf (bpffs at %s): %w", cfg.BPFFSPath, err)
	}
	a := dp.Adoption()
	log.Info("eBPF dataplane open", "bpffs_path", cfg.BPFFSPath, "pods", len(dp.Pods()), "adopted", a.Pods)
	for _, ifindex := range a.Reattached {
		log.Warn("re-attached the programs of a pod whose tcx link was gone while the agent was down; enforcement resumed",
			"ifindex", ifindex, "bpffs_path", cfg.BPFFSPath)
	}
	if len(a.Vanished) > 0 {
		log.Info("dropped the pinned state of pods whose interface is gone", "ifindexes", a.Vanished)
	}
	if len(a.Replaced) > 0 {
		log.Info("dropped the pinned state of pods whose interface index now names another interface (not inherited)", "ifindexes", a.Replaced)
	}
	return dp, nil
}

// mapUsage reads the dataplane's map use for telemetry. A map it could not count
// is left out (Max 0), not reported as empty.
func mapUsage(ur bpfmaps.UsageReporter) report.DataplaneMaps {
	u, err := ur.Usage()
	if err != nil {
		u.Conntrack = bpfmaps.MapUse{}
	}
	conv := func(m bpfmaps.MapUse) report.MapUse { return report.MapUse{Used: int64(m.Used), Max: int64(m.Max)} }
	var out report.DataplaneMaps
	for d := range u.Entries {
		for f := range u.Entries[d] {
			out.Entries[d][f] = conv(u.Entries[d][f])
		}
	}
	out.Pods, out.Conntrack = conv(u.Pods), conv(u.Conntrack)
	return out
}

// mapLimits are the dataplane's map capacities the flags ask for.
func mapLimits(cfg config) bpfmaps.Limits {
	return bpfmaps.Limits{EntriesV4: cfg.MapEntriesV4, EntriesV6: cfg.MapEntriesV6}
}

// openSeenSet restores the seen-set from the state file. A damaged file is logged
// and ignored (the set starts empty); a missing directory is created.
func openSeenSet(cfg config, start time.Time, log *slog.Logger) (*seen.Set, error) {
	opts := []seen.Option{seen.WithMaxSkew(cfg.MaxTriggerSkew), seen.WithMaxWatermarkAge(cfg.WatermarkMaxAge)}
	if cfg.StateFile != "" {
		if err := os.MkdirAll(filepath.Dir(cfg.StateFile), 0o700); err != nil {
			return nil, fmt.Errorf("--state-file %s: %w", cfg.StateFile, err)
		}
		opts = append(opts, seen.WithStatePath(cfg.StateFile))
	}
	s, restoreErr := seen.New(start, opts...)
	if restoreErr != nil {
		log.Warn("seen-set state ignored; starting empty (triggers older than this start count as before_start)",
			"state_file", cfg.StateFile, "err", restoreErr)
	} else if st := s.Stats(); cfg.StateFile != "" {
		// A missing file is a first start: nothing restored, no error.
		log.Info("seen-set state loaded", "state_file", cfg.StateFile, "objects", st.Objects, "pending", st.Pending)
	}
	return s, nil
}

// openPodSeenSet is the seen-set of new pods' enforcement windows, keyed by pod
// uid, its state beside the seen-set's (pods.state): a pod is observed once
// across restarts. A damaged file is logged and ignored.
func openPodSeenSet(cfg config, log *slog.Logger) *seen.Set {
	opts := []seen.Option{seen.WithMaxSkew(cfg.MaxTriggerSkew), seen.WithMaxWatermarkAge(cfg.WatermarkMaxAge)}
	path := ""
	if cfg.StateFile != "" {
		path = filepath.Join(filepath.Dir(cfg.StateFile), "pods.state")
		opts = append(opts, seen.WithStatePath(path))
	}
	s, err := seen.New(time.Now(), opts...)
	if err != nil {
		log.Warn("pod seen-set state ignored; starting empty (pods whose network was ready before this start are not measured)", "state_file", path, "err", err)
	}
	return s
}

// shutdownTelemetry flushes and stops the exporters within timeout.
func shutdownTelemetry(tel *telemetry.Telemetry, timeout time.Duration, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := tel.Shutdown(ctx)
	// The losses so far, either way: an incomplete flush (a collector down at
	// shutdown) is when they matter most.
	spans, exports := tel.Dropped()
	if err != nil {
		log.Warn("telemetry flush incomplete", "timeout", timeout, "err", err, "spans_dropped", spans, "metric_exports_failed", exports)
		return
	}
	log.Info("telemetry flushed", "spans_dropped", spans, "metric_exports_failed", exports)
}
