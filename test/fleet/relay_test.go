package fleet

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/testenv"
)

// agentAccount is the agents' service account (namespace bench): each agent
// authenticates as it with a token bound to a pod on its node, as the kubelet mounts
// one, whichever variant runs, so the two variants differ only in the relay.
const agentAccount = "npagent"

// agentKubeconfigs gives every node's agent a kubeconfig of its own: the
// apiserver, with a token of agentAccount bound to a pod on the node (the relay
// reads the node from it). The account may read what an agent reads.
func agentKubeconfigs(t *testing.T, cs kubernetes.Interface, rc *rest.Config, dir string, nodes []*node) map[string]string {
	t.Helper()
	ctx := context.Background()
	const ns = "bench"
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: agentAccount}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("service account: %v", err)
	}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "fleet-agent"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{v1alpha1.GroupName}, Resources: []string{"policyendpoints", "clusterpolicyendpoints"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch"}},
		}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("cluster role: %v", err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "fleet-agent"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "fleet-agent"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: agentAccount, Namespace: ns}}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("cluster role binding: %v", err)
	}
	out := map[string]string{}
	expiry := int64(6 * 3600)
	for _, n := range nodes {
		p, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "agent-" + n.name},
			Spec: corev1.PodSpec{NodeName: n.name, ServiceAccountName: agentAccount,
				Containers: []corev1.Container{{Name: "agent", Image: "example.invalid/npagent"}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("agent pod on %s: %v", n.name, err)
		}
		tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, agentAccount, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: &expiry,
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("token for the agent on %s: %v", n.name, err)
		}
		cfg := clientcmdapi.NewConfig()
		cfg.Clusters["fleet"] = &clientcmdapi.Cluster{Server: rc.Host, CertificateAuthorityData: rc.CAData}
		cfg.AuthInfos["agent"] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
		cfg.Contexts["fleet"] = &clientcmdapi.Context{Cluster: "fleet", AuthInfo: "agent"}
		cfg.CurrentContext = "fleet"
		path := filepath.Join(dir, n.name, "kubeconfig")
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := clientcmd.WriteToFile(*cfg, path); err != nil {
			t.Fatal(err)
		}
		out[n.name] = path
	}
	return out
}

// startBuiltinRelay runs `npagent relay` (the binary built for the run) with a
// self-signed serving certificate for 127.0.0.1 and the admin kubeconfig, waits
// until it is ready, and returns its pid and the agents' relay arguments.
func startBuiltinRelay(t *testing.T, bin, kubeconfig, dir string) (int, []string) {
	t.Helper()
	certFile, keyFile, _ := testenv.SelfSignedLoopback(t, dir)
	caFile := certFile // the certificate is its own CA
	listen, health := testenv.FreeLoopbackAddr(t), testenv.FreeLoopbackAddr(t)
	pid := startRelay(t, fmt.Sprintf("exec %s relay --kubeconfig=%s --listen=%s --health-addr=%s --tls-cert-file=%s --tls-key-file=%s",
		bin, kubeconfig, listen, health, certFile, keyFile), nil)
	testenv.Eventually(t, 2*time.Minute, "the relay ready", func() bool {
		r, err := http.Get("http://" + health + "/readyz")
		if err != nil {
			return false
		}
		r.Body.Close()
		return r.StatusCode == http.StatusOK
	})
	return pid, []string{"--relay-url=https://" + listen, "--relay-ca=" + caFile}
}
