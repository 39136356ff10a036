package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/npagent/npagent/internal/explain"
)

// runExplainVerdict is `npagent explain verdict`: would a packet pass this node's
// programs, and what decides it, as the agent reads it from the dataplane's maps.
// Exit: 0 allowed (or not judged here), 1 denied (or would be, in audit mode), 2
// usage, 3 agent unreachable or starting.
func runExplainVerdict(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("npagent explain verdict", flag.ContinueOnError)
	fs.SetOutput(stderr)
	socket := fs.String("debug-socket", debugSocketDefault(getenv), "the agent's debug socket [$"+flagEnv["debug-socket"]+"]")
	asJSON := fs.Bool("json", false, "print the agent's JSON answer")
	from := fs.String("from", "", "the sender: pod/<namespace>/<name> or an IP")
	to := fs.String("to", "", "the receiver: pod/<namespace>/<name> or an IP")
	port := fs.String("port", "", "the destination: <port>/<tcp|udp|sctp>, or icmp (an echo request)")
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: npagent explain verdict --from FROM --to TO --port PORT [--json] [--debug-socket PATH]

Would a new flow's first packet from FROM to TO pass this node's programs, and
what decides it? FROM and TO are pod/<namespace>/<name> or an IP; PORT is
<port>/<tcp|udp|sctp> or icmp. The agent resolves the pods through what it knows
(the objects listing them) and judges the packet at the sender's egress and the
receiver's ingress, for each that is a pod on this node, from the maps the kernel
holds now (not from the objects): the verdict, the counter's reason, the deciding
object and rule (or the objects whose default deny dropped it). An end on another
node is judged by that node's agent. Exit: 0 allowed (or nothing judges it here),
1 denied (or would be, in audit mode), 2 usage, 3 agent unreachable or starting.

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
	if len(pos) != 0 || *from == "" || *to == "" || *port == "" {
		fs.Usage()
		return exitError{exitUsage, errors.New("explain verdict: want --from, --to and --port, and no other argument")}
	}
	var q explain.VerdictQuery
	var errs []error
	if q.From, err = explain.ParseEnd(*from); err != nil {
		errs = append(errs, fmt.Errorf("--from %w", err))
	}
	if q.To, err = explain.ParseEnd(*to); err != nil {
		errs = append(errs, fmt.Errorf("--to %w", err))
	}
	if q.Protocol, q.Port, err = explain.ParsePort(*port); err != nil {
		errs = append(errs, fmt.Errorf("--port %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return exitError{exitUsage, fmt.Errorf("explain verdict: %w", err)}
	}
	var raw json.RawMessage
	if err := explain.NewClient(*socket).Get(ctx, q.Path(), &raw); err != nil {
		if errors.Is(err, explain.ErrUnreachable) || errors.As(err, new(explain.StartingError)) {
			return exitError{exitUnreachable, err}
		}
		return exitError{exitNotProgrammed, err}
	}
	var v explain.VerdictExplain
	if err := json.Unmarshal(raw, &v); err != nil {
		return fmt.Errorf("agent's answer: %w", err)
	}
	if *asJSON {
		fmt.Fprintf(stdout, "%s\n", raw)
	} else {
		printVerdict(stdout, &v)
	}
	if v.Verdict == explain.VerdictDeny || v.Verdict == explain.VerdictWouldDeny {
		return exitError{exitNotProgrammed, nil}
	}
	return nil
}

func verdictEndName(e explain.VerdictEnd) string {
	if e.Name != "" {
		return fmt.Sprintf("%s/%s (%s)", e.Namespace, e.Name, e.IP)
	}
	return e.IP
}

// printVerdict prints the answer: the verdict, then each check with what decided.
func printVerdict(w io.Writer, v *explain.VerdictExplain) {
	what := strings.ToLower(v.Protocol)
	if v.Port != 0 {
		what = fmt.Sprintf("%d/%s", v.Port, what)
	}
	fmt.Fprintf(w, "%s -> %s %s on node %s (at %s): %s\n", verdictEndName(v.From), verdictEndName(v.To), what, v.Node,
		v.At.UTC().Format(time.RFC3339), strings.ToUpper(v.Verdict))
	for _, c := range v.Checks {
		fmt.Fprintf(w, "\n%s of %s (ifindex %d): %s\n", strings.ToUpper(c.Direction), c.Pod, c.Ifindex, strings.ToUpper(c.Verdict))
		fmt.Fprintf(w, "  why      %s\n", c.Why)
		if !c.Managed {
			continue
		}
		reason := c.Reason + "  (as its npagent.policy.verdicts counter names it)"
		if c.PolicyReason != "" {
			reason = c.Reason + "  (the policy alone: " + c.PolicyReason + ")"
		}
		var flags []string
		for _, f := range []struct {
			on   bool
			name string
		}{{c.Isolated, "isolated"}, {c.Admin, "admin tier"}, {c.Baseline, "baseline tier"}} {
			if f.on {
				flags = append(flags, f.name)
			}
		}
		if len(flags) == 0 {
			flags = append(flags, "no policy")
		}
		fmt.Fprintf(w, "  reason   %s\n", reason)
		fmt.Fprintf(w, "  state    generation %d: %s\n", c.Generation, strings.Join(flags, ", "))
		if c.Match != "" {
			fmt.Fprintf(w, "  entry    %s\n", c.Match)
		}
		if len(c.Objects) > 0 {
			tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "  OBJECT\tPOLICY\tRULE\tUID")
			for _, o := range c.Objects {
				rule := "-"
				if o.Rule >= 0 {
					rule = fmt.Sprint(o.Rule)
				}
				fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", objectName(o.Kind, o.Namespace, o.Name), orDash(o.Policy), rule, orDash(o.UID))
			}
			tw.Flush()
		}
	}
	if len(v.Notes) > 0 {
		fmt.Fprintln(w)
		for _, n := range v.Notes {
			fmt.Fprintf(w, "note: %s\n", n)
		}
	}
}
