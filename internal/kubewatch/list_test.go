package kubewatch

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/testenv"
)

// listServer serves body (with status code) for every request and returns a REST
// client for it.
func listServer(tb testing.TB, code int, body []byte) rest.Interface {
	tb.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_, _ = w.Write(body)
	}))
	tb.Cleanup(srv.Close)
	rc, err := NewRESTClient(&rest.Config{Host: srv.URL, QPS: -1}, testScheme(tb), v1alpha1.SchemeGroupVersion) // no client-side throttling
	if err != nil {
		tb.Fatal(err)
	}
	return rc
}

func benchPEListJSON(tb testing.TB, objects int) []byte {
	tb.Helper()
	list := &v1alpha1.PolicyEndpointList{TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: "PolicyEndpointList"}}
	list.ResourceVersion = "4242"
	for i := range objects {
		list.Items = append(list.Items, *benchPE(i, 100))
	}
	data, err := json.Marshal(list)
	if err != nil {
		tb.Fatal(err)
	}
	return data
}

// clientGoList is the list client-go's own ListWatch makes, for comparison.
func clientGoList(rc rest.Interface) cache.ListWithContextFunc {
	return cache.NewListWatchFromClient(rc, v1alpha1.ResourcePolicyEndpoints, metav1.NamespaceAll, fields.Everything()).ListWithContextFunc
}

// TestListerDecodesAsClientGo: the one-pass list decodes a list answer, a Status
// answer and an error answer exactly as client-go's ListWatch does.
func TestListerDecodesAsClientGo(t *testing.T) {
	status := []byte(`{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"nope","reason":"Forbidden","code":403}`)
	for _, tc := range []struct {
		name string
		code int
		body []byte
	}{
		{"list", http.StatusOK, benchPEListJSON(t, 20)},
		{"empty list", http.StatusOK, []byte(`{"apiVersion":"networking.k8s.aws/v1alpha1","kind":"PolicyEndpointList","metadata":{"resourceVersion":"7"},"items":[]}`)},
		{"other kind", http.StatusOK, []byte(`{"apiVersion":"networking.k8s.aws/v1alpha1","kind":"PolicyEndpoint","metadata":{"name":"x"}}`)},
		{"forbidden", http.StatusForbidden, status},
		{"not json", http.StatusOK, []byte(`<html>`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := listServer(t, tc.code, tc.body)
			lister, err := NewLister(rc, testScheme(t), v1alpha1.ResourcePolicyEndpoints, func() runtime.Object { return &v1alpha1.PolicyEndpoint{} })
			if err != nil {
				t.Fatal(err)
			}
			got, gotErr := lister(context.Background(), metav1.ListOptions{})
			want, wantErr := clientGoList(rc)(context.Background(), metav1.ListOptions{})
			if (gotErr == nil) != (wantErr == nil) || (gotErr != nil && gotErr.Error() != wantErr.Error()) {
				t.Fatalf("error %v, client-go's %v", gotErr, wantErr)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("decoded %#v\nclient-go decoded %#v", got, want)
			}
		})
	}
}

// watchListJSON is the stream a WatchList request (sendInitialEvents) answers for the
// same objects: one ADDED event each, then the initial-events-end bookmark.
func watchListJSON(tb testing.TB, objects int) []byte {
	tb.Helper()
	var out []byte
	for i := range objects {
		ev, err := json.Marshal(map[string]any{"type": "ADDED", "object": benchPE(i, 100)})
		if err != nil {
			tb.Fatal(err)
		}
		out = append(append(out, ev...), '\n')
	}
	bookmark := &v1alpha1.PolicyEndpoint{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: "PolicyEndpoint"},
		ObjectMeta: metav1.ObjectMeta{ResourceVersion: "4242", Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}},
	}
	ev, err := json.Marshal(map[string]any{"type": "BOOKMARK", "object": bookmark})
	if err != nil {
		tb.Fatal(err)
	}
	return append(append(out, ev...), '\n')
}

