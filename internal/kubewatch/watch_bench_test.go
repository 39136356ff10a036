package kubewatch

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"

	"github.com/npagent/npagent/api/v1alpha1"
)

// watchEventsJSON is a watch stream of objects MODIFIED events, one per line, as
// the apiserver writes them.
func watchEventsJSON(tb testing.TB, objects int) []byte {
	tb.Helper()
	var out []byte
	for i := range objects {
		ev, err := json.Marshal(map[string]any{"type": "MODIFIED", "object": benchPE(i, 100)})
		if err != nil {
			tb.Fatal(err)
		}
		out = append(append(out, ev...), '\n')
	}
	return out
}

// watchServer answers every watch request with body, then holds the stream open
// until the client goes, as the apiserver does, and a list with an empty list; a
// REST client for it.
func watchServer(tb testing.TB, body []byte) rest.Interface {
	tb.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		if r.URL.Query().Get("watch") != "true" {
			_, _ = w.Write([]byte(`{"apiVersion":"networking.k8s.aws/v1alpha1","kind":"PolicyEndpointList","metadata":{"resourceVersion":"1"},"items":[]}`))
			return
		}
		_, _ = w.Write(body)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	tb.Cleanup(srv.Close)
	rc, err := NewRESTClient(&rest.Config{Host: srv.URL, QPS: -1}, testScheme(tb), v1alpha1.SchemeGroupVersion)
	if err != nil {
		tb.Fatal(err)
	}
	return rc
}

// BenchmarkWatchEvent is one watch of 1,000 MODIFIED PolicyEndpoint events (each
// ~1.7 KB, the shape of reconcile's benchmarks) from a local HTTP server, read
// through the agent's ListWatch, per event: wall time, and this process's CPU
// (client and server), steadier on a shared machine.
func BenchmarkWatchEvent(b *testing.B) {
	const events = 1000
	rc := watchServer(b, watchEventsJSON(b, events))
	lw := NewListWatch(rc, testScheme(b), v1alpha1.ResourcePolicyEndpoints,
		func() runtime.Object { return &v1alpha1.PolicyEndpoint{} }, &recordingObserver{}, &Health{},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if _, err := lw.ListWithContextFunc(context.Background(), metav1.ListOptions{}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	cpu0 := cpuTime()
	for b.Loop() {
		w, err := lw.WatchFuncWithContext(context.Background(), metav1.ListOptions{ResourceVersion: "1"})
		if err != nil {
			b.Fatal(err)
		}
		for range events {
			ev, ok := <-w.ResultChan()
			if !ok {
				b.Fatal("watch ended early")
			}
			if _, ok := ev.Object.(*v1alpha1.PolicyEndpoint); !ok {
				b.Fatalf("event %s of %T", ev.Type, ev.Object)
			}
		}
		w.Stop()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*events), "ns/event")
	b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N*events), "cpu-ns/event")
}
