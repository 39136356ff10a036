package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/podcond"
)

// `npagent status` and `npagent wait --cluster` read the pod condition the agents
// write (internal/podcond) through the apiserver: any kubeconfig, no node access,
// no new API.

// exitNotFound: status found no such pod or policy.
const exitNotFound = 4

// podStatus is one pod's condition as status prints it (--json).
type podStatus struct {
	Pod                string    `json:"pod"`
	Node               string    `json:"node"`
	Programmed         bool      `json:"programmed"`
	Status             string    `json:"status"` // True, False, or Unknown (no condition yet)
	Reason             string    `json:"reason,omitempty"`
	Message            string    `json:"message,omitempty"`
	LastTransitionTime time.Time `json:"lastTransitionTime,omitzero"`
}

// policyStatus is a policy's programming over the pods it selects (--json).
type policyStatus struct {
	Policy     string      `json:"policy"`
	Objects    []string    `json:"objects"` // its PolicyEndpoints (chunks)
	Selected   int         `json:"selected"`
	Programmed int         `json:"programmed"`
	Nodes      int         `json:"nodes"`
	Pending    []podStatus `json:"pending,omitempty"` // selected pods not programmed
}

func statusOf(p *corev1.Pod) podStatus {
	s := podStatus{Pod: p.Namespace + "/" + p.Name, Node: p.Spec.NodeName, Status: "Unknown", Message: "no " + podcond.Type + " condition yet (the node's agent has not written it: --pod-condition off, or the pod has no IP yet)"}
	for _, c := range p.Status.Conditions {
		if c.Type == podcond.Type {
			s.Status, s.Reason, s.Message, s.LastTransitionTime = string(c.Status), c.Reason, c.Message, c.LastTransitionTime.Time
			s.Programmed = s.Status == podcond.True
		}
	}
	return s
}

func (s podStatus) String() string {
	state := "not programmed"
	if s.Programmed {
		state = "programmed"
	}
	reason := s.Status
	if s.Reason != "" {
		reason = s.Reason
	}
	return fmt.Sprintf("pod %s on node %s: %s (%s): %s", s.Pod, s.Node, state, reason, s.Message)
}