// watchListOnce streams the initial events of a WatchList request to their end
// bookmark and returns how many objects it brought.
func watchListOnce(ctx context.Context, rc rest.Interface) (int, error) {
	yes := true
	opts := metav1.ListOptions{Watch: true, SendInitialEvents: &yes, AllowWatchBookmarks: true,
		ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan}
	w, err := rc.Get().Resource(v1alpha1.ResourcePolicyEndpoints).VersionedParams(&opts, metav1.ParameterCodec).Watch(ctx)
	if err != nil {
		return 0, err
	}
	defer w.Stop()
	n := 0
	for ev := range w.ResultChan() {
		if ev.Type == watch.Bookmark {
			if m, ok := ev.Object.(*v1alpha1.PolicyEndpoint); !ok || m.Annotations[metav1.InitialEventsAnnotationKey] != "true" {
				return n, fmt.Errorf("a bookmark that does not end the initial events: %#v", ev.Object)
			}
			return n, nil
		}
		if _, ok := ev.Object.(*v1alpha1.PolicyEndpoint); !ok {
			return n, fmt.Errorf("event %s of %T", ev.Type, ev.Object)
		}
		n++
	}
	return n, fmt.Errorf("stream ended before its bookmark")
}

// BenchmarkList is one list request of 1,000 PolicyEndpoints from a local HTTP
// server, decoded by client-go's ListWatch, by newLister, and streamed as a WatchList
// answer, per object: wall time, and this process's CPU (client and server), steadier
// on a shared machine.
func BenchmarkList(b *testing.B) {
	const objects = 1000
	rc := listServer(b, http.StatusOK, benchPEListJSON(b, objects))
	lean, err := NewLister(rc, testScheme(b), v1alpha1.ResourcePolicyEndpoints, func() runtime.Object { return &v1alpha1.PolicyEndpoint{} })
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		list cache.ListWithContextFunc
	}{{"client-go", clientGoList(rc)}, {"one-pass", lean}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			cpu0 := cpuTime()
			for b.Loop() {
				obj, err := bc.list(context.Background(), metav1.ListOptions{})
				if err != nil {
					b.Fatal(err)
				}
				if n := len(obj.(*v1alpha1.PolicyEndpointList).Items); n != objects {
					b.Fatalf("listed %d items", n)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*objects), "ns/object")
			b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N*objects), "cpu-ns/object")
		})
	}
	// The same objects streamed as a WatchList answer (client-go's WatchListClient):
	// each event is decoded on its own, envelope then object.
	b.Run("watchlist", func(b *testing.B) {
		rc := listServer(b, http.StatusOK, watchListJSON(b, objects))
		b.ReportAllocs()
		cpu0 := cpuTime()
		for b.Loop() {
			n, err := watchListOnce(context.Background(), rc)
			if err != nil {
				b.Fatal(err)
			}
			if n != objects {
				b.Fatalf("streamed %d objects", n)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*objects), "ns/object")
		b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N*objects), "cpu-ns/object")
	})
}

// TestWatchListServed: the apiserver (v1.37) answers a WatchList request for
// PolicyEndpoints with every object and the initial-events-end bookmark, so
// client-go's WatchListClient (on by default in v0.37) streams the reflector's lists.
func TestWatchListServed(t *testing.T) {
	cp := testenv.Start(t)
	createNamespace(t, cp, "wl")
	for i := range 3 {
		pe := benchPE(i, 1)
		pe.Namespace, pe.UID, pe.ResourceVersion = "wl", "", ""
		create(t, cp, pe)
	}
	rc, err := NewRESTClient(cp.Config, testScheme(t), v1alpha1.SchemeGroupVersion)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := watchListOnce(ctx, rc)
	if err != nil || n != 3 {
		t.Fatalf("WatchList streamed %d objects (want 3), err %v", n, err)
	}
}

// testScheme is the agent's scheme: the networking.k8s.aws/v1alpha1 types.
func testScheme(t testing.TB) *runtime.Scheme {
	s := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}
