package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/npagent/npagent/internal/explain"
	"github.com/npagent/npagent/internal/report"
)

// Exit codes of the explain and wait subcommands (2, a bad command line, is the
// agent's too).
const (
	exitNotProgrammed = 1 // wait: timed out; explain: the object or pod is unknown
	exitUsage         = 2
	exitUnreachable   = 3 // no answer from the agent's debug socket, or it is still starting
)

// exitError ends a subcommand with code; main prints err when it is not nil.
type exitError struct {
	code int
	err  error
}

func (e exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit %d", e.code)
	}
	return e.err.Error()
}
func (e exitError) Unwrap() error { return e.err }

// explainTarget is what explain was asked about: the debug path, and whether it is
// an object (else a pod).
type explainTarget struct {
	path   string
	object bool
}

func parseTarget(s string) (explainTarget, error) {
	parts := strings.Split(s, "/")
	esc := url.PathEscape
	switch {
	case len(parts) == 3 && parts[0] == "pe" && parts[1] != "" && parts[2] != "":
		return explainTarget{"/v1/object/pe/" + esc(parts[1]) + "/" + esc(parts[2]), true}, nil
	case len(parts) == 2 && parts[0] == "cpe" && parts[1] != "":
		return explainTarget{"/v1/object/cpe/" + esc(parts[1]), true}, nil
	case len(parts) == 3 && parts[0] == "pod" && parts[1] != "" && parts[2] != "":
		return explainTarget{"/v1/pod/" + esc(parts[1]) + "/" + esc(parts[2]), false}, nil
	case len(parts) == 1:
		if ip, err := netip.ParseAddr(s); err == nil {
			return explainTarget{"/v1/podip/" + ip.String(), false}, nil
		}
	}
	return explainTarget{}, fmt.Errorf("%q: want pe/<namespace>/<name>, cpe/<name>, pod/<namespace>/<name> or a pod IP", s)
}

// debugSocketDefault is --debug-socket's default for the subcommands: the
// agent's variable, else the agent's default.
func debugSocketDefault(getenv func(string) string) string {
	if s := getenv(flagEnv["debug-socket"]); s != "" {
		return s
	}
	return defaultDebugSocket
}

