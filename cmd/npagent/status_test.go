package main

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/podcond"
	"github.com/npagent/npagent/internal/testenv"
)

// TestStatusThroughAPIServer: npagent status and npagent wait --cluster read the
// pod condition through a real apiserver with a plain kubeconfig: exit 0 when
// programmed, 1 when not, 4 when there is no such pod or policy; --json.
func TestStatusThroughAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs kube-apiserver and etcd")
	}
	cp := testenv.Start(t)
	ctx := context.Background()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	testenv.WriteKubeconfig(t, cp.Config, kubeconfig)
	const ns = "shop"
	if err := cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	setCondition := func(name, node, status, reason, msg string) {
		t.Helper()
		p := &corev1.Pod{}
		if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, p); err != nil {
			p = &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
				Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}}}
			if err := cp.Client.Create(ctx, p); err != nil {
				t.Fatal(err)
			}
		}
		p.Status.Conditions = []corev1.PodCondition{{Type: podcond.Type, Status: corev1.ConditionStatus(status), Reason: reason, Message: msg, LastTransitionTime: metav1.Now()}}
		if err := cp.Client.Status().Update(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	setCondition("web-0", "node-a", podcond.True, podcond.ReasonProgrammed, "programmed: PolicyEndpoint shop/web-x")
	setCondition("web-1", "node-b", podcond.False, podcond.ReasonPending, "not programmed yet: PolicyEndpoint shop/web-y")
	for _, pe := range []*v1alpha1.PolicyEndpoint{
		{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-x"}, Spec: v1alpha1.PolicyEndpointSpec{PolicyRef: v1alpha1.PolicyReference{Name: "web", Namespace: ns},
			PodSelectorEndpoints: []v1alpha1.PodEndpoint{{HostIP: "192.0.2.1", PodIP: "10.0.0.1", Name: "web-0", Namespace: ns}}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-y"}, Spec: v1alpha1.PolicyEndpointSpec{PolicyRef: v1alpha1.PolicyReference{Name: "web", Namespace: ns},
			PodSelectorEndpoints: []v1alpha1.PodEndpoint{{HostIP: "192.0.2.2", PodIP: "10.0.0.2", Name: "web-1", Namespace: ns}}}},
	} {
		if err := cp.Client.Create(ctx, pe); err != nil {
			t.Fatal(err)
		}
	}
	npagent := func(args ...string) (string, int) {
		var out, errOut bytes.Buffer
		err := run(ctx, append(args, "--kubeconfig", kubeconfig), func(string) string { return "" }, &out, &errOut)
		return out.String() + errOut.String(), exitCode(err)
	}
	for _, tc := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"status", "pod", "shop/web-0"}, 0, "pod shop/web-0 on node node-a: programmed (Programmed): programmed: PolicyEndpoint shop/web-x"},
		{[]string{"status", "pod", "shop/web-1"}, 1, "not programmed (Pending)"},
		{[]string{"status", "pod", "shop/absent"}, 4, ""},
		{[]string{"status", "policy", "shop/web"}, 1, "policy shop/web: programmed on 1 of 2 selected pods across 2 nodes (PolicyEndpoint shop/web-x, PolicyEndpoint shop/web-y)\n  pending: pod shop/web-1 on node node-b"},
		{[]string{"status", "policy", "shop/absent"}, 4, ""},
		{[]string{"status", "pod", "web-0"}, 2, ""},
		{[]string{"wait", "--cluster", "--pod", "shop/web-0", "--timeout", "5s"}, 0, "pod shop/web-0 programmed on node node-a"},
		{[]string{"wait", "--cluster", "--pod", "shop/web-1", "--timeout", "1s", "--interval", "100ms"}, 1, "Pending"},
		{[]string{"wait", "--cluster", "--ip", "10.0.0.1"}, 2, ""},
	} {
		out, code := npagent(tc.args...)
		if code != tc.code || !strings.Contains(out, tc.says) {
			t.Errorf("npagent %s: exit %d, output %q; want exit %d saying %q", strings.Join(tc.args, " "), code, out, tc.code, tc.says)
		}
	}
	out, code := npagent("status", "--json", "policy", "shop/web")
	var s policyStatus
	if err := json.Unmarshal([]byte(out), &s); err != nil || code != 1 || s.Selected != 2 || s.Programmed != 1 || len(s.Pending) != 1 || s.Pending[0].Reason != podcond.ReasonPending {
		t.Errorf("status --json policy: exit %d, %+v (%v) from %q", code, s, err, out)
	}

	// wait --cluster returns once the agent writes True.
	go func() {
		time.Sleep(500 * time.Millisecond)
		setCondition("web-1", "node-b", podcond.True, podcond.ReasonProgrammed, "programmed: PolicyEndpoint shop/web-y")
	}()
	if out, code := npagent("wait", "--cluster", "--pod", "shop/web-1", "--timeout", "20s", "--interval", "100ms"); code != 0 {
		t.Errorf("wait --cluster for a pod turning programmed: exit %d: %s", code, out)
	}
}
