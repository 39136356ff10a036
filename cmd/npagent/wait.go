package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/npagent/npagent/internal/explain"
	"github.com/npagent/npagent/internal/podcond"
	"github.com/npagent/npagent/internal/report"
)

// policyRefs is --policy, repeatable: namespace/name of a NetworkPolicy (the
// policyRef of PolicyEndpoints), or a bare name of a cluster policy (the policyRef
// of ClusterPolicyEndpoints).
type policyRefs []policyRef

type policyRef struct {
	kind            report.Kind
	namespace, name string
}

func (p policyRef) String() string {
	if p.kind == report.KindClusterPolicyEndpoint {
		return "cluster policy " + p.name
	}
	return "policy " + p.namespace + "/" + p.name
}

func (r *policyRefs) String() string {
	s := make([]string, len(*r))
	for i, p := range *r {
		s[i] = p.String()
	}
	return strings.Join(s, ", ")
}

func (r *policyRefs) Set(v string) error {
	parts := strings.Split(v, "/")
	switch {
	case len(parts) == 2 && parts[0] != "" && parts[1] != "":
		*r = append(*r, policyRef{kind: report.KindPolicyEndpoint, namespace: parts[0], name: parts[1]})
	case len(parts) == 1 && parts[0] != "":
		*r = append(*r, policyRef{kind: report.KindClusterPolicyEndpoint, name: parts[0]})
	default:
		return fmt.Errorf("%q: want <namespace>/<name> (a NetworkPolicy) or <name> (a cluster policy)", v)
	}
	return nil
}

// selected reports whether an object of the policy lists the pod and is programmed.
func (p policyRef) selected(pod *explain.PodExplain) bool {
	for _, o := range pod.Objects {
		if o.Lists && o.Programmed && o.Kind == p.kind.String() && o.PolicyRef == p.name &&
			(p.kind == report.KindClusterPolicyEndpoint || o.Namespace == p.namespace) {
			return true
		}
	}
	return false
}

// runWait is `npagent wait`: block until the agent on this node has programmed
// every object selecting the pod (and, with --policy, until those policies select
// it), or the timeout.
func runWait(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	w, err := parseWaitArgs(args, getenv, stderr)
	if err != nil {
		return err
	}
	if w.cluster {
		return pollCluster(ctx, w.kubeconfig, w.pod, w.timeout, w.interval, stdout, stderr)
	}
	return w.poll(ctx, stdout, stderr)
}

// waitArgs is `npagent wait`'s command line, checked.
type waitArgs struct {
	socket            string
	path, what        string // the debug API's path for the pod; the pod, for messages
	timeout, interval time.Duration
	policies          policyRefs
	// cluster: read the pod's condition through the apiserver (kubeconfig), not
	// the node's agent.
	cluster         bool
	kubeconfig, pod string
}

