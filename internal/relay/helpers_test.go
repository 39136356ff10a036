package relay

import (
	"context"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// testRelay is a Relay served over TLS on a fixed loopback address, so it can be
// stopped and started again where its clients look for it.
type testRelay struct {
	t      testing.TB
	cp     *testenv.ControlPlane
	cfg    Config
	addr   string
	url    string
	caFile string

	mu     sync.Mutex
	relay  *Relay
	srv    *httptest.Server
	cancel context.CancelFunc
	done   chan struct{}
}

// startRelay runs a relay against cp until the test ends and waits until it is ready.
func startRelay(t testing.TB, cp *testenv.ControlPlane, cfg Config) *testRelay {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t).With("component", "relay")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tr := &testRelay{t: t, cp: cp, cfg: cfg, addr: l.Addr().String()}
	tr.url = "https://" + tr.addr
	tr.start(l)
	// httptest's TLS certificate is the same for every server: the CA stays valid
	// across a restart.
	der := tr.srv.Certificate().Raw
	tr.caFile = filepath.Join(t.TempDir(), "relay-ca.pem")
	if err := os.WriteFile(tr.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.stop)
	return tr
}

func (tr *testRelay) start(l net.Listener) {
	tr.t.Helper()
	r, err := New(tr.cp.Config, tr.cfg)
	if err != nil {
		tr.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := r.Run(ctx); err != nil {
			tr.t.Errorf("relay Run: %v", err)
		}
	}()
	srv := httptest.NewUnstartedServer(r.Handler())
	srv.Listener.Close()
	srv.Listener = l
	srv.StartTLS()
	tr.mu.Lock()
	tr.relay, tr.srv, tr.cancel, tr.done = r, srv, cancel, done
	tr.mu.Unlock()
	testenv.Eventually(tr.t, 30*time.Second, "relay ready", r.Ready)
}

// stop ends the relay and its connections (a crash, for its clients).
func (tr *testRelay) stop() {
	tr.mu.Lock()
	srv, cancel, done := tr.srv, tr.cancel, tr.done
	tr.srv = nil
	tr.mu.Unlock()
	if srv == nil {
		return
	}
	srv.CloseClientConnections()
	srv.Close()
	cancel()
	<-done
}

// agentIdentity is what an agent on a node holds: a token bound to its pod there.
type agentIdentity struct {
	node  string
	ip    string
	token string
}

// newNode creates a Node with ip as its InternalIP, a pod of the agent's service
// account on it, and a token bound to that pod (as the kubelet mounts one).
func newNode(t testing.TB, cp *testenv.ControlPlane, ns, node, ip string) agentIdentity {
	t.Helper()
	ctx := context.Background()
	cs := kubernetes.NewForConfigOrDie(cp.Config)
	ensureAgentAccount(t, cs, ns)
	n, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create node %s: %v", node, err)
	}
	t.Cleanup(func() { _ = cs.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}) })
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}, {Type: corev1.NodeHostName, Address: node}}
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("node %s status: %v", node, err)
	}
	p, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "agent-" + node},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: "agent",
			Containers: []corev1.Container{{Name: "agent", Image: "example.invalid/npagent"}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create agent pod on %s: %v", node, err)
	}
	return agentIdentity{node: node, ip: ip, token: token(t, cs, ns,
		&authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID})}
}

// token returns a token of the agent's service account, bound to bound (nil: none).
func token(t testing.TB, cs kubernetes.Interface, ns string, bound *authenticationv1.BoundObjectReference) string {
	t.Helper()
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), "agent", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{BoundObjectRef: bound}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token request: %v", err)
	}
	return tr.Status.Token
}

// ensureAgentAccount creates the service account "agent" in ns with the agent's
// read access to the policy endpoint objects.
func ensureAgentAccount(t testing.TB, cs kubernetes.Interface, ns string) {
	t.Helper()
	ctx := context.Background()
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "agent"}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "relay-test-agent"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{v1alpha1.GroupName},
			Resources: []string{"policyendpoints", "clusterpolicyendpoints"}, Verbs: []string{"get", "list", "watch"}}}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "relay-test-agent-" + ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "relay-test-agent"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "agent", Namespace: ns}}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// relayOnly is a rest.Config straight to the relay, with no fallback.
func relayOnly(tr *testRelay, id agentIdentity) *rest.Config {
	return &rest.Config{Host: tr.url, BearerToken: id.token, TLSClientConfig: rest.TLSClientConfig{CAFile: tr.caFile}}
}

func ptr[T any](v T) *T { return &v }

// pe is a PolicyEndpoint of policy in ns selecting pods (host IP → pod IP pairs),
// allowing ingress from cidr on port.
func pe(ns, name, policy string, cidr string, port int32, pods ...[2]string) *v1alpha1.PolicyEndpoint {
	var eps []v1alpha1.PodEndpoint
	for _, p := range pods {
		eps = append(eps, v1alpha1.PodEndpoint{HostIP: v1alpha1.NetworkAddress(p[0]), PodIP: v1alpha1.NetworkAddress(p[1]),
			Name: "p-" + p[1], Namespace: ns})
	}
	return &v1alpha1.PolicyEndpoint{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.PolicyEndpointSpec{
			PolicyRef:            v1alpha1.PolicyReference{Name: policy, Namespace: ns},
			PodIsolation:         []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			PodSelectorEndpoints: eps,
			Ingress:              []v1alpha1.EndpointInfo{{CIDR: v1alpha1.NetworkAddress(cidr), Ports: []v1alpha1.Port{{Port: ptr(port)}}}},
		},
	}
}

func errorsAs(err error, target *apierrors.APIStatus) bool { return errors.As(err, target) }
