package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/reconcile"
	"github.com/npagent/npagent/internal/telemetry"
	"github.com/npagent/npagent/internal/translate"
	"k8s.io/klog/v2"
)

// Dataplane backends --dataplane accepts.
const (
	dataplaneEBPF   = "ebpf"
	dataplaneMemory = "memory"
)

// defaultMetricsPort is --metrics-addr's port when the flag is empty.
const defaultMetricsPort = "9090"

// defaultHealthAddr is --health-addr's default: loopback, which pods cannot reach
// (newHealthServer), on the port after the chart's metrics port.
const defaultHealthAddr = "127.0.0.1:9438"

// config is everything the agent is told at start. parseConfig fills it from the
// command line, falling back to the environment for every flag not given.
type config struct {
	Kubeconfig            string // "" = in-cluster configuration
	NodeName              string
	NodeIP                netip.Addr
	NodeCIDRs             []netip.Prefix // exempt from policy with the node's own addresses
	NodeAddrInterfaces    []string       // interfaces whose addresses are the node's too; "name*": a prefix
	PodInterfacePrefixes  []string       // host-side pod interface name prefixes; none: any name
	Dataplane             string         // dataplaneEBPF or dataplaneMemory
	BPFFSPath             string
	StateFile             string // "" = no persistence
	TriggerAnnotation     string
	TraceParentAnnotation string
	TraceParenting        telemetry.Parenting // link (default) or child
	ResyncPeriod          time.Duration
	Workers               int
	MetricsAddr           string // "" at parse time becomes <node-ip>:9090
	HealthAddr            string // /livez, /healthz, /readyz; a listener of its own
	StallTimeout          time.Duration
	WatchStallTimeout     time.Duration
	APIServerTimeout      time.Duration
	ShutdownTimeout       time.Duration
	LogLevel              slog.Level
	LogFormat             string // "text" or "json"
	SlowTraceThreshold    time.Duration
	FastTraceFraction     float64
	DropFQDNAllowRules    bool    // leave out domainName allow rules instead of rejecting their object
	AuditMode             bool    // --audit-mode: policy denials pass, counted as would_deny
	MaxEntriesPerObject   int     // an object needing more map entries is rejected as bad input
	MapEntriesV4          int     // capacity of each direction's IPv4 trie, shared by all pods
	MapEntriesV6          int     // the same for IPv6
	NamespaceEntryShare   float64 // percent of each trie one namespace's pods may hold; 0 or 100: no bound
	ConntrackEntries      int     // --conntrack-entries: each of a pod's connection tables
	VerdictSeriesLimit    int     // --verdict-series-limit: series of the verdict counters
	MaxTriggerSkew        time.Duration
	WatermarkMaxAge       time.Duration
	DebugSocket           string // unix socket of the debug API; "" = none
	EnforcingMode         reconcile.EnforcingMode
	PodCondition          bool                  // write npagent.io/PolicyProgrammed on this node's pods
	PodConditionQPS       float64               // bound on those writes per second
	NodeEgress            bpfmaps.NodeEgress    // a pod's packets to its node: exempt (allow) or judged by its egress policy
	FlowEvents            bpfmaps.FlowEventMode // --flow-events: off, deny or all
	FlowEventsRate        float64               // per pod, events per second; 0: no limit
	FlowEventsBurst       int
	FlowLogFile           string // "" = no JSON lines file
	FlowLogMaxSize        int    // megabytes before rotation
	FlowLogMaxFiles       int    // rotated files kept
	RelayURL              string // "" = policy endpoint objects from the apiserver
	RelayCA               string // CA bundle of the relay's serving certificate
}

// flagEnv maps each flag to the environment variable that supplies it when the flag
// is absent from the command line. The flag always wins over the variable.
// defaultStateFile is --state-file's default.
const defaultStateFile = "/var/lib/npagent/seen.state"

