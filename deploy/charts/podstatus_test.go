package charts

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/npagent/npagent/internal/podcond"
	"github.com/npagent/npagent/internal/testenv"
)

// TestPodStatusAdmission: the chart's RBAC and ValidatingAdmissionPolicy on a real
// apiserver, exercised with real service-account tokens bound to a Node (the
// apiserver puts the node's name in the user's extra, as for the pod-bound token the
// kubelet mounts): the agent patches its condition on its own node's pods; another
// node's pod, another condition type, a token bound to no node are refused.
func TestPodStatusAdmission(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs kube-apiserver and etcd")
	}
	cp := testenv.Start(t, testenv.WithCRDDir(testenv.UpstreamCRDDir(t)))
	ctx := context.Background()
	c := testCase{"defaults", Release{"npagent", "npagent"}, nil}
	objs := objects(t, render(t, c))
	if err := cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.rel.Namespace}}); err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, o := range objs {
		switch o.GetKind() {
		case "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
			if err := cp.Client.Create(ctx, o); err != nil {
				t.Fatalf("create %s %s: %v", o.GetKind(), o.GetName(), err)
			}
			kinds = append(kinds, o.GetKind())
		}
	}
	if !strings.Contains(strings.Join(kinds, ","), "ValidatingAdmissionPolicyBinding") {
		t.Fatalf("the chart rendered no ValidatingAdmissionPolicyBinding (rendered %v)", kinds)
	}
	cr := typed[rbacv1.ClusterRole](t, objs, "ClusterRole")
	wantRule := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods/status"}, Verbs: []string{"patch"}}
	found := false
	for _, r := range cr.Rules {
		found = found || (strings.Join(r.Resources, ",") == "pods/status" && strings.Join(r.Verbs, ",") == "patch")
	}
	if !found {
		t.Errorf("ClusterRole rules %+v lack %+v", cr.Rules, wantRule)
	}
	sa := typed[corev1.ServiceAccount](t, objs, "ServiceAccount")

	admin := kubernetes.NewForConfigOrDie(cp.Config)
	nodes := map[string]*corev1.Node{}
	for _, name := range []string{"node-a", "node-b"} {
		n, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		nodes[name] = n
	}
	pods := map[string]*corev1.Pod{}
	for name, node := range map[string]string{"mine": "node-a", "theirs": "node-b"} {
		p, err := admin.CoreV1().Pods("default").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pods[name] = p
	}
	// A token as the agent's pod on node-a holds one, and one bound to nothing.
	token := func(bound *authenticationv1.BoundObjectReference) *kubernetes.Clientset {
		tr, err := admin.CoreV1().ServiceAccounts(sa.Namespace).CreateToken(ctx, sa.Name, &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{BoundObjectRef: bound}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("token request: %v", err)
		}
		cfg := rest.AnonymousClientConfig(cp.Config)
		cfg.BearerToken = tr.Status.Token
		return kubernetes.NewForConfigOrDie(cfg)
	}
	nodeA := token(&authenticationv1.BoundObjectReference{Kind: "Node", APIVersion: "v1", Name: "node-a", UID: nodes["node-a"].UID})
	unbound := token(nil)

	patch := func(cs *kubernetes.Clientset, pod, condType string) error {
		body, _ := json.Marshal(map[string]any{
			"metadata": map[string]any{"uid": pods[pod].UID},
			"status": map[string]any{"conditions": []corev1.PodCondition{{Type: corev1.PodConditionType(condType),
				Status: corev1.ConditionTrue, Reason: podcond.ReasonProgrammed, LastTransitionTime: metav1.Now()}}},
		})
		_, err := cs.CoreV1().Pods("default").Patch(ctx, pod, types.StrategicMergePatchType, body, metav1.PatchOptions{}, "status")
		return err
	}
	// The policy takes effect once the apiserver has loaded it: wait for the first
	// refusal, then check every case.
	testenv.Eventually(t, 30*time.Second, "the admission policy refuses another node's pod", func() bool {
		return apierrors.IsForbidden(patch(nodeA, "theirs", podcond.Type))
	})
	if err := patch(nodeA, "mine", podcond.Type); err != nil {
		t.Errorf("the agent on node-a patching %s on its own pod: %v", podcond.Type, err)
	}
	for _, tc := range []struct {
		name     string
		cs       *kubernetes.Clientset
		pod, typ string
		says     string
	}{
		{"another node's pod", nodeA, "theirs", podcond.Type, `this pod is on node 'node-b', the token is bound to node 'node-a'`},
		{"another condition type", nodeA, "mine", string(corev1.PodReady), "only its own pod condition"},
		{"a token bound to no node", unbound, "mine", podcond.Type, `the token is bound to node ''`},
	} {
		err := patch(tc.cs, tc.pod, tc.typ)
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: err = %v, want Forbidden saying %q", tc.name, err, tc.says)
		}
	}
	got, err := admin.CoreV1().Pods("default").Get(ctx, "mine", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cond := range got.Status.Conditions {
		if cond.Type == corev1.PodReady {
			t.Errorf("the refused patch wrote %s", cond.Type)
		}
	}
	// Nor other parts of the status: the containers' statuses, the pod's message.
	for name, body := range map[string]string{
		"a container's status": `{"status":{"containerStatuses":[{"name":"c","ready":true,"restartCount":0,"image":"x","imageID":"","started":true,"state":{"running":{}}}]}}`,
		"the pod's message":    `{"status":{"message":"all is well"}}`,
	} {
		_, err := nodeA.CoreV1().Pods("default").Patch(ctx, "mine", types.StrategicMergePatchType, []byte(body), metav1.PatchOptions{}, "status")
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "not the containers' statuses or the pod's message") {
			t.Errorf("patch %s: err = %v, want Forbidden", name, err)
		}
	}
	// RBAC: the agent may not patch pods themselves, nor other subresources.
	if _, err := nodeA.CoreV1().Pods("default").Patch(ctx, "mine", types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("patch a pod's labels: err = %v, want Forbidden", err)
	}
}
