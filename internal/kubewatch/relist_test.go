package kubewatch

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	"github.com/npagent/npagent/api/v1alpha1"
)

// TestRelistPaginated: after a 410, the ListWatch lists again in pages of 500 (three
// requests for 1,200 objects, each continuing the last), then delivers every object
// and the bookmark. Before, it was one list of everything.
func TestRelistPaginated(t *testing.T) {
	const objects = 1200
	items := make([]v1alpha1.PolicyEndpoint, objects)
	for i := range items {
		items[i] = *benchPE(i, 100)
	}
	var mu sync.Mutex
	var lists []string // limit/continue of each list request
	watches := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		w.Header().Set("Content-Type", "application/json")
		if q.Get("watch") == "true" {
			mu.Lock()
			watches++
			first := watches == 1
			mu.Unlock()
			w.WriteHeader(http.StatusOK)
			if first { // the resourceVersion is gone
				_, _ = w.Write([]byte(`{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old","reason":"Expired","code":410}}` + "\n"))
				return
			}
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			return
		}
		mu.Lock()
		lists = append(lists, q.Get("limit")+"/"+q.Get("continue"))
		mu.Unlock()
		from, _ := strconv.Atoi(q.Get("continue"))
		to := objects
		if limit, _ := strconv.Atoi(q.Get("limit")); limit > 0 {
			to = min(from+limit, objects)
		}
		list := v1alpha1.PolicyEndpointList{TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: "PolicyEndpointList"},
			Items: items[from:to]}
		list.ResourceVersion = "5000"
		if to < objects {
			list.Continue = strconv.Itoa(to)
		}
		_ = json.NewEncoder(w).Encode(&list)
	}))
	defer srv.Close()
	rc, err := NewRESTClient(&rest.Config{Host: srv.URL, QPS: -1}, testScheme(t), v1alpha1.SchemeGroupVersion)
	if err != nil {
		t.Fatal(err)
	}
	health := &Health{}
	lw := NewListWatch(rc, testScheme(t), v1alpha1.ResourcePolicyEndpoints, func() runtime.Object { return &v1alpha1.PolicyEndpoint{} },
		&recordingObserver{}, health, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := lw.ListWithContextFunc(ctx, metav1.ListOptions{}); err != nil { // the reflector's own list
		t.Fatal(err)
	}
	mu.Lock()
	lists = nil
	mu.Unlock()
	w, err := lw.WatchFuncWithContext(ctx, metav1.ListOptions{ResourceVersion: "1"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	delivered := 0
	for ev := range w.ResultChan() {
		if ev.Type == watch.Bookmark {
			break
		}
		delivered++
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"500/", "500/500", "500/1000"}; !slices.Equal(lists, want) || delivered != objects {
		t.Fatalf("relist requests (limit/continue) %q, %d objects delivered; want %q, %d", lists, delivered, want, objects)
	}
}

// TestRelistJitter: the wait before a relist is below 20 µs per object delivered and
// 5 s, random, and none for no object.
func TestRelistJitter(t *testing.T) {
	if d := relistJitter(0); d != 0 {
		t.Errorf("relistJitter(0) = %v, want 0", d)
	}
	seen := map[time.Duration]bool{}
	for range 100 {
		d := relistJitter(2)
		if d < 0 || d >= 40*time.Microsecond {
			t.Fatalf("relistJitter(2) = %v, want in [0, 40µs)", d)
		}
		seen[d] = true
		if d := relistJitter(10_000_000); d < 0 || d >= 5*time.Second {
			t.Fatalf("relistJitter(10M) = %v, want in [0, 5s)", d)
		}
	}
	if len(seen) < 10 {
		t.Errorf("relistJitter(2) took %d values in 100 draws: not random", len(seen))
	}
}

// relistLog records, in order, the list requests of an in-place relist and the events
// the reflector receives from it.
type relistLog struct {
	mu       sync.Mutex
	entries  []string // "list <limit>/<continue>" and "<type> <name>@<resourceVersion>"
	received int      // events received so far
}

func (r *relistLog) add(entry string, event bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.entries = append(r.entries, entry)
	if event {
		r.received++
	}
}

// awaitReceived waits up to 5 s (a loaded machine's scheduling, not the relist's
// pace) for n events to be received and returns how many were.
func (r *relistLog) awaitReceived(n int) int {
	deadline := time.Now().Add(5 * time.Second)
	for {
		r.mu.Lock()
		got := r.received
		r.mu.Unlock()
		if got >= n || time.Now().After(deadline) {
			return got
		}
		time.Sleep(time.Millisecond)
	}
}

// runRelist starts a watch whose resourceVersion is gone, so that l lists again in
// place, and records the events it delivers up to the relist's bookmark.
func runRelist(t *testing.T, l *listWatch, rec *relistLog) {
	t.Helper()
	watches := 0
	l.base.WatchFuncWithContext = func(context.Context, metav1.ListOptions) (watch.Interface, error) {
		if watches++; watches == 1 {
			return nil, apierrors.NewResourceExpired("too old resource version")
		}
		return watch.NewFake(), nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w, err := l.watch(ctx, metav1.ListOptions{ResourceVersion: "4"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		m := ev.Object.(metav1.Object)
		rec.add(fmt.Sprintf("%s %s@%s", ev.Type, m.GetName(), m.GetResourceVersion()), true)
		if ev.Type == watch.Bookmark {
			return
		}
	}
	t.Fatal("the watch ended before the relist's bookmark")
}

func deliveredNames(l *listWatch) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var names []string
	for key, d := range l.delivered {
		names = append(names, key+"@"+d.rv)
	}
	slices.Sort(names)
	return names
}

// TestRelistPageByPage: the in-place relist after a 410 delivers each page's objects
// before it asks for the next page, and the deletions only after the last page, so
// that it holds one page of the list at a time, not the whole list; the observer
// hears of the unchanged objects once, and what was delivered is the list at the end
// (pure logic: the list requests are answered by a function). Before, the relist
// asked for every page first.
func TestRelistPageByPage(t *testing.T) {
	obs, l := listedWatch(t, [][]runtime.Object{{peV("a", "ua", "1"), peV("b", "ub", "2")}, {peV("c", "uc", "3"), peV("d", "ud", "4")}})
	// a unchanged, b changed, c unchanged, d gone, e and f new.
	pages := [][]runtime.Object{{peV("a", "ua", "1"), peV("b", "ub", "7")}, {peV("c", "uc", "3"), peV("e", "ue", "9")}, {peV("f", "uf", "10")}}
	rec := &relistLog{}
	var before []int // events received when each page after the first was asked for
	paged := pagedList(pages, nil)
	l.base.ListWithContextFunc = func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		if opts.Continue != "" {
			page := int(opts.Continue[0] - '0')
			before = append(before, rec.awaitReceived(2*page))
		}
		rec.add(fmt.Sprintf("list %d/%s", opts.Limit, opts.Continue), false)
		obj, err := paged(ctx, opts)
		if err == nil {
			obj.(*v1alpha1.PolicyEndpointList).ResourceVersion = "100"
		}
		return obj, err
	}
	runRelist(t, l, rec)
	if !slices.Equal(before, []int{2, 4}) {
		t.Errorf("pages 2 and 3 asked for after %v events received, want [2 4]: each page delivered before the next is asked for", before)
	}
	want := []string{
		"list 500/", "MODIFIED a@1", "MODIFIED b@7",
		"list 500/1", "MODIFIED c@3", "ADDED e@9",
		"list 500/2", "ADDED f@10",
		"DELETED d@4", "BOOKMARK @100",
	}
	if !slices.Equal(rec.entries, want) {
		t.Errorf("relist:\n got %q\nwant %q", rec.entries, want)
	}
	if got := obs.take(); !slices.Equal(got, []string{"a@1", "c@3"}) || obs.lists != 2 {
		t.Errorf("observer: %d lists begun, unchanged %v; want 2 and [a@1 c@3]", obs.lists, got)
	}
	if got, want := deliveredNames(l), []string{"shop/a@1", "shop/b@7", "shop/c@3", "shop/e@9", "shop/f@10"}; !slices.Equal(got, want) {
		t.Errorf("delivered after the relist %v, want %v", got, want)
	}
}

// TestRelistContinueExpired: when the continue token of a relist expires before its
// last page, the relist lists again from the first page, still page by page (not
// everything at once, as client-go's pager does: that would hold the whole list
// decoded), and delivers from that pass only what its earlier pages did not deliver
// already; the deletions are what that complete pass lacks, including an object an
// earlier page brought and that is gone since; the observer hears of each unchanged
// object once (pure logic).
func TestRelistContinueExpired(t *testing.T) {
	obs, l := listedWatch(t, [][]runtime.Object{{peV("a", "ua", "1"), peV("b", "ub", "2"), peV("c", "uc", "3"), peV("d", "ud", "4"), peV("f", "uf", "5")}})
	rec := &relistLog{}
	requests := 0 // so far, the continued ones included
	l.base.ListWithContextFunc = func(_ context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		if opts.Continue != "" {
			rec.awaitReceived(3) // the first page's events, logged first
		}
		rec.add(fmt.Sprintf("list %d/%s", opts.Limit, opts.Continue), false)
		var items []runtime.Object
		list := &v1alpha1.PolicyEndpointList{}
		requests++
		switch {
		case opts.Limit != relistPageSize:
			return nil, fmt.Errorf("a list of %d objects a page, want %d", opts.Limit, relistPageSize)
		case opts.Continue == "1":
			return nil, apierrors.NewResourceExpired("the provided continue parameter is too old")
		case opts.Continue == "" && requests == 1: // the first page: a unchanged, b changed, h new
			items, list.ResourceVersion, list.Continue = []runtime.Object{peV("a", "ua", "1"), peV("b", "ub", "7"), peV("h", "uh", "8")}, "100", "1"
		case opts.Continue == "": // the first page again, later: h deleted since
			items, list.ResourceVersion, list.Continue = []runtime.Object{peV("a", "ua", "1"), peV("b", "ub", "7")}, "200", "2"
		default: // its second page: c unchanged, g new; d and f gone
			items, list.ResourceVersion = []runtime.Object{peV("c", "uc", "3"), peV("g", "ug", "9")}, "200"
		}
		for _, obj := range items {
			list.Items = append(list.Items, *obj.(*v1alpha1.PolicyEndpoint))
		}
		return list, nil
	}
	runRelist(t, l, rec)
	want := []string{
		"list 500/", "MODIFIED a@1", "MODIFIED b@7", "ADDED h@8",
		"list 500/1", "list 500/", "list 500/2", "MODIFIED c@3", "ADDED g@9",
		"DELETED d@4", "DELETED f@5", "DELETED h@8", "BOOKMARK @200",
	}
	got := rec.entries
	if len(got) == len(want) {
		slices.Sort(got[9:12]) // deletions in no particular order
	}
	if !slices.Equal(got, want) {
		t.Errorf("relist:\n got %q\nwant %q", got, want)
	}
	if got := obs.take(); !slices.Equal(got, []string{"a@1", "c@3"}) || obs.lists != 2 {
		t.Errorf("observer: %d lists begun, unchanged %v; want 2 and [a@1 c@3] once each", obs.lists, got)
	}
	if got, want := deliveredNames(l), []string{"shop/a@1", "shop/b@7", "shop/c@3", "shop/g@9"}; !slices.Equal(got, want) {
		t.Errorf("delivered after the relist %v, want %v", got, want)
	}
}

// TestRelistContinueKeepsExpiring: a list whose continue token expires on every walk
// (through the relay, any write to the node's view expires it) is walked from the first
// page relistPagedRetries more times, then listed everything at once, so the relist
// ends; what the first pages brought is delivered once (pure logic).
func TestRelistContinueKeepsExpiring(t *testing.T) {
	_, l := listedWatch(t, [][]runtime.Object{{peV("a", "ua", "1"), peV("b", "ub", "2")}})
	rec := &relistLog{}
	l.base.ListWithContextFunc = func(_ context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		if opts.Continue != "" {
			rec.awaitReceived(2) // the first page's events, logged first
		}
		rec.add(fmt.Sprintf("list %d/%s", opts.Limit, opts.Continue), false)
		list := &v1alpha1.PolicyEndpointList{}
		switch {
		case opts.Continue != "":
			return nil, apierrors.NewResourceExpired("the provided continue parameter is too old")
		case opts.Limit > 0: // the first page: a unchanged, b changed
			list.Items, list.ResourceVersion, list.Continue = []v1alpha1.PolicyEndpoint{*peV("a", "ua", "1"), *peV("b", "ub", "7")}, "100", "1"
		default: // everything: b deleted since, c new
			list.Items, list.ResourceVersion = []v1alpha1.PolicyEndpoint{*peV("a", "ua", "1"), *peV("c", "uc", "9")}, "200"
		}
		return list, nil
	}
	runRelist(t, l, rec)
	want := []string{"list 500/", "MODIFIED a@1", "MODIFIED b@7", "list 500/1"}
	for range relistPagedRetries {
		want = append(want, "list 500/", "list 500/1")
	}
	want = append(want, "list 0/", "ADDED c@9", "DELETED b@7", "BOOKMARK @200")
	if !slices.Equal(rec.entries, want) {
		t.Errorf("relist:\n got %q\nwant %q", rec.entries, want)
	}
	if got, want := deliveredNames(l), []string{"shop/a@1", "shop/c@9"}; !slices.Equal(got, want) {
		t.Errorf("delivered after the relist %v, want %v", got, want)
	}
}