var flagEnv = map[string]string{
	"kubeconfig":              "KUBECONFIG",
	"node-name":               "NODE_NAME",
	"node-ip":                 "NODE_IP",
	"node-cidrs":              "NPAGENT_NODE_CIDRS",
	"node-address-interfaces": "NPAGENT_NODE_ADDRESS_INTERFACES",
	"node-egress":             "NPAGENT_NODE_EGRESS",
	"pod-interface-prefixes":  "NPAGENT_POD_INTERFACE_PREFIXES",
	"dataplane":               "NPAGENT_DATAPLANE",
	"bpffs-path":              "NPAGENT_BPFFS_PATH",
	"state-file":              "NPAGENT_STATE_FILE",
	"trigger-annotation":      "NPAGENT_TRIGGER_ANNOTATION",
	"traceparent-annotation":  "NPAGENT_TRACEPARENT_ANNOTATION",
	"trace-parenting":         "NPAGENT_TRACE_PARENTING",
	"resync-period":           "NPAGENT_RESYNC_PERIOD",
	"workers":                 "NPAGENT_WORKERS",
	"metrics-addr":            "NPAGENT_METRICS_ADDR",
	"health-addr":             "NPAGENT_HEALTH_ADDR",
	"stall-timeout":           "NPAGENT_STALL_TIMEOUT",
	"watch-stall-timeout":     "NPAGENT_WATCH_STALL_TIMEOUT",
	"apiserver-timeout":       "NPAGENT_APISERVER_TIMEOUT",
	"shutdown-timeout":        "NPAGENT_SHUTDOWN_TIMEOUT",
	"log-level":               "NPAGENT_LOG_LEVEL",
	"log-format":              "NPAGENT_LOG_FORMAT",
	"slow-trace-threshold":    "NPAGENT_SLOW_TRACE_THRESHOLD",
	"fast-trace-fraction":     "NPAGENT_FAST_TRACE_FRACTION",
	"drop-fqdn-allow-rules":   "NPAGENT_DROP_FQDN_ALLOW_RULES",
	"max-entries-per-object":  "NPAGENT_MAX_ENTRIES_PER_OBJECT",
	"max-entries-ipv4":        "NPAGENT_MAX_ENTRIES_IPV4",
	"max-entries-ipv6":        "NPAGENT_MAX_ENTRIES_IPV6",
	"namespace-entry-share":   "NPAGENT_NAMESPACE_ENTRY_SHARE",
	"conntrack-entries":       "NPAGENT_CONNTRACK_ENTRIES",
	"audit-mode":              "NPAGENT_AUDIT_MODE",
	"verdict-series-limit":    "NPAGENT_VERDICT_SERIES_LIMIT",
	"max-trigger-skew":        "NPAGENT_MAX_TRIGGER_SKEW",
	"watermark-max-age":       "NPAGENT_WATERMARK_MAX_AGE",
	"debug-socket":            "NPAGENT_DEBUG_SOCKET",
	"enforcing-mode":          "NPAGENT_ENFORCING_MODE",
	"pod-condition":           "NPAGENT_POD_CONDITION",
	"pod-condition-qps":       "NPAGENT_POD_CONDITION_QPS",
	"flow-events":             "NPAGENT_FLOW_EVENTS",
	"flow-events-rate":        "NPAGENT_FLOW_EVENTS_RATE",
	"flow-events-burst":       "NPAGENT_FLOW_EVENTS_BURST",
	"flow-log-file":           "NPAGENT_FLOW_LOG_FILE",
	"flow-log-max-size":       "NPAGENT_FLOW_LOG_MAX_SIZE",
	"flow-log-max-files":      "NPAGENT_FLOW_LOG_MAX_FILES",
	"relay-url":               "NPAGENT_RELAY_URL",
	"relay-ca":                "NPAGENT_RELAY_CA",
}

// errHelp is returned when -h or --help was asked for: usage was printed, exit 0.
var errHelp = flag.ErrHelp

// parseConfig parses args (without the program name) with getenv as the fallback
// for flags not given. Usage goes to usage on -h or --help only. Every error names
// the flag (and the variable, when the value came from it).
func parseConfig(args []string, getenv func(string) string, usage io.Writer) (config, error) {
	var c config
	var raw rawFlags
	fs := newFlagSet(&c, &raw)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, errHelp) {
			printUsage(usage, fs)
		}
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q (flags only, or the version, explain, wait, status or cleanup command)", fs.Arg(0))
	}
	if err := setFromEnv(fs, getenv); err != nil {
		return c, err
	}
	errs := raw.convert(&c)
	errs = append(errs, c.validate()...)
	return c, errors.Join(errs...)
}

