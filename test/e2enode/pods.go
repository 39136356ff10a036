package e2enode

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
)

// WaitPod polls pod ns/name until check accepts it and returns it; on timeout the
// test fails with check's last error and the pod's events.
func (n *Node) WaitPod(t *testing.T, ns, name string, timeout time.Duration, check func(*corev1.Pod) error) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	n.waitFor(t, "pod "+ns+"/"+name, timeout, func() error {
		p, err := n.Kube.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if err := check(p); err != nil {
			return fmt.Errorf("%w; events: %s", err, n.events(ns, name))
		}
		pod = p
		return nil
	})
	return pod
}

// errPending describes why a pod is not there yet: phase, conditions, container states.
func errPending(p *corev1.Pod) error {
	var b strings.Builder
	fmt.Fprintf(&b, "phase %s ip %q", p.Status.Phase, p.Status.PodIP)
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			fmt.Fprintf(&b, "; %s=%s %s", c.Type, c.Status, c.Message)
		}
	}
	for _, cs := range p.Status.ContainerStatuses {
		switch {
		case cs.State.Waiting != nil:
			fmt.Fprintf(&b, "; %s waiting %s: %s", cs.Name, cs.State.Waiting.Reason, cs.State.Waiting.Message)
		case cs.State.Terminated != nil:
			fmt.Fprintf(&b, "; %s terminated %s (exit %d): %s", cs.Name, cs.State.Terminated.Reason, cs.State.Terminated.ExitCode, cs.State.Terminated.Message)
		}
	}
	return fmt.Errorf("%s", b.String())
}

func (n *Node) events(ns, name string) string {
	evs, err := n.Kube.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("involvedObject.name", name).String(),
	})
	if err != nil {
		return err.Error()
	}
	var parts []string
	for _, e := range evs.Items {
		parts = append(parts, fmt.Sprintf("%s %s: %s", e.Type, e.Reason, e.Message))
	}
	if len(parts) > 5 {
		parts = parts[len(parts)-5:]
	}
	return strings.Join(parts, " | ")
}
