package kubewatch

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/testenv"
)

// recordingObserver is a ListObserver that records what it is told.
type recordingObserver struct {
	lists     int
	unchanged []string // name@resourceVersion
}

func (o *recordingObserver) BeginList() { o.lists++ }
func (o *recordingObserver) Unchanged(obj runtime.Object) {
	m := obj.(metav1.Object)
	o.unchanged = append(o.unchanged, m.GetName()+"@"+m.GetResourceVersion())
}

func (o *recordingObserver) take() []string {
	u := o.unchanged
	o.unchanged = nil
	slices.Sort(u)
	return u
}

func peV(name, uid, rv string) *v1alpha1.PolicyEndpoint {
	return &v1alpha1.PolicyEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, UID: types.UID(uid), ResourceVersion: rv}}
}

// pagedList answers a list in pages of the given items, the page named by Continue;
// fail, when set, fails the request for that page (pure logic: no apiserver).
func pagedList(pages [][]runtime.Object, fail func(page int) bool) cache.ListWithContextFunc {
	return func(_ context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		page := 0
		if opts.Continue != "" {
			page = int(opts.Continue[0] - '0')
		}
		if fail != nil && fail(page) {
			return nil, io.ErrUnexpectedEOF
		}
		list := &v1alpha1.PolicyEndpointList{}
		if page+1 < len(pages) {
			list.Continue = string(rune('0' + page + 1))
		}
		for _, obj := range pages[page] {
			list.Items = append(list.Items, *obj.(*v1alpha1.PolicyEndpoint))
		}
		return list, nil
	}
}