// rawFlags are the flags parsed as text: convert turns them into config's values.
type rawFlags struct {
	nodeIP, nodeCIDRs, nodeAddrIfaces, podIfPrefixes, logLevel, parenting, enforcingMode, flowEvents string
}

// newFlagSet defines the agent's flags on c (and raw, for those converted after
// parsing); printUsage is their --help.
func newFlagSet(c *config, raw *rawFlags) *flag.FlagSet {
	fs := flag.NewFlagSet("npagent", flag.ContinueOnError)
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "kubeconfig file; empty: in-cluster configuration")
	fs.StringVar(&c.NodeName, "node-name", "", "this node's name (k8s.node.name); empty: the host name")
	fs.StringVar(&raw.nodeIP, "node-ip", "", "this node's IP: pods whose hostIP equals it are programmed here (required)")
	fs.StringVar(&raw.nodeCIDRs, "node-cidrs", "", "extra CIDRs (comma-separated) whose traffic with pods is always allowed, as the node's own addresses always are (the node IP, the Node object's InternalIP and ExternalIP addresses, every address of the interfaces that hold them; not dummy devices, kube-ipvs0 or pods' veths)")
	fs.StringVar(&raw.nodeAddrIfaces, "node-address-interfaces", "", "more interfaces (comma-separated names; \"name*\" matches a prefix) whose addresses are the node's own, exempt from policy. E.g. a CNI that puts a gateway address on each pod's host-side veth (the ptp plugin): the kubelet's probes come from it")
	fs.Var(&c.NodeEgress, "node-egress", "a pod's packets to its own node's addresses (a NodePort or hostPort on its node, a node-local DNS cache, anything on the node): allow (they pass whatever its egress policy says, as the node's packets to the pod always do) or policy (its egress policy judges them as any peer's; replies of connections the node opened, such as kubelet probes, and DHCP still pass)")
	fs.StringVar(&raw.podIfPrefixes, "pod-interface-prefixes", "", "name prefixes (comma-separated) of the host-side pod interfaces the CNI creates (AWS VPC CNI: eni,vlan; Calico: cali; Cilium: lxc); an interface named otherwise is never attached to. Empty: any name. Whatever this says, an interface carrying a default route or the node IP, or loopback, never is")
	fs.StringVar(&c.Dataplane, "dataplane", dataplaneEBPF, "dataplane backend: ebpf, or memory (no enforcement; for unprivileged runs)")
	fs.StringVar(&c.BPFFSPath, "bpffs-path", bpfmaps.DefaultPinPath, "bpffs directory where eBPF maps and links are pinned")
	fs.StringVar(&c.StateFile, "state-file", defaultStateFile, "file persisting reported trigger times across restarts, and beside it (last-valid/) each object's last valid version; empty: none")
	fs.StringVar(&c.TriggerAnnotation, "trigger-annotation", v1alpha1.AnnotationLastChangeTriggerTime, "annotation holding the change's trigger time (RFC3339Nano)")
	fs.StringVar(&c.TraceParentAnnotation, "traceparent-annotation", v1alpha1.AnnotationTraceParent, "annotation holding the writer's W3C traceparent, read when "+reconcile.TracingTraceParentAnnotation+" (KEP-5915, always read first) is absent or empty")
	fs.StringVar(&raw.parenting, "trace-parenting", telemetry.ParentingLink.String(), "how a trigger's root span relates to the writer's traceparent: link (a trace of its own with a span link to it, as KEP-5915 asks) or child (a child in the writer's trace)")
	fs.DurationVar(&c.ResyncPeriod, "resync-period", 10*time.Minute, "informer resync period; 0 disables resyncs")
	fs.IntVar(&c.Workers, "workers", 2, "reconcile workers")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", "", "host:port serving /metrics; empty: the node IP, port "+defaultMetricsPort+" (\":"+defaultMetricsPort+"\" listens on every interface)")
	fs.StringVar(&c.HealthAddr, "health-addr", defaultHealthAddr, "host:port serving /livez (alias /healthz) and /readyz, apart from /metrics with a limiter of its own; keep it on loopback, which pods cannot reach (the kubelet probes it with httpGet host 127.0.0.1: the agent is on the host network)")
	fs.DurationVar(&c.StallTimeout, "stall-timeout", 2*time.Minute, "/livez fails when one sync runs, or keys wait in the queue with no sync finishing, for longer than this")
	fs.DurationVar(&c.WatchStallTimeout, "watch-stall-timeout", time.Minute, "/readyz fails, and npagent.watch.stalled is 1, while an informer's watch is down for longer than this, or open and silent (no event, no bookmark, not reopened) for longer than its own timeout (5-10m) plus this")
	fs.StringVar(&c.RelayURL, "relay-url", "", "read PolicyEndpoints and ClusterPolicyEndpoints from the relay tier at this https URL (npagent relay: only this node's objects; docs/how-to/relay.md), and from the apiserver while no relay answers; pods and the Node still come from the apiserver. Empty: from the apiserver")
	fs.StringVar(&c.RelayCA, "relay-ca", "", "CA bundle (PEM file) the relay's serving certificate is checked against; empty: the system's roots")
	fs.DurationVar(&c.APIServerTimeout, "apiserver-timeout", 10*time.Second, "how long the startup probe of the apiserver may take")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", 10*time.Second, "how long flushing telemetry may take at shutdown")
	fs.StringVar(&raw.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&c.LogFormat, "log-format", "text", "log format: text (key=value) or json")
	fs.DurationVar(&c.SlowTraceThreshold, "slow-trace-threshold", 0, "triggers at least this slow are always traced")
	fs.Float64Var(&c.FastTraceFraction, "fast-trace-fraction", 1, "fraction (0..1) of faster triggers traced; every trigger is still measured")
	fs.IntVar(&c.VerdictSeriesLimit, "verdict-series-limit", telemetry.DefaultVerdictSeriesLimit, "most series of npagent.policy.verdicts (per pod, direction, verdict, reason, policy and rule) this node exports; beyond it new series are folded into one overflow series (otel.metric.overflow=true) and counted (npagent.policy.verdicts.overflowed)")
	fs.DurationVar(&c.WatermarkMaxAge, "watermark-max-age", time.Hour, "after a restart, objects the last process never saw are measured only for changes up to this long before the start (older ones: before_start); 0: no bound")
	fs.DurationVar(&c.MaxTriggerSkew, "max-trigger-skew", 5*time.Second, "a trigger time later than this node's clock by more than this is suppressed as future, not consumed")
	fs.StringVar(&c.DebugSocket, "debug-socket", defaultDebugSocket, "unix socket (mode 0600) serving the read-only debug API that npagent explain and npagent wait use; empty: none")
	fs.BoolVar(&c.AuditMode, "audit-mode", false, "AUDIT MODE, NOTHING ENFORCED: packets the policy denies (default deny, admin and baseline Deny rules) pass and are counted as npagent.policy.verdicts{npagent.verdict=\"would_deny\"}; for a staged rollout only. The agent logs a warning at start, npagent.dataplane.audit_mode is 1, and the NpagentAuditMode alert fires. Restarting without it enforces at once")
	fs.BoolVar(&c.DropFQDNAllowRules, "drop-fqdn-allow-rules", false, "leave out domainName (FQDN) rules that only allow, instead of rejecting their object (they cannot be enforced from the object; leaving them out only narrows the policy)")
	fs.IntVar(&c.MaxEntriesPerObject, "max-entries-per-object", translate.DefaultMaxEntriesPerObject, "an object whose CIDRs and except blocks (both directions) exceed this is rejected as bad input (counted in invalid objects; its last valid version stays in force), so it cannot take the shared maps from other pods")
	fs.IntVar(&c.MapEntriesV4, "max-entries-ipv4", bpfmaps.DefaultEntriesV4, "capacity of each direction's IPv4 policy map, shared by every pod on the node (a pod's entries count twice while a delta commit keeps two sets). Pinned maps keep the size they were created with: to change it, stop the agent and remove --bpffs-path (Resizing the maps: docs/how-to/resize-maps.md)")
	fs.IntVar(&c.MapEntriesV6, "max-entries-ipv6", bpfmaps.DefaultEntriesV6, "capacity of each direction's IPv6 policy map, as --max-entries-ipv4")
	fs.Float64Var(&c.NamespaceEntryShare, "namespace-entry-share", 100*reconcile.DefaultNamespaceEntryShare, "percent of each policy map (direction and family) the pods of one namespace on this node may hold with their NetworkPolicy rules: a policy object that would take its namespace over it is rejected as bad input (counted in invalid objects; its last valid version stays in force), so that one tenant cannot crowd others out of the node's maps (docs/explanation/failures-and-capacity.md). 0 or 100: no bound")
	fs.StringVar(&raw.enforcingMode, "enforcing-mode", string(reconcile.EnforcingStandard), "what a pod on this node gets before a policy selecting it is programmed: standard (open until then, and open again when no policy selects it) or strict (denied both ways, node traffic excepted, from when it has an IP until then; a pod no policy selects stays denied; needs RBAC to list and watch pods)")
	fs.BoolVar(&c.PodCondition, "pod-condition", false, "write the condition npagent.io/PolicyProgrammed on this node's pods (True once every object selecting the pod is programmed here; pods may gate readiness on it; docs/how-to/pod-status.md); watches this node's pods and needs RBAC to list and watch pods and patch pods/status")
	fs.Float64Var(&c.PodConditionQPS, "pod-condition-qps", 5, "most pods/status patches per second (burst twice this): a pod's changes are coalesced, and a restart or relist writes nothing when nothing changed")
	fs.IntVar(&c.ConntrackEntries, "conntrack-entries", bpfmaps.DefaultConntrackEntries, "capacity of each of a pod's two connection tables, for the connections it opened and those peers opened (connections whose replies pass an isolated direction; a side opening more evicts its own oldest, never the other side's nor another pod's; plus a quarter-size fragment table: about 140 bytes of kernel memory per entry, 1.2 MiB per pod at 4096). Pinned tables keep their size: to change it, stop the agent and remove --bpffs-path (Resizing the maps: docs/how-to/resize-maps.md)")
	fs.StringVar(&raw.flowEvents, "flow-events", bpfmaps.FlowEventsDeny.String(), "flow events, emitted as OpenTelemetry log records (event npagent.flow, over OTLP when an endpoint is set) and to --flow-log-file: deny (one per denied packet, and per would-be denial in audit mode), all (also one per newly tracked allowed flow: its first packet through an isolated direction's connection tracking) or off. Rate-limited per pod in the datapath (--flow-events-rate); what is suppressed is counted (npagent.flow.events.suppressed)")
	fs.Float64Var(&c.FlowEventsRate, "flow-events-rate", 100, "most flow events per second one pod produces on average (a token bucket in the datapath, per pod): a flood from one pod cannot starve another's events or the agent. 0: no limit")
	fs.IntVar(&c.FlowEventsBurst, "flow-events-burst", 200, "most flow events one pod produces at once (the token bucket's depth), at least 1")
	fs.StringVar(&c.FlowLogFile, "flow-log-file", "", "also write flow events as JSON lines (the log records' attribute names, plus time, severity and body) to this node-local file, rotated by size; an absolute path whose directory exists. Empty: no file")
	fs.IntVar(&c.FlowLogMaxSize, "flow-log-max-size", 10, "megabytes --flow-log-file grows to before it is rotated")
	fs.IntVar(&c.FlowLogMaxFiles, "flow-log-max-files", 5, "rotated --flow-log-file files kept besides the current one (older ones are removed)")
	// Parse prints nothing: a bad flag is reported once, by exitCode, with a
	// one-line hint; the usage is printed only when asked for (-h, --help).
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// flagGroups orders --help: every flag in exactly one group (TestHelpGroupsEveryFlag).
var flagGroups = []struct {
	title string
	flags []string
}{
	{"Node and cluster", []string{"kubeconfig", "node-name", "node-ip", "node-cidrs", "node-address-interfaces",
		"pod-interface-prefixes", "apiserver-timeout", "resync-period", "relay-url", "relay-ca"}},
	{"Dataplane", []string{"dataplane", "bpffs-path", "max-entries-ipv4", "max-entries-ipv6", "conntrack-entries",
		"namespace-entry-share", "max-entries-per-object"}},
	{"Enforcement", []string{"enforcing-mode", "node-egress", "audit-mode", "drop-fqdn-allow-rules", "workers", "pod-condition", "pod-condition-qps"}},
	{"Telemetry", []string{"metrics-addr", "trigger-annotation", "traceparent-annotation", "trace-parenting",
		"slow-trace-threshold", "fast-trace-fraction", "verdict-series-limit", "max-trigger-skew", "log-level", "log-format", "shutdown-timeout"}},
	{"Flow events", []string{"flow-events", "flow-events-rate", "flow-events-burst", "flow-log-file", "flow-log-max-size", "flow-log-max-files"}},
	{"Health and debug", []string{"health-addr", "stall-timeout", "watch-stall-timeout", "debug-socket"}},
	{"State", []string{"state-file", "watermark-max-age"}},
}