// statusClient reads pods and PolicyEndpoints through kubeconfig (empty: $KUBECONFIG,
// ~/.kube/config, then the in-cluster configuration).
func statusClient(kubeconfig string) (client.Client, error) {
	var rc *rest.Config
	var err error
	if kubeconfig != "" {
		rc, err = loadRESTConfig(kubeconfig)
	} else {
		rc, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(clientcmd.NewDefaultClientConfigLoadingRules(), nil).ClientConfig()
		if err != nil {
			err = fmt.Errorf("no kubeconfig ($KUBECONFIG, ~/.kube/config) and no in-cluster configuration (%v): pass --kubeconfig", err)
		}
	}
	if err != nil {
		return nil, err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	return client.New(rc, client.Options{Scheme: scheme})
}

// readError is an apiserver error as a status exit: not found (4), else unreachable (3).
func readError(what string, err error) error {
	if apierrors.IsNotFound(err) {
		return exitError{exitNotFound, fmt.Errorf("%s: not found", what)}
	}
	return exitError{exitUnreachable, fmt.Errorf("%s: read through the apiserver: %w", what, err)}
}

// runStatus is `npagent status pod|policy <namespace>/<name>`.
func runStatus(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("npagent status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	kubeconfig := fs.String("kubeconfig", getenv("KUBECONFIG"), "kubeconfig file [$KUBECONFIG]; empty: ~/.kube/config, then the in-cluster configuration")
	asJSON := fs.Bool("json", false, "print JSON")
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: npagent status (pod|policy) <namespace>/<name> [--json] [--kubeconfig F]

Reads the condition `+podcond.Type+` that each node's agent writes on its pods,
through the apiserver (any kubeconfig that may get pods and list PolicyEndpoints;
no node access). pod: that pod's condition. policy: the NetworkPolicy's
PolicyEndpoints, the pods they select and how many of them are programmed.

Exit: 0 programmed (every selected pod), 1 not programmed, 2 usage, 3 apiserver
unreachable or refusing, 4 no such pod or policy.

Flags:
`)
		fs.PrintDefaults()
	}
	pos, err := parseInterspersed(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	if err == nil && len(pos) != 2 {
		err = errors.New("status: want pod or policy, then <namespace>/<name>")
	}
	var ns, name string
	if err == nil {
		var ok bool
		ns, name, ok = strings.Cut(pos[1], "/")
		if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			err = fmt.Errorf("status: %q: want <namespace>/<name>", pos[1])
		} else if pos[0] != "pod" && pos[0] != "policy" {
			err = fmt.Errorf("status: %q: want pod or policy", pos[0])
		}
	}
	if err != nil {
		return exitError{exitUsage, err}
	}
	c, err := statusClient(*kubeconfig)
	if err != nil {
		return exitError{exitUsage, err}
	}
	var out any
	programmed := false
	if pos[0] == "pod" {
		var p corev1.Pod
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &p); err != nil {
			return readError("pod "+pos[1], err)
		}
		s := statusOf(&p)
		out, programmed = s, s.Programmed
	} else {
		s, err := readPolicyStatus(ctx, c, ns, name)
		if err != nil {
			return err
		}
		out, programmed = s, s.Programmed == s.Selected
	}
	if *asJSON {
		b, _ := json.MarshalIndent(out, "", "  ")
		fmt.Fprintln(stdout, string(b))
	} else {
		fmt.Fprintln(stdout, out)
	}
	if !programmed {
		return exitError{exitNotProgrammed, nil}
	}
	return nil
}

// readPolicyStatus reads the NetworkPolicy ns/name's PolicyEndpoints and the
// conditions of the pods they select.
func readPolicyStatus(ctx context.Context, c client.Client, ns, name string) (policyStatus, error) {
	what := "policy " + ns + "/" + name
	var pes v1alpha1.PolicyEndpointList
	if err := c.List(ctx, &pes, client.InNamespace(ns)); err != nil {
		return policyStatus{}, readError(what, err)
	}
	s := policyStatus{Policy: ns + "/" + name}
	selected := map[string]bool{}
	for _, pe := range pes.Items {
		if pe.Spec.PolicyRef.Name != name {
			continue
		}
		s.Objects = append(s.Objects, "PolicyEndpoint "+pe.Namespace+"/"+pe.Name)
		for _, ep := range pe.Spec.PodSelectorEndpoints {
			selected[ep.Name] = true
		}
	}
	if len(s.Objects) == 0 {
		return s, exitError{exitNotFound, fmt.Errorf("%s: no PolicyEndpoint has it as spec.policyRef (no such NetworkPolicy, or the controller has not written it yet)", what)}
	}
	sort.Strings(s.Objects)
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(ns)); err != nil {
		return s, readError(what, err)
	}
	nodes := map[string]bool{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if !selected[p.Name] {
			continue
		}
		s.Selected++
		nodes[p.Spec.NodeName] = true
		if ps := statusOf(p); ps.Programmed {
			s.Programmed++
		} else {
			s.Pending = append(s.Pending, ps)
		}
	}
	s.Nodes = len(nodes)
	slices.SortFunc(s.Pending, func(a, b podStatus) int { return strings.Compare(a.Pod, b.Pod) })
	return s, nil
}

func (s policyStatus) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "policy %s: programmed on %d of %d selected pods across %d nodes (%s)", s.Policy, s.Programmed, s.Selected, s.Nodes, strings.Join(s.Objects, ", "))
	for _, p := range s.Pending {
		fmt.Fprintf(&b, "\n  pending: %s", p)
	}
	return b.String()
}

// pollCluster is `npagent wait --cluster`: poll the pod's condition through the
// apiserver until it is True (nil), or the timeout (exitNotProgrammed with the last
// condition; exitUnreachable when the apiserver never answered).
func pollCluster(ctx context.Context, kubeconfig, pod string, timeout, interval time.Duration, stdout, stderr io.Writer) error {
	ns, name, _ := strings.Cut(pod, "/")
	c, err := statusClient(kubeconfig)
	if err != nil {
		return exitError{exitUsage, err}
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	var lastErr error
	last := ""
	for {
		var p corev1.Pod
		lastErr = c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &p)
		if lastErr == nil {
			s := statusOf(&p)
			if s.Programmed {
				fmt.Fprintf(stdout, "pod %s programmed on node %s after %s: %s\n", pod, s.Node, dur(time.Since(start)), s.Message)
				return nil
			}
			last = logStatus(stderr, last, s.String())
		} else if ctx.Err() == nil {
			last = logStatus(stderr, last, lastErr.Error())
		}
		t := time.NewTimer(interval)
		select {
		case <-ctx.Done():
			t.Stop()
			if lastErr != nil && !apierrors.IsNotFound(lastErr) {
				return exitError{exitUnreachable, fmt.Errorf("wait: pod %s: the apiserver did not answer within %v: %v", pod, timeout, lastErr)}
			}
			return exitError{exitNotProgrammed, fmt.Errorf("wait: pod %s not programmed after %v: %s", pod, timeout, last)}
		case <-t.C:
		}
	}
}
