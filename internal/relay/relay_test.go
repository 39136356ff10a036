package relay

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/kubewatch"
	"github.com/npagent/npagent/internal/testenv"
)

// reader lists and watches one resource through rc as the agent does (kubewatch's
// one-pass decoding).
type reader struct {
	list  func(context.Context, metav1.ListOptions) (runtime.Object, error)
	watch func(context.Context, metav1.ListOptions) (watch.Interface, error)
}

func newReader(t testing.TB, cfg *rest.Config, resource string) reader {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	rc, err := kubewatch.NewRESTClient(cfg, scheme, v1alpha1.SchemeGroupVersion)
	if err != nil {
		t.Fatal(err)
	}
	newObj := func() runtime.Object { return &v1alpha1.PolicyEndpoint{} }
	if resource == v1alpha1.ResourceClusterPolicyEndpoints {
		newObj = func() runtime.Object { return &v1alpha1.ClusterPolicyEndpoint{} }
	}
	l, err := kubewatch.NewLister(rc, scheme, resource, newObj)
	if err != nil {
		t.Fatal(err)
	}
	w, err := kubewatch.NewWatcher(rc, scheme, resource, newObj)
	if err != nil {
		t.Fatal(err)
	}
	return reader{list: l, watch: w}
}

// names lists and returns the names of the items of namespace ns (any for a
// ClusterPolicyEndpoint) whose names start with prefix, and the list's
// resourceVersion. Earlier tests' objects stay on the shared control plane.
func (r reader) names(t testing.TB, ns, prefix string) ([]string, string) {
	t.Helper()
	obj, err := r.list(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	items, _ := meta.ExtractList(obj)
	var out []string
	for _, it := range items {
		if m, _ := meta.Accessor(it); strings.HasPrefix(m.GetName(), prefix) && (m.GetNamespace() == "" || m.GetNamespace() == ns) {
			out = append(out, m.GetName())
		}
	}
	lm, _ := meta.ListAccessor(obj)
	slices.Sort(out)
	return out, lm.GetResourceVersion()
}

// next returns the watch's next events that are not bookmarks, as "TYPE name", until
// it has n of them.
func next(t testing.TB, w watch.Interface, n int) []string {
	t.Helper()
	var got []string
	timeout := time.After(20 * time.Second)
	for len(got) < n {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("watch ended after %v, want %d events", got, n)
			}
			if ev.Type == watch.Bookmark {
				continue
			}
			if ev.Type == watch.Error {
				t.Fatalf("watch error after %v: %v", got, apierrors.FromObject(ev.Object))
			}
			m, _ := meta.Accessor(ev.Object)
			got = append(got, string(ev.Type)+" "+m.GetName())
		case <-timeout:
			t.Fatalf("after 20s: events %v, want %d", got, n)
		}
	}
	return got
}

func write[T client.Object](t testing.TB, cp *testenv.ControlPlane, obj T, change func(T)) {
	t.Helper()
	ctx := context.Background()
	if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
		t.Fatal(err)
	}
	change(obj)
	if err := cp.Client.Update(ctx, obj); err != nil {
		t.Fatal(err)
	}
}