// helpWidth bounds --help's lines: descriptions are wrapped to it.
const helpWidth = 100

// printUsage writes --help: the commands, then the flags by group, each with its
// variable, its description wrapped to helpWidth columns and its default.
func printUsage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprint(w, `Usage: npagent [flags]
       npagent version
       npagent explain [--json] pe/<ns>/<name> | cpe/<name> | pod/<ns>/<name> | <pod IP>
       npagent wait (--pod <ns>/<name> | --ip <addr>) [--policy <ns>/<name>]... [--timeout D]
       npagent wait --cluster --pod <ns>/<name> [--timeout D]   (through the apiserver)
       npagent status [--json] (pod|policy) <ns>/<name>          (through the apiserver)
       npagent cleanup [--wait]   (end enforcement on this node: after the agent stopped)
       npagent relay --tls-cert-file F --tls-key-file F   (the relay tier: docs/how-to/relay.md)

Flags (each falls back to the environment variable in brackets):
`)
	for _, g := range flagGroups {
		fmt.Fprintf(w, "\n%s:\n", g.title)
		for _, name := range g.flags {
			f := fs.Lookup(name)
			desc := f.Usage
			if f.DefValue != "" {
				desc += fmt.Sprintf(" (default %q)", f.DefValue)
			}
			fmt.Fprintf(w, "  --%s [%s]\n", f.Name, flagEnv[f.Name])
			for _, line := range wrap(desc, helpWidth-6) {
				fmt.Fprintf(w, "      %s\n", line)
			}
		}
	}
	fmt.Fprintf(w, "\nOTEL_* variables (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME, ...) configure OTLP export.\n")
}

