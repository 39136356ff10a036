package e2enode

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
)

// Exec runs argv in the pod's first container through the apiserver and the kubelet's
// streaming server (kubectl exec's path) and returns its stdout and stderr and whether
// it exited 0.
func (n *Node) Exec(t *testing.T, pod *corev1.Pod, argv ...string) (string, error) {
	t.Helper()
	return n.ExecFor(t, pod, 30*time.Second, argv...)
}

// ExecFor is Exec for a command that may run up to timeout.
func (n *Node) ExecFor(t *testing.T, pod *corev1.Pod, timeout time.Duration, argv ...string) (string, error) {
	t.Helper()
	req := n.Kube.CoreV1().RESTClient().Post().Resource("pods").Namespace(pod.Namespace).Name(pod.Name).
		SubResource("exec").VersionedParams(&corev1.PodExecOptions{
		Container: pod.Spec.Containers[0].Name,
		Command:   argv,
		Stdout:    true,
		Stderr:    true,
	}, scheme.ParameterCodec)
	ex, err := remotecommand.NewSPDYExecutor(n.CP.Config, "POST", req.URL())
	if err != nil {
		t.Fatalf("exec %s: %v", pod.Name, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out, errb bytes.Buffer
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &out, Stderr: &errb})
	s := out.String() + errb.String()
	if err != nil {
		return s, fmt.Errorf("%w: %s", err, s)
	}
	return s, nil
}

// Connect reports whether pod from reaches addr (ip:port) over proto ("tcp" or
// "udp"), trying once from inside the pod (workload connect, 1 s timeout).
func (n *Node) Connect(t *testing.T, from *corev1.Pod, proto, addr string) bool {
	t.Helper()
	_, err := n.Exec(t, from, "/workload", "connect", proto, addr)
	return err == nil
}