// TestNodeView: each node lists the PolicyEndpoints of the policies with a pod on it
// (the local ones and their siblings) and every ClusterPolicyEndpoint; its watch
// gets ADDED when a policy gains a pod on the node (the siblings too) and DELETED
// when it loses its last one, as a field-selector watch delivers them; bookmarks
// come; and a watch through the relay never sees another node's objects.
func TestNodeView(t *testing.T) {
	cp := testenv.Shared(t)
	ns := cp.Namespace(t)
	n1 := newNode(t, cp, ns, ns+"-n1", "198.51.100.1")
	n2 := newNode(t, cp, ns, ns+"-n2", "198.51.100.2")
	tr := startRelay(t, cp, Config{BookmarkInterval: 200 * time.Millisecond})
	ctx := context.Background()

	a1 := pe(ns, "a1", "a", "10.0.0.0/8", 80, [2]string{n1.ip, "10.1.0.1"}, [2]string{n2.ip, "10.2.0.1"})
	a2 := pe(ns, "a2", "a", "10.0.0.0/8", 443)
	b1 := pe(ns, "b1", "b", "10.0.0.0/8", 80, [2]string{n2.ip, "10.2.0.2"})
	b2 := pe(ns, "b2", "b", "10.0.0.0/8", 443)
	other := pe(ns, "c1", "c", "10.0.0.0/8", 80, [2]string{"198.51.100.99", "10.9.0.1"})
	for _, o := range []client.Object{a1, a2, b1, b2, other} {
		if err := cp.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	cpe := &v1alpha1.ClusterPolicyEndpoint{ObjectMeta: metav1.ObjectMeta{Name: ns + "-deny"},
		Spec: v1alpha1.ClusterPolicyEndpointSpec{PolicyRef: v1alpha1.ClusterPolicyReference{Name: "deny"}, Tier: v1alpha1.TierAdmin,
			Subject: v1alpha1.ClusterPolicySubject{Namespaces: &metav1.LabelSelector{}}}}
	if err := cp.Client.Create(ctx, cpe); err != nil {
		t.Fatal(err)
	}

	r1 := newReader(t, relayOnly(tr, n1), v1alpha1.ResourcePolicyEndpoints)
	r2 := newReader(t, relayOnly(tr, n2), v1alpha1.ResourcePolicyEndpoints)
	var got1, got2 []string
	var rv1 string
	testenv.Eventually(t, 20*time.Second, "the relay serves the created objects", func() bool {
		got1, rv1 = r1.names(t, ns, "")
		got2, _ = r2.names(t, ns, "")
		return len(got1) == 2 && len(got2) == 4
	})
	if want := []string{"a1", "a2"}; !slices.Equal(got1, want) {
		t.Errorf("node 1 lists %v, want %v (policy a: a pod on node 1, and its sibling)", got1, want)
	}
	if want := []string{"a1", "a2", "b1", "b2"}; !slices.Equal(got2, want) {
		t.Errorf("node 2 lists %v, want %v", got2, want)
	}
	cr := newReader(t, relayOnly(tr, n1), v1alpha1.ResourceClusterPolicyEndpoints)
	if got, _ := cr.names(t, "", ns); !slices.Equal(got, []string{cpe.Name}) {
		t.Errorf("node 1 lists cluster policy endpoints %v, want [%s]", got, cpe.Name)
	}

	w, err := r1.watch(ctx, metav1.ListOptions{ResourceVersion: rv1, AllowWatchBookmarks: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	// Policy b gains a pod on node 1: both its objects enter node 1's view, the
	// sibling first, the written object last (its resourceVersion is the newest).
	write(t, cp, b1, func(p *v1alpha1.PolicyEndpoint) {
		p.Spec.PodSelectorEndpoints = append(p.Spec.PodSelectorEndpoints, v1alpha1.PodEndpoint{HostIP: v1alpha1.NetworkAddress(n1.ip), PodIP: "10.1.0.2", Namespace: ns})
	})
	if got, want := next(t, w, 2), []string{"ADDED b2", "ADDED b1"}; !slices.Equal(got, want) {
		t.Errorf("policy b enters node 1: %v, want %v", got, want)
	}
	// A write to an object in view is MODIFIED; one out of view is not seen.
	write(t, cp, other, func(p *v1alpha1.PolicyEndpoint) { p.Spec.Ingress[0].Ports[0].Port = ptr[int32](81) })
	write(t, cp, b2, func(p *v1alpha1.PolicyEndpoint) { p.Spec.Ingress[0].Ports[0].Port = ptr[int32](444) })
	if got, want := next(t, w, 1), []string{"MODIFIED b2"}; !slices.Equal(got, want) {
		t.Errorf("writes: %v, want %v", got, want)
	}
	// Policy a loses its pod on node 1: both leave node 1's view (not node 2's).
	write(t, cp, a1, func(p *v1alpha1.PolicyEndpoint) { p.Spec.PodSelectorEndpoints = p.Spec.PodSelectorEndpoints[1:] })
	if got, want := next(t, w, 2), []string{"DELETED a2", "DELETED a1"}; !slices.Equal(got, want) {
		t.Errorf("policy a leaves node 1: %v, want %v", got, want)
	}
	if err := cp.Client.Delete(ctx, b2); err != nil {
		t.Fatal(err)
	}
	if got, want := next(t, w, 1), []string{"DELETED b2"}; !slices.Equal(got, want) {
		t.Errorf("delete: %v, want %v", got, want)
	}
	// Bookmarks come, at the newest resourceVersion the relay has.
	var b2rv string
	if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(a1), a1); err != nil {
		t.Fatal(err)
	}
	b2rv = a1.ResourceVersion
	testenv.Eventually(t, 10*time.Second, "a bookmark at or after the last write", func() bool {
		select {
		case ev := <-w.ResultChan():
			if ev.Type != watch.Bookmark {
				t.Errorf("unexpected event %s", ev.Type)
				return false
			}
			m, _ := meta.Accessor(ev.Object)
			return atoi(m.GetResourceVersion()) >= atoi(b2rv)
		case <-time.After(time.Second):
			return false
		}
	})
	if got, _ := r1.names(t, ns, ""); !slices.Equal(got, []string{"b1"}) {
		t.Errorf("node 1 lists %v after the writes, want [b1]", got)
	}
	if got, _ := r2.names(t, ns, ""); !slices.Equal(got, []string{"a1", "a2", "b1"}) {
		t.Errorf("node 2 lists %v after the writes, want [a1 a2 b1]", got)
	}
	// Pages: limit and continue give the same objects as one list.
	all := func(opts metav1.ListOptions) (keys []string, pages int) {
		for {
			obj, err := r2.list(ctx, opts)
			if err != nil {
				t.Fatal(err)
			}
			pages++
			items, _ := meta.ExtractList(obj)
			for _, it := range items {
				m, _ := meta.Accessor(it)
				keys = append(keys, m.GetNamespace()+"/"+m.GetName())
			}
			lm, _ := meta.ListAccessor(obj)
			if opts.Continue = lm.GetContinue(); opts.Continue == "" {
				return keys, pages
			}
		}
	}
	whole, _ := all(metav1.ListOptions{})
	paged, pages := all(metav1.ListOptions{Limit: 2})
	if !slices.Equal(whole, paged) || pages != (len(whole)+1)/2 {
		t.Errorf("in %d pages of 2: %v, in one list: %v", pages, paged, whole)
	}

	// A continue token outlives a write outside the node's view (c1: its pod is on
	// no node here), not one inside it (a2): a view of several pages stays listable
	// while the rest of the cluster is written to.
	firstPage := func() string {
		obj, err := r2.list(ctx, metav1.ListOptions{Limit: 2})
		if err != nil {
			t.Fatal(err)
		}
		lm, _ := meta.ListAccessor(obj)
		if lm.GetContinue() == "" {
			t.Fatalf("node 2's view fits one page of 2: nothing to continue")
		}
		return lm.GetContinue()
	}
	relayHas := func(obj client.Object) {
		t.Helper()
		testenv.Eventually(t, 10*time.Second, "the relay received the write", func() bool {
			f := tr.relay.feeds[v1alpha1.ResourcePolicyEndpoints]
			f.mu.RLock()
			defer f.mu.RUnlock()
			return f.changed >= uint64(atoi(obj.GetResourceVersion()))
		})
	}
	cont := firstPage()
	write(t, cp, other, func(o *v1alpha1.PolicyEndpoint) { o.Spec.Ingress[0].Ports[0].Port = ptr(int32(82)) })
	relayHas(other)
	if _, err := r2.list(ctx, metav1.ListOptions{Limit: 2, Continue: cont}); err != nil {
		t.Errorf("continue after a write outside node 2's view: %v, want the next page", err)
	}
	cont = firstPage()
	write(t, cp, a2, func(o *v1alpha1.PolicyEndpoint) { o.Spec.Ingress[0].Ports[0].Port = ptr(int32(445)) })
	relayHas(a2)
	if _, err := r2.list(ctx, metav1.ListOptions{Limit: 2, Continue: cont}); !apierrors.IsResourceExpired(err) {
		t.Errorf("continue after a write inside node 2's view: %v, want 410 Expired", err)
	}
}

func atoi(s string) int {
	var n int
	fmt.Sscan(s, &n)
	return n
}

// TestWatchExpired: a watch from a resourceVersion older than the relay's window is
// 410 Gone (the client lists again); one inside it replays what came after.
func TestWatchExpired(t *testing.T) {
	cp := testenv.Shared(t)
	ns := cp.Namespace(t)
	n1 := newNode(t, cp, ns, ns+"-n1", "198.51.101.1")
	tr := startRelay(t, cp, Config{WindowEvents: 3})
	ctx := context.Background()
	r := newReader(t, relayOnly(tr, n1), v1alpha1.ResourcePolicyEndpoints)
	_, rv := r.names(t, ns, "")
	x := pe(ns, "x", "x", "10.0.0.0/8", 1, [2]string{n1.ip, "10.1.0.1"})
	if err := cp.Client.Create(ctx, x); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "x listed", func() bool { got, _ := r.names(t, ns, ""); return len(got) == 1 })
	// Inside the window: the create is replayed.
	w, err := r.watch(ctx, metav1.ListOptions{ResourceVersion: rv})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := next(t, w, 1), []string{"ADDED x"}; !slices.Equal(got, want) {
		t.Errorf("watch from before the create: %v, want %v", got, want)
	}
	w.Stop()
	for i := range 4 {
		write(t, cp, x, func(p *v1alpha1.PolicyEndpoint) { p.Spec.Ingress[0].Ports[0].Port = ptr(int32(2 + i)) })
	}
	testenv.Eventually(t, 10*time.Second, "the writes seen", func() bool {
		_, now := r.names(t, ns, "")
		return now == x.ResourceVersion
	})
	_, err = r.watch(ctx, metav1.ListOptions{ResourceVersion: rv})
	if !apierrors.IsResourceExpired(err) && !apierrors.IsGone(err) {
		t.Errorf("watch from before the window: err = %v, want 410 Expired", err)
	}
}

// TestAuthentication: a token bound to no node, no token, and a token the apiserver
// does not accept are refused; a user the apiserver would not let list is too.
func TestAuthentication(t *testing.T) {
	cp := testenv.Shared(t)
	ns := cp.Namespace(t)
	n1 := newNode(t, cp, ns, ns+"-n1", "198.51.102.1")
	tr := startRelay(t, cp, Config{})
	cs := kubernetes.NewForConfigOrDie(cp.Config)
	unbound := agentIdentity{node: n1.node, ip: n1.ip, token: token(t, cs, ns, nil)}
	for _, tc := range []struct {
		name  string
		token string
		code  int
		says  string
	}{
		{"a token bound to no node", unbound.token, http.StatusForbidden, "names no node"},
		{"no token", "", http.StatusUnauthorized, "bearer token is required"},
		{"a forged token", "not-a-token", http.StatusUnauthorized, "not valid"},
	} {
		r := newReader(t, relayOnly(tr, agentIdentity{token: tc.token}), v1alpha1.ResourcePolicyEndpoints)
		_, err := r.list(context.Background(), metav1.ListOptions{})
		var st apierrors.APIStatus
		if !errorsAs(err, &st) || int(st.Status().Code) != tc.code || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: err = %v, want %d saying %q", tc.name, err, tc.code, tc.says)
		}
	}
	if got, _ := newReader(t, relayOnly(tr, n1), v1alpha1.ResourcePolicyEndpoints).names(t, ns, ""); got != nil {
		t.Errorf("the node's own token: %v, want an empty list", got)
	}
	// The same pod-bound token, for a service account without RBAC to list.
	if err := cs.RbacV1().ClusterRoleBindings().Delete(context.Background(), "relay-test-agent-"+ns, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	n2 := newNode(t, cp, ns, ns+"-n2", "198.51.102.2") // recreates the binding: delete it again
	if err := cs.RbacV1().ClusterRoleBindings().Delete(context.Background(), "relay-test-agent-"+ns, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "a user without RBAC refused", func() bool {
		_, err := newReader(t, relayOnly(tr, n2), v1alpha1.ResourcePolicyEndpoints).list(context.Background(), metav1.ListOptions{})
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "may not list")
	})
}