// wrap splits text into lines of at most width columns at spaces (a longer
// word stays whole on a line of its own).
func wrap(text string, width int) []string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(text) {
		switch {
		case line == "":
			line = word
		case len(line)+1+len(word) <= width:
			line += " " + word
		default:
			lines = append(lines, line)
			line = word
		}
	}
	return append(lines, line)
}

// setFromEnv sets each flag not given on the command line from its variable
// (flagEnv), when that is not empty; a bad value names the flag and the variable.
func setFromEnv(fs *flag.FlagSet, getenv func(string) string) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		name := flagEnv[f.Name]
		if given[f.Name] || name == "" {
			return
		}
		v := getenv(name)
		if v == "" {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			errs = append(errs, fmt.Errorf("invalid value %q for --%s (from $%s): %w", v, f.Name, name, err))
		}
	})
	return errors.Join(errs...)
}

// convert turns the text flags into c's values, defaulting --metrics-addr to the
// node IP and --node-name to the host name; each error names its flag.
func (raw *rawFlags) convert(c *config) []error {
	var errs []error
	if p, err := telemetry.ParseParenting(raw.parenting); err != nil {
		errs = append(errs, fmt.Errorf("--trace-parenting: %q is not link or child", raw.parenting))
	} else {
		c.TraceParenting = p
	}
	if err := c.LogLevel.UnmarshalText([]byte(raw.logLevel)); err != nil {
		errs = append(errs, fmt.Errorf("--log-level: %q is not debug, info, warn or error", raw.logLevel))
	}
	if err := raw.convertNodeIP(c); err != nil {
		errs = append(errs, err)
	}
	for _, f := range splitList(raw.nodeCIDRs) {
		p, err := netip.ParsePrefix(f)
		if err != nil {
			errs = append(errs, fmt.Errorf("--node-cidrs: %q is not a CIDR", f))
			continue
		}
		c.NodeCIDRs = append(c.NodeCIDRs, p.Masked())
	}
	c.NodeAddrInterfaces = append(c.NodeAddrInterfaces, splitList(raw.nodeAddrIfaces)...)
	c.PodInterfacePrefixes = append(c.PodInterfacePrefixes, splitList(raw.podIfPrefixes)...)
	if m, err := reconcile.ParseEnforcingMode(raw.enforcingMode); err != nil || raw.enforcingMode == "" {
		errs = append(errs, fmt.Errorf("--enforcing-mode: %q is not standard or strict", raw.enforcingMode))
	} else {
		c.EnforcingMode = m
	}
	if m, err := bpfmaps.ParseFlowEventMode(raw.flowEvents); err != nil {
		errs = append(errs, fmt.Errorf("--flow-events: %q is not deny, all or off", raw.flowEvents))
	} else {
		c.FlowEvents = m
	}
	if c.NodeName == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			errs = append(errs, fmt.Errorf("--node-name (or $NODE_NAME) is required: host name unavailable: %v", err))
		}
		c.NodeName = host
	}
	return errs
}

