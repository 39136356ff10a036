package fleet

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
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

// builtinRelay is `npagent relay` (the binary built for the run) with a
// self-signed serving certificate for 127.0.0.1 and the admin kubeconfig, on
// addresses chosen once, so it can be killed and started again where the agents
// look for it.
type builtinRelay struct {
	bin, kubeconfig           string
	listen, health            string
	certFile, keyFile, caFile string
}

func newBuiltinRelay(t testing.TB, bin, kubeconfig, dir string) *builtinRelay {
	t.Helper()
	certFile, keyFile, _ := testenv.SelfSignedLoopback(t, dir)
	return &builtinRelay{bin: bin, kubeconfig: kubeconfig, listen: testenv.FreeLoopbackAddr(t), health: testenv.FreeLoopbackAddr(t),
		certFile: certFile, keyFile: keyFile, caFile: certFile} // the certificate is its own CA
}

// start runs the relay, waits until it is ready and returns its process.
func (r *builtinRelay) start(t testing.TB) *exec.Cmd {
	t.Helper()
	cmd := startRelay(t, fmt.Sprintf("exec %s relay --kubeconfig=%s --listen=%s --health-addr=%s --tls-cert-file=%s --tls-key-file=%s",
		r.bin, r.kubeconfig, r.listen, r.health, r.certFile, r.keyFile), nil)
	testenv.Eventually(t, 2*time.Minute, "the relay ready", func() bool {
		resp, err := http.Get("http://" + r.health + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return cmd
}

// agentArgs points an agent at the relay.
func (r *builtinRelay) agentArgs() []string {
	return []string{"--relay-url=https://" + r.listen, "--relay-ca=" + r.caFile}
}