// parseWaitArgs parses and checks `npagent wait`'s command line: flag.ErrHelp after
// printing usage, an exitError with exitUsage for a bad one.
func parseWaitArgs(args []string, getenv func(string) string, stderr io.Writer) (waitArgs, error) {
	fs := flag.NewFlagSet("npagent wait", flag.ContinueOnError)
	fs.SetOutput(stderr)
	socket := fs.String("debug-socket", debugSocketDefault(getenv), "the agent's debug socket [$"+flagEnv["debug-socket"]+"]")
	podName := fs.String("pod", "", "the pod, as <namespace>/<name>")
	podIP := fs.String("ip", "", "the pod, by IP")
	timeout := fs.Duration("timeout", 2*time.Minute, "give up after this long")
	interval := fs.Duration("interval", 250*time.Millisecond, "how often to ask the agent")
	cluster := fs.Bool("cluster", false, "read the pod's condition "+podcond.Type+" through the apiserver instead of asking this node's agent: from anywhere, no root, no hostPath (--pod only)")
	kubeconfig := fs.String("kubeconfig", getenv("KUBECONFIG"), "with --cluster: kubeconfig file [$KUBECONFIG]; empty: ~/.kube/config, then the in-cluster configuration")
	var policies policyRefs
	fs.Var(&policies, "policy", "also wait until this policy selects the pod: <namespace>/<name> of a NetworkPolicy, or <name> of a cluster policy (repeatable)")
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: npagent wait (--pod <namespace>/<name> | --ip <address>) [--policy <namespace>/<name>]... [--timeout D]
       npagent wait --cluster --pod <namespace>/<name> [--timeout D] [--kubeconfig F]

Blocks until the npagent on this node has programmed, for the pod, the current
version of every policy object that applies to it (after the agent's caches
synced). A pod no object selects is programmed at once (nothing to enforce): when
the pod may start before its policy exists, name the policy with --policy, and
wait also waits until an object of that policy selects the pod. The agent is asked
over its debug socket every --interval, and asked again when it does not answer
(it may be restarting).

With --cluster, it reads instead the condition `+podcond.Type+` the pod's
agent writes (docs/how-to/pod-status.md) through the apiserver, until it is True: from
anywhere (an init container needs neither root nor a hostPath).

Exit: 0 programmed, 1 timed out, 2 usage, 3 agent (or with --cluster, apiserver)
unreachable (no answer at the timeout).

Flags:
`)
		fs.PrintDefaults()
	}
	pos, err := parseInterspersed(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return waitArgs{}, err
	}
	if err != nil {
		return waitArgs{}, exitError{exitUsage, err}
	}
	w := waitArgs{socket: *socket, timeout: *timeout, interval: *interval, policies: policies,
		cluster: *cluster, kubeconfig: *kubeconfig, pod: *podName}
	switch {
	case len(pos) > 0:
		err = fmt.Errorf("wait: unexpected argument %q", pos[0])
	case *cluster && (*podIP != "" || len(policies) > 0 || *podName == ""):
		err = errors.New("wait: --cluster takes --pod only (the condition covers every object the pod's agent holds; --ip and --policy ask the node's agent)")
	case (*podName == "") == (*podIP == ""):
		err = errors.New("wait: give one of --pod or --ip")
	default:
		w.path, w.what, err = waitTarget(*podName, *podIP)
	}
	if err == nil && *timeout <= 0 {
		err = fmt.Errorf("wait: --timeout %v: need a positive duration", *timeout)
	}
	if err == nil && *interval <= 0 {
		err = fmt.Errorf("wait: --interval %v: need a positive duration", *interval)
	}
	if err != nil {
		return waitArgs{}, exitError{exitUsage, err}
	}
	return w, nil
}

// waitTarget is the debug API's path for the pod named by --ip (when given) or
// --pod, and the pod as messages name it.
func waitTarget(podName, podIP string) (path, what string, err error) {
	if podIP != "" {
		ip, err := netip.ParseAddr(podIP)
		if err != nil {
			return "", "", fmt.Errorf("wait: --ip %q is not an IP address", podIP)
		}
		return "/v1/podip/" + ip.String(), "pod " + ip.String(), nil
	}
	ns, name, ok := strings.Cut(podName, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("wait: --pod %q: want <namespace>/<name>", podName)
	}
	return "/v1/pod/" + url.PathEscape(ns) + "/" + url.PathEscape(name), "pod " + podName, nil
}

// poll asks the agent every interval until the pod is programmed (nil), ctx ends
// (exitNotProgrammed: interrupted) or the timeout passes: exitUnreachable when the
// agent never answered at the end, exitNotProgrammed with what the pod still waits
// for otherwise. Each new status is printed on stderr.
func (w waitArgs) poll(ctx context.Context, stdout, stderr io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	c := explain.NewClient(w.socket)
	start := time.Now()
	var (
		lastErr    error
		lastStatus string
		pod        explain.PodExplain
	)
	for {
		err := c.Get(ctx, w.path, &pod)
		if err != nil && ctx.Err() != nil {
			break // cut short by the timeout: the previous answer stands
		}
		lastErr = err
		if err != nil {
			lastStatus = logStatus(stderr, lastStatus, err.Error())
		} else {
			status := waitStatus(&pod, w.policies)
			if status == "" {
				fmt.Fprintf(stdout, "%s programmed on node %s after %s: %s\n", w.what, pod.Node, dur(time.Since(start)), objectsLine(&pod))
				return nil
			}
			lastStatus = logStatus(stderr, lastStatus, status)
		}
		t := time.NewTimer(w.interval)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
			continue
		}
		break
	}
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return exitError{exitNotProgrammed, fmt.Errorf("wait: %s: interrupted: %s", w.what, lastStatus)}
	}
	if lastErr == nil && lastStatus == "" { // the only request was cut short
		lastErr = fmt.Errorf("%w: no answer from %s", explain.ErrUnreachable, w.socket)
	}
	if errors.Is(lastErr, explain.ErrUnreachable) {
		return exitError{exitUnreachable, fmt.Errorf("wait: %s: timed out after %v: %w", w.what, w.timeout, lastErr)}
	}
	return exitError{exitNotProgrammed, fmt.Errorf("wait: %s: not programmed after %v: %s", w.what, w.timeout, lastStatus)}
}

// logStatus prints status when it differs from the last one, and returns it.
func logStatus(w io.Writer, last, status string) string {
	if status != last {
		fmt.Fprintf(w, "waiting: %s\n", status)
	}
	return status
}

// waitStatus says what the pod still waits for; "" when nothing.
func waitStatus(pod *explain.PodExplain, policies policyRefs) string {
	switch {
	case !pod.Synced:
		return "the agent's informer caches have not synced"
	case !pod.OnNode:
		return fmt.Sprintf("the objects place the pod on host %s, not node %s", pod.HostIP, pod.Node)
	}
	var missing []string
	for _, p := range policies {
		if !p.selected(pod) {
			missing = append(missing, p.String()+" does not select the pod yet (or is not programmed)")
		}
	}
	for _, o := range pod.Objects {
		if !o.Programmed {
			missing = append(missing, fmt.Sprintf("%s: %s", objectName(o.Kind, o.Namespace, o.Name), o.State))
		}
	}
	if len(missing) > 0 {
		return strings.Join(missing, "; ")
	}
	if !pod.Programmed {
		return "not programmed"
	}
	return ""
}

func objectsLine(pod *explain.PodExplain) string {
	if len(pod.Objects) == 0 {
		return "no policy object selects it"
	}
	s := make([]string, len(pod.Objects))
	for i, o := range pod.Objects {
		s[i] = objectName(o.Kind, o.Namespace, o.Name) + "@" + o.ResourceVersion
	}
	return strings.Join(s, ", ")
}