func testListWatch(obs ListObserver) *listWatch {
	return &listWatch{
		base:      &cache.ListWatch{},
		ready:     func(context.Context) error { return nil },
		newObject: func() runtime.Object { return &v1alpha1.PolicyEndpoint{} },
		observer:  obs,
		health:    &Health{},
		log:       slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

// listedWatch is a ListWatch with a recordingObserver that has listed pages once, as
// the reflector's first list does: what a relist is then diffed against.
func listedWatch(t *testing.T, pages [][]runtime.Object) (*recordingObserver, *listWatch) {
	t.Helper()
	obs := &recordingObserver{}
	l := testListWatch(obs)
	l.base.ListWithContextFunc = pagedList(pages, nil)
	if err := listAll(l); err != nil {
		t.Fatal(err)
	}
	return obs, l
}

// listAll lists every page as the reflector's pager does; it returns the error of
// the first page that failed.
func listAll(l *listWatch) error {
	opts := metav1.ListOptions{}
	for {
		obj, err := l.list(context.Background(), opts)
		if err != nil {
			return err
		}
		lm, _ := obj.(*v1alpha1.PolicyEndpointList)
		if lm.Continue == "" {
			return nil
		}
		opts.Continue = lm.Continue
	}
}

// TestListObserverPagedRelist: a relist in pages tells the observer of each object
// it brings unchanged (same uid and resourceVersion as delivered), once, and of
// nothing else — not a changed, recreated or new object, and nothing on the initial
// list; one BeginList per list, not per page; a relist that fails part-way leaves
// what was delivered as it was, so the next relist still knows its objects (pure
// logic: the list requests are answered by a function).
func TestListObserverPagedRelist(t *testing.T) {
	first := [][]runtime.Object{{peV("a", "ua", "1"), peV("b", "ub", "2")}, {peV("c", "uc", "3"), peV("d", "ud", "4")}}
	obs, l := listedWatch(t, first)
	if obs.lists != 1 || len(obs.unchanged) != 0 {
		t.Fatalf("initial list in two pages: %d lists begun, unchanged %v; want 1 and none", obs.lists, obs.unchanged)
	}

	// a unchanged, b changed, c recreated under its name, d gone, e new.
	second := [][]runtime.Object{{peV("a", "ua", "1"), peV("b", "ub", "7")}, {peV("c", "uc2", "8"), peV("e", "ue", "9")}}
	fail := true
	l.base.ListWithContextFunc = pagedList(second, func(page int) bool {
		if page == 1 && fail {
			fail = false
			return true
		}
		return false
	})
	// The second page fails once: the reflector's pager gives up on this list.
	l.ready = func(context.Context) error { return io.EOF } // never ready: the error goes to the reflector
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	_, err := l.list(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.list(ctx, metav1.ListOptions{Continue: "1"}); err == nil {
		t.Fatal("the failing page answered")
	}
	cancel()
	if got := obs.take(); !slices.Equal(got, []string{"a@1"}) {
		t.Errorf("first page of the relist: unchanged %v, want [a@1]", got)
	}
	if _, ok := l.delivered["shop/d"]; !ok {
		t.Fatal("a relist that failed part-way replaced what was delivered")
	}
	l.ready = func(context.Context) error { return nil }
	if err := listAll(l); err != nil {
		t.Fatal(err)
	}
	if got := obs.take(); !slices.Equal(got, []string{"a@1"}) {
		t.Errorf("relist: unchanged %v, want [a@1]", got)
	}
	if obs.lists != 3 {
		t.Errorf("%d lists begun, want 3 (one per list, not per page)", obs.lists)
	}
	var names []string
	for k := range l.delivered {
		names = append(names, k)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"shop/a", "shop/b", "shop/c", "shop/e"}) {
		t.Errorf("delivered after the relist: %v", names)
	}
}

// watchList opens l's watch in WatchList mode (sendInitialEvents) over a FakeWatcher,
// stopped when the test ends, and returns both.
func watchList(t *testing.T, l *listWatch) (*watch.FakeWatcher, watch.Interface) {
	t.Helper()
	fake := watch.NewFake()
	l.base.WatchFuncWithContext = func(context.Context, metav1.ListOptions) (watch.Interface, error) { return fake, nil }
	send := true
	w, err := l.watch(context.Background(), metav1.ListOptions{SendInitialEvents: &send, AllowWatchBookmarks: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	return fake, w
}

// initialEventsEnd is the bookmark that ends a WatchList stream's initial events.
func initialEventsEnd(rv string) *v1alpha1.PolicyEndpoint {
	end := peV("", "", rv)
	end.Annotations = map[string]string{metav1.InitialEventsAnnotationKey: "true"}
	return end
}

// TestListObserverWatchList: a relist streamed as a watch's initial events (client-go's
// WatchList mode) tells the observer of each unchanged object once, before the
// reflector gets it; events after the initial-events bookmark are writes, not a
// relist (pure logic: the watch is client-go's FakeWatcher).
func TestListObserverWatchList(t *testing.T) {
	obs, l := listedWatch(t, [][]runtime.Object{{peV("a", "ua", "1"), peV("b", "ub", "2")}})
	fake, w := watchList(t, l)
	go func() {
		fake.Add(peV("a", "ua", "1"))
		fake.Add(peV("b", "ub", "5"))
		fake.Action(watch.Bookmark, initialEventsEnd("6"))
		fake.Modify(peV("a", "ua", "1")) // after the initial state: not a relist's
	}()
	for range 4 {
		<-w.ResultChan()
	}
	if got := obs.take(); !slices.Equal(got, []string{"a@1"}) {
		t.Errorf("WatchList relist: unchanged %v, want [a@1] once", got)
	}
	if obs.lists != 2 {
		t.Errorf("%d lists begun, want 2", obs.lists)
	}
	if d := l.delivered["shop/b"]; d.rv != "5" {
		t.Errorf("after the initial events, b delivered at %q, want 5", d.rv)
	}
}

// TestRefusedByReadyAPIServer: a list a ready apiserver refuses (RBAC withdrawn) goes
// to the reflector at once, logged as a refusal — never as an outage to wait out — and
// recorded in the health (WatchHealth.Refused) until a request succeeds again (pure
// logic: the list and readiness are functions).
func TestRefusedByReadyAPIServer(t *testing.T) {
	var logs testenv.LogBuffer
	l := testListWatch(&recordingObserver{})
	l.log = slog.New(slog.NewTextHandler(&logs, nil))
	forbidden := apierrors.NewForbidden(schema.GroupResource{Group: "networking.k8s.aws", Resource: "policyendpoints"}, "",
		errors.New(`User "agent" cannot list resource "policyendpoints"`))
	l.base.ListWithContextFunc = func(context.Context, metav1.ListOptions) (runtime.Object, error) { return nil, forbidden }
	if _, err := l.list(context.Background(), metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("list = %v, want the refusal handed to the reflector", err)
	}
	if strings.Contains(logs.String(), "retrying until the apiserver is back") || !strings.Contains(logs.String(), "ready and refuses") {
		t.Errorf("log %q: want the refusal named, not an outage", logs.String())
	}
	if got := l.health.Snapshot(time.Now(), time.Minute).Refused; !strings.Contains(got, "cannot list resource") {
		t.Errorf("health Refused = %q, want the apiserver's reason", got)
	}
	l.base.ListWithContextFunc = pagedList([][]runtime.Object{{peV("a", "ua", "1")}}, nil)
	if err := listAll(l); err != nil {
		t.Fatal(err)
	}
	if got := l.health.Snapshot(time.Now(), time.Minute).Refused; got != "" {
		t.Errorf("after a granted list Refused = %q, want none", got)
	}
}

// progressObserver is a ListProgress that records what it is told, in order.
type progressObserver struct {
	recordingObserver
	seq []string // names listed, "end" for ListEnded
}

func (o *progressObserver) Listed(obj runtime.Object) {
	o.seq = append(o.seq, obj.(metav1.Object).GetName())
}
func (o *progressObserver) ListEnded() { o.seq = append(o.seq, "end") }

// TestListProgressEnd: ListEnded follows a paged list's last page, once, and not a
// page with more to come; in WatchList mode it comes with the initial-events
// bookmark, before the events after it (pure logic).
func TestListProgressEnd(t *testing.T) {
	obs := &progressObserver{}
	l := testListWatch(obs)
	l.base.ListWithContextFunc = pagedList([][]runtime.Object{{peV("a", "ua", "1"), peV("b", "ub", "2")}, {peV("c", "uc", "3")}}, nil)
	if _, err := l.list(context.Background(), metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(obs.seq, " "); got != "a b" {
		t.Errorf("after the first of two pages: %q, want %q", got, "a b")
	}
	if _, err := l.list(context.Background(), metav1.ListOptions{Continue: "1"}); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(obs.seq, " "); got != "a b c end" {
		t.Errorf("after the last page: %q, want %q", got, "a b c end")
	}

	obs.seq = nil
	fake, w := watchList(t, l)
	go func() {
		fake.Add(peV("d", "ud", "4"))
		fake.Action(watch.Bookmark, initialEventsEnd("5"))
		fake.Add(peV("e", "ue", "6")) // a write after the initial state
	}()
	for range 3 {
		<-w.ResultChan()
	}
	if got := strings.Join(obs.seq, " "); got != "d end" {
		t.Errorf("WatchList stream: %q, want %q", got, "d end")
	}
}

// TestErrorHandlerStreaks: a failed list or watch is a warning until its streak has
// lasted 30 s, then an error, and persistent is called once per streak; a failure
// after a quiet gap of over 2 minutes starts a new streak; expired resourceVersions
// and ended streams are not failures (pure logic: the clock is a variable).
func TestErrorHandlerStreaks(t *testing.T) {
	var logs strings.Builder
	var persisted []error
	h := NewErrorHandler(slog.New(slog.NewTextHandler(&logs, nil)), "nodes", func(err error) { persisted = append(persisted, err) })
	now := time.Unix(1000, 0)
	h.now = func() time.Time { return now }
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, "n1", errors.New(`clusterrole "agent" not found`))
	levels := func() string { // the level of each line logged since the last call
		var out []string
		for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
			if _, rest, ok := strings.Cut(line, " level="); ok {
				level, _, _ := strings.Cut(rest, " ")
				out = append(out, level)
			}
		}
		logs.Reset()
		return strings.Join(out, " ")
	}
	h.Handle(context.Background(), nil, apierrors.NewResourceExpired("too old"))
	h.Handle(context.Background(), nil, io.EOF)
	if got := levels(); got != "" {
		t.Errorf("expired and EOF logged %q, want nothing above debug", got)
	}
	for _, step := range []time.Duration{0, time.Second, 20 * time.Second, 15 * time.Second, 25 * time.Second} {
		now = now.Add(step)
		h.Handle(context.Background(), nil, forbidden)
	}
	if got := levels(); got != "WARN WARN WARN ERROR ERROR" {
		t.Errorf("a streak of 0, 1, 21, 36, 61 s: levels %q, want WARN WARN WARN ERROR ERROR", got)
	}
	if len(persisted) != 1 || !apierrors.IsForbidden(persisted[0]) {
		t.Errorf("persistent called with %v, want once with the 403", persisted)
	}
	now = now.Add(3 * time.Minute)
	h.Handle(context.Background(), nil, forbidden)
	if got := levels(); got != "WARN" {
		t.Errorf("after a quiet 3 minutes: %q, want a new streak's WARN", got)
	}
}