// parseInterspersed parses flags before and after positional arguments (the flag
// package stops at the first one) and returns the positional ones.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// runExplain is `npagent explain`: what the agent on this node knows of an object
// or a pod, as a short report or (--json) the agent's JSON.
func runExplain(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "verdict" {
		return runExplainVerdict(ctx, args[1:], getenv, stdout, stderr)
	}
	fs := flag.NewFlagSet("npagent explain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	socket := fs.String("debug-socket", debugSocketDefault(getenv), "the agent's debug socket [$"+flagEnv["debug-socket"]+"]")
	asJSON := fs.Bool("json", false, "print the agent's JSON answer")
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: npagent explain [--json] [--debug-socket PATH] TARGET
       npagent explain verdict --from FROM --to TO --port PORT [--json]

TARGET is pe/<namespace>/<name>, cpe/<name>, pod/<namespace>/<name> or a pod IP.
Asks the npagent on this node (over its debug socket) what it knows: an object's
versions seen here, pending triggers and their age, failed attempts, the last
reports with their phases, the writer's trace id; a pod's objects and whether each is
programmed here. Exit: 0 shown, 1 object or pod unknown to the agent, 2 usage,
3 agent unreachable or still starting (caches not synced). For
"would this packet pass, and what decides it": npagent explain verdict --help.

Flags:
`)
		fs.PrintDefaults()
	}
	pos, err := parseInterspersed(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	if err != nil {
		return exitError{exitUsage, err}
	}
	if len(pos) != 1 {
		fs.Usage()
		return exitError{exitUsage, errors.New("explain: want exactly one TARGET")}
	}
	target, err := parseTarget(pos[0])
	if err != nil {
		return exitError{exitUsage, fmt.Errorf("explain: %w", err)}
	}
	c := explain.NewClient(*socket)
	var raw json.RawMessage
	if err := c.Get(ctx, target.path, &raw); err != nil {
		if errors.Is(err, explain.ErrUnreachable) || errors.As(err, new(explain.StartingError)) { // nothing to explain from yet
			return exitError{exitUnreachable, err}
		}
		return exitError{exitNotProgrammed, err}
	}
	if target.object {
		var ex explain.ObjectExplain
		if err := json.Unmarshal(raw, &ex); err != nil {
			return fmt.Errorf("agent's answer: %w", err)
		}
		if *asJSON {
			fmt.Fprintf(stdout, "%s\n", raw)
		} else {
			printObject(stdout, &ex)
		}
		if ex.State == explain.StateNotFound {
			return exitError{exitNotProgrammed, nil}
		}
		return nil
	}
	var pod explain.PodExplain
	if err := json.Unmarshal(raw, &pod); err != nil {
		return fmt.Errorf("agent's answer: %w", err)
	}
	if *asJSON {
		fmt.Fprintf(stdout, "%s\n", raw)
	} else {
		printPod(stdout, &pod)
	}
	if pod.IP == "" && len(pod.Objects) == 0 {
		return exitError{exitNotProgrammed, nil}
	}
	return nil
}

// kindShort is the short kind name used in targets.
func kindShort(kind string) string {
	switch kind {
	case report.KindPolicyEndpoint.String():
		return "pe"
	case report.KindClusterPolicyEndpoint.String():
		return "cpe"
	}
	return kind
}

func objectName(kind, namespace, name string) string {
	if namespace == "" {
		return kindShort(kind) + "/" + name
	}
	return kindShort(kind) + "/" + namespace + "/" + name
}

// dur prints a duration with three significant digits or so.
func dur(d time.Duration) string {
	switch a := max(d, -d); {
	case a == 0:
		return "0"
	case a >= time.Minute:
		return d.Round(time.Second).String()
	case a >= time.Second:
		return d.Round(time.Millisecond).String()
	case a >= time.Millisecond:
		return d.Round(10 * time.Microsecond).String()
	default:
		return d.Round(100 * time.Nanosecond).String()
	}
}

// clock prints a time of day in UTC with milliseconds; "-" for the zero time.
func clock(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("15:04:05.000Z")
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func printObject(w io.Writer, ex *explain.ObjectExplain) {
	fmt.Fprintf(w, "%s on node %s (at %s)\n", objectName(ex.Kind, ex.Namespace, ex.Name), ex.Node, ex.At.UTC().Format(time.RFC3339))
	if ex.State == explain.StateNotFound {
		fmt.Fprintln(w, "  not found in the agent's informer cache")
		return
	}
	state := strings.ToUpper(ex.State)
	if ex.Detail != "" {
		state += ": " + ex.Detail
	}
	fmt.Fprintf(w, "  state       %s\n", state)
	fmt.Fprintf(w, "  uid         %s  resourceVersion %s  policyRef %s\n", ex.UID, ex.ResourceVersion, orDash(ex.PolicyRef))
	fmt.Fprintf(w, "  trigger     %s  writer trace %s\n", orDash(rfc(ex.Trigger)), orDash(ex.WriterTraceID))
	fmt.Fprintf(w, "  local pods  %s\n", orDash(strings.Join(ex.LocalPods, ", ")))
	for _, n := range ex.Notes {
		fmt.Fprintf(w, "  note        %s\n", n)
	}

	fmt.Fprintln(w, "\nVERSIONS seen on this node (oldest first)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  RV\tTRIGGER\tRECEIVED\tLAST SYNC\tOUTCOME\tLOCAL WORK\tPODS\tDETAIL")
	for _, v := range ex.Versions {
		outcome := v.Outcome
		if outcome == "" {
			outcome = "not synced"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", v.ResourceVersion, clock(v.Trigger), clock(v.Received), clock(v.SyncedAt),
			outcome, yesNo(v.HasLocalWork()), v.Pods, v.Detail)
	}
	tw.Flush()

	fmt.Fprintln(w, "\nPENDING triggers")
	if len(ex.Pending) == 0 {
		fmt.Fprintf(w, "  none (newest consumed: %s)\n", orDash(rfc(ex.Consumed)))
	} else {
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  TRIGGER\tAGE\tRECEIVED\tWAITING\tFAILED COMMITS")
		for _, p := range ex.Pending {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%d\n", clock(p.Trigger), dur(p.Age), clock(p.Received), dur(p.Waiting), p.Failures)
		}
		tw.Flush()
	}
	if len(ex.FailedAttempts) > 0 {
		fmt.Fprintln(w, "\nFAILED ATTEMPTS since the last success")
		for _, a := range ex.FailedAttempts {
			fmt.Fprintf(w, "  %s  %s\n", clock(a.Start), attemptLine(&a))
		}
	}

	fmt.Fprintln(w, "\nREPORTS (newest last)")
	if len(ex.Reports) == 0 {
		fmt.Fprintln(w, "  none")
	}
	for _, r := range ex.Reports {
		fmt.Fprintf(w, "  trigger %s  rv %s  latency %s  pods %d  entries %d  attempts %d  writer trace %s\n",
			clock(r.Trigger), r.ResourceVersion, dur(r.Latency), r.Pods, r.Entries, r.AttemptCount, orDash(r.WriterTraceID))
		fmt.Fprintf(w, "    delivery %s  queue %s  compute %s\n", dur(r.Delivery), dur(r.Queue), dur(r.Compute))
		first := r.AttemptCount - len(r.Attempts) + 1
		for i, a := range r.Attempts {
			fmt.Fprintf(w, "    attempt %d: %s\n", first+i, attemptLine(&a))
		}
	}
}

// attemptLine is one attempt: lock wait, time under the lock, phases, error.
func attemptLine(a *explain.AttemptInfo) string {
	var b strings.Builder
	fmt.Fprintf(&b, "lock wait %s, commit %s", dur(a.LockWait), dur(a.Duration))
	p := a.Phases
	var phases []string
	for _, ph := range []struct {
		name string
		d    time.Duration
	}{{"merge", p.Merge}, {"compile", p.Compile}, {"attach", p.Attach}, {"write", p.Write}, {"switch", p.Switch}, {"cleanup", p.Cleanup}} {
		if ph.d != 0 {
			phases = append(phases, ph.name+" "+dur(ph.d))
		}
	}
	if len(phases) > 0 {
		fmt.Fprintf(&b, " (%s)", strings.Join(phases, ", "))
	}
	if a.Err != "" {
		fmt.Fprintf(&b, "  FAILED: %s", a.Err)
	}
	return b.String()
}

func printPod(w io.Writer, p *explain.PodExplain) {
	name := "pod " + orDash(p.IP)
	if p.Name != "" {
		name = fmt.Sprintf("pod %s/%s (%s)", p.Namespace, p.Name, orDash(p.IP))
	}
	verdict := "NOT PROGRAMMED"
	if p.Programmed {
		verdict = "PROGRAMMED"
	}
	fmt.Fprintf(w, "%s on node %s: %s\n", name, p.Node, verdict)
	switch {
	case !p.Synced:
		fmt.Fprintln(w, "  the agent's informer caches have not synced yet")
	case !p.OnNode:
		fmt.Fprintf(w, "  the objects place this pod on host %s, not this node: ask the agent there\n", p.HostIP)
	case p.StrictDenied:
		fmt.Fprintln(w, "  denied by strict mode until a policy selects it (node traffic allowed)")
	case len(p.Objects) == 0:
		fmt.Fprintln(w, "  no policy object selects this pod: nothing to enforce")
	}
	if p.Ifindex != 0 {
		fmt.Fprintf(w, "  interface   ifindex %d\n", p.Ifindex)
	}
	printPodWindow(w, p.Window)
	defer printPodDenials(w, p.RecentDenials)
	defer printPodVerdicts(w, p.Verdicts)
	if len(p.Objects) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  OBJECT\tPOLICY\tLISTS POD\tRV\tSTATE\tPROGRAMMED")
	for _, o := range p.Objects {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\n", objectName(o.Kind, o.Namespace, o.Name), orDash(o.PolicyRef),
			yesNo(o.Lists), orDash(o.ResourceVersion), o.State, yesNo(o.Programmed))
	}
	tw.Flush()
}

// printPodWindow prints the new pod's enforcement window: how long its network was
// usable before its policy was in force (in strict mode, how long it stayed denied).
func printPodWindow(w io.Writer, win *explain.PodWindow) {
	if win == nil {
		return
	}
	ready := win.NetworkReady.UTC().Format(time.RFC3339Nano)
	switch {
	case win.Unselected:
		fmt.Fprintf(w, "  window      network ready %s (%s), no policy selected it: counted, not measured\n", ready, win.Source)
		return
	case win.Programmed.IsZero():
		fmt.Fprintf(w, "  window      network ready %s (%s), no policy in force yet\n", ready, win.Source)
		return
	}
	fmt.Fprintf(w, "  window      network ready %s (%s), policy in force %s later\n", ready, win.Source, win.Programmed.Sub(win.NetworkReady))
}

// printPodDenials prints the pod's recent denials, newest first.
func printPodDenials(w io.Writer, fs []explain.PodFlow) {
	if len(fs) == 0 {
		return
	}
	fmt.Fprintln(w, "  recent denials (flow events, newest first):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  TIME\tDIRECTION\tVERDICT\tFROM\tTO\tPROTO\tREASON\tPOLICY\tRULE")
	for _, f := range fs {
		rule, policy := "-", "-"
		if f.Rule >= 0 {
			rule = fmt.Sprint(f.Rule)
		}
		if f.Policy != "" {
			policy = objectName(f.PolicyKind, "", f.Policy)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", f.Time.UTC().Format(time.RFC3339Nano), f.Direction, f.Verdict,
			hostPort(f.Src, f.SrcPort), hostPort(f.Dst, f.DstPort), report.ProtocolName(f.Protocol), f.Reason, policy, rule)
	}
	tw.Flush()
}

// hostPort is addr:port, or addr alone without a port.
func hostPort(addr string, port uint16) string {
	if port == 0 {
		return orDash(addr)
	}
	return net.JoinHostPort(addr, fmt.Sprint(port))
}

// printPodVerdicts prints the pod's verdict counters, the denials first.
func printPodVerdicts(w io.Writer, vs []explain.PodVerdict) {
	if len(vs) == 0 {
		return
	}
	vs = slices.Clone(vs)
	rank := map[string]int{"deny": 0, "would_deny": 1, "allow": 2}
	slices.SortStableFunc(vs, func(a, b explain.PodVerdict) int { return rank[a.Verdict] - rank[b.Verdict] })
	fmt.Fprintln(w, "  verdicts since the agent started (the kernel's counters):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  DIRECTION\tVERDICT\tREASON\tPOLICY\tRULE\tPACKETS\tBYTES")
	for _, v := range vs {
		policy, rule := "-", "-"
		if v.Policy != "" {
			policy = v.PolicyKind + " " + v.Policy
		}
		if v.Rule >= 0 {
			rule = strconv.Itoa(v.Rule)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%d\t%d\n", v.Direction, v.Verdict, v.Reason, policy, rule, v.Packets, v.Bytes)
	}
	tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func rfc(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}
