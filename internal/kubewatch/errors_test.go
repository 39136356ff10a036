package kubewatch

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/npagent/npagent/internal/testenv"
)

// TestErrorHandlerTransientRefusal: an apiserver restarted while the watcher's
// ClusterRoleBinding is missing answers its list 403 until the binding is back, as a
// restarted apiserver does until its RBAC authorizer has loaded the roles. Two
// informers of the same Node see it: client-go's DefaultWatchErrorHandler gets the
// 403 (which it hands to client-go's error handlers: "Failed to watch", logged at
// ERROR — what agents logged after restarts), and ErrorHandler logs it at WARN, no
// ERROR. Both deliver the Node's change made after the binding is back. Real
// apiserver; client-go's global error handlers are left alone (tests beside may log).
func TestErrorHandlerTransientRefusal(t *testing.T) {
	cp := testenv.Start(t)
	ctx := context.Background()
	admin := kubernetes.NewForConfigOrDie(cp.Config)
	const user, name = "node-watcher", "watched-node"
	if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: user},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch"}}}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: user},
		Subjects: []rbacv1.Subject{{Kind: "User", APIGroup: rbacv1.GroupName, Name: user}}}
	bind := func() {
		t.Helper()
		if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, binding.DeepCopy(), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	bind()

	rc := rest.CopyConfig(cp.Config)
	rc.Impersonate = rest.ImpersonationConfig{UserName: user}
	cs := kubernetes.NewForConfigOrDie(rc)
	var logs testenv.LogBuffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	newInformer := func(description string) (cache.SharedIndexInformer, func() string) {
		lw := cache.NewFilteredListWatchFromClient(cs.CoreV1().RESTClient(), "nodes", metav1.NamespaceAll,
			func(o *metav1.ListOptions) {
				o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
			})
		inf := cache.NewSharedIndexInformerWithOptions(lw, &corev1.Node{}, cache.SharedIndexInformerOptions{ObjectDescription: description})
		var labelMu sync.Mutex
		label := ""
		record := func(obj any) {
			if n, ok := obj.(*corev1.Node); ok {
				labelMu.Lock()
				label = n.Labels["step"]
				labelMu.Unlock()
			}
		}
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: record, UpdateFunc: func(_, o any) { record(o) }}); err != nil {
			t.Fatal(err)
		}
		return inf, func() string { labelMu.Lock(); defer labelMu.Unlock(); return label }
	}
	plain, plainLabel := newInformer("default handler")
	var mu sync.Mutex
	var handed []error // what the default handler got
	if err := plain.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		mu.Lock()
		handed = append(handed, err)
		mu.Unlock()
		cache.DefaultWatchErrorHandler(ctx, r, err)
	}); err != nil {
		t.Fatal(err)
	}
	handled, handledLabel := newInformer("ErrorHandler")
	if err := handled.SetWatchErrorHandlerWithContext(NewErrorHandler(logger, "nodes", nil).Handle); err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go plain.RunWithContext(runCtx)
	go handled.RunWithContext(runCtx)
	testenv.Eventually(t, 30*time.Second, "both informers synced", func() bool { return plain.HasSynced() && handled.HasSynced() })

	if err := admin.RbacV1().ClusterRoleBindings().Delete(ctx, user, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	cp.RestartAPIServer(t) // both watches end; their next requests are refused
	// Both informers refused before the binding is back: each reflector retries on
	// a backoff of its own, so one may not have asked yet when the other was refused.
	testenv.Eventually(t, 30*time.Second, "both informers refused", func() bool {
		mu.Lock()
		defer mu.Unlock()
		out := logs.String()
		return slices.ContainsFunc(handed, apierrors.IsForbidden) && strings.Contains(out, "level=WARN") && strings.Contains(out, "forbidden")
	})
	bind()
	n, err := admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Labels = map[string]string{"step": "after"}
	if _, err := admin.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, "both informers deliver the change made after the binding is back", func() bool {
		return plainLabel() == "after" && handledLabel() == "after"
	})

	mu.Lock()
	t.Logf("the default handler got %v", handed)
	mu.Unlock()
	out := logs.String()
	if !strings.Contains(out, "level=WARN") || !strings.Contains(out, "forbidden") {
		t.Errorf("ErrorHandler logged no warning of the refusal:\n%s", out)
	}
	if strings.Contains(out, "level=ERROR") {
		t.Errorf("ErrorHandler logged an error for a refusal that lasted seconds:\n%s", out)
	}
}
