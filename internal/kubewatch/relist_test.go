package kubewatch

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

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