// convertNodeIP sets c.NodeIP from --node-ip (required), and --metrics-addr to it
// when that is empty.
func (raw *rawFlags) convertNodeIP(c *config) error {
	if raw.nodeIP == "" {
		return errors.New("--node-ip (or $NODE_IP) is required: the agent programs the pods whose hostIP is this node's IP")
	}
	ip, err := netip.ParseAddr(raw.nodeIP)
	if err != nil {
		return fmt.Errorf("--node-ip: %q is not an IP address", raw.nodeIP)
	}
	c.NodeIP = ip.Unmap()
	if c.MetricsAddr == "" {
		// The node IP, not every interface: on the host network every interface
		// is the node's. Prometheus reaches the pod IP, which is the node IP.
		c.MetricsAddr = net.JoinHostPort(c.NodeIP.String(), defaultMetricsPort)
	}
	return nil
}

// splitList splits a comma-separated flag value, dropping blanks and empty items.
func splitList(v string) []string {
	var out []string
	for _, f := range strings.Split(v, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// validate checks the values parseConfig cannot check while parsing.
func (c *config) validate() []error {
	var errs []error
	switch c.Dataplane {
	case dataplaneEBPF, dataplaneMemory:
	default:
		errs = append(errs, fmt.Errorf("--dataplane: %q is not ebpf or memory", c.Dataplane))
	}
	if c.Dataplane == dataplaneEBPF && c.BPFFSPath == "" {
		errs = append(errs, errors.New("--bpffs-path: empty; the eBPF dataplane pins its maps there"))
	}
	if strings.TrimSpace(c.TriggerAnnotation) == "" {
		errs = append(errs, errors.New("--trigger-annotation: empty"))
	}
	if c.ResyncPeriod < 0 {
		errs = append(errs, fmt.Errorf("--resync-period: %v is negative", c.ResyncPeriod))
	}
	if c.PodConditionQPS <= 0 {
		errs = append(errs, fmt.Errorf("--pod-condition-qps: %v, need more than 0 (pods/status patches per second)", c.PodConditionQPS))
	}
	if c.Workers < 1 {
		errs = append(errs, fmt.Errorf("--workers: %d, need at least 1", c.Workers))
	}
	if c.MaxEntriesPerObject < 1 {
		errs = append(errs, fmt.Errorf("--max-entries-per-object: %d, need at least 1", c.MaxEntriesPerObject))
	}
	if c.MapEntriesV4 < 1 {
		errs = append(errs, fmt.Errorf("--max-entries-ipv4: %d, need at least 1", c.MapEntriesV4))
	}
	if c.MapEntriesV6 < 1 {
		errs = append(errs, fmt.Errorf("--max-entries-ipv6: %d, need at least 1", c.MapEntriesV6))
	}
	if !(c.NamespaceEntryShare >= 0 && c.NamespaceEntryShare <= 100) { // NaN too
		errs = append(errs, fmt.Errorf("--namespace-entry-share: %v, need a percentage from 0 to 100 (0 or 100: no bound)", c.NamespaceEntryShare))
	}
	if !(c.FlowEventsRate >= 0) || math.IsInf(c.FlowEventsRate, 0) { // NaN too
		errs = append(errs, fmt.Errorf("--flow-events-rate: %v, need 0 (no limit) or more events per second", c.FlowEventsRate))
	}
	if c.FlowEventsBurst < 1 {
		errs = append(errs, fmt.Errorf("--flow-events-burst: %d, need at least 1", c.FlowEventsBurst))
	}
	if c.FlowLogFile != "" && !filepath.IsAbs(c.FlowLogFile) {
		errs = append(errs, fmt.Errorf("--flow-log-file: %q, need an absolute path", c.FlowLogFile))
	}
	if c.FlowLogMaxSize < 1 {
		errs = append(errs, fmt.Errorf("--flow-log-max-size: %d, need at least 1 (megabytes)", c.FlowLogMaxSize))
	}
	if c.FlowLogMaxFiles < 1 {
		errs = append(errs, fmt.Errorf("--flow-log-max-files: %d, need at least 1", c.FlowLogMaxFiles))
	}
	if c.VerdictSeriesLimit < 1 {
		errs = append(errs, fmt.Errorf("--verdict-series-limit: %d, need at least 1", c.VerdictSeriesLimit))
	}
	if c.ConntrackEntries < 1 {
		errs = append(errs, fmt.Errorf("--conntrack-entries: %d, need at least 1", c.ConntrackEntries))
	}
	if c.StallTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--stall-timeout: %v, need a positive duration", c.StallTimeout))
	}
	if c.WatchStallTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--watch-stall-timeout: %v, need a positive duration", c.WatchStallTimeout))
	}
	if _, _, err := net.SplitHostPort(c.MetricsAddr); c.MetricsAddr != "" && err != nil { // "": node IP missing, reported
		errs = append(errs, fmt.Errorf("--metrics-addr: %q is not host:port", c.MetricsAddr))
	}
	if _, port, err := net.SplitHostPort(c.HealthAddr); err != nil {
		errs = append(errs, fmt.Errorf("--health-addr: %q is not host:port", c.HealthAddr))
	} else if c.HealthAddr == c.MetricsAddr && port != "0" {
		errs = append(errs, fmt.Errorf("--health-addr: %q is --metrics-addr too; the probes need a listener of their own", c.HealthAddr))
	}
	if c.APIServerTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--apiserver-timeout: %v, need a positive duration", c.APIServerTimeout))
	}
	if c.ShutdownTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--shutdown-timeout: %v, need a positive duration", c.ShutdownTimeout))
	}
	if c.DebugSocket != "" && (!filepath.IsAbs(c.DebugSocket) || len(c.DebugSocket) > maxDebugSocketPath) {
		errs = append(errs, fmt.Errorf("--debug-socket: %q: need an absolute path of at most %d bytes (a unix socket's limit)", c.DebugSocket, maxDebugSocketPath))
	}
	switch c.LogFormat {
	case "text", "json":
	default:
		errs = append(errs, fmt.Errorf("--log-format: %q is not text or json", c.LogFormat))
	}
	if c.SlowTraceThreshold < 0 {
		errs = append(errs, fmt.Errorf("--slow-trace-threshold: %v is negative", c.SlowTraceThreshold))
	}
	if !(c.FastTraceFraction >= 0 && c.FastTraceFraction <= 1) { // also rejects NaN
		errs = append(errs, fmt.Errorf("--fast-trace-fraction: %v is outside 0..1", c.FastTraceFraction))
	}
	return errs
}

// newLogger builds the process logger: key=value text or JSON on w.
// routeClientGoLogs sends client-go's logs (klog: the reflectors' list and watch
// errors, backoffs, relists) into the agent's structured log, tagged
// component=client-go. Without it they went to klog's default stderr format, or
// nowhere an operator's log pipeline parses: a watch failing or stalled went
// unseen.
func routeClientGoLogs(log *slog.Logger) { klog.SetSlogLogger(log.With("component", "client-go")) }

func newLogger(c config, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: c.LogLevel}
	if c.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
