package kubewatch

import (
	"bytes"
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
	"github.com/npagent/npagent/internal/testenv/fixture"
)

// eventJSON is one watch event as the apiserver writes it, newline included.
func eventJSON(tb testing.TB, typ string, obj any) []byte {
	tb.Helper()
	data, err := json.Marshal(map[string]any{"type": typ, "object": obj})
	if err != nil {
		tb.Fatal(err)
	}
	return append(data, '\n')
}

// drain collects a watch's events until it ends.
func drain(tb testing.TB, w watch.Interface) []watch.Event {
	tb.Helper()
	defer w.Stop()
	var events []watch.Event
	timeout := time.After(30 * time.Second)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				return events
			}
			events = append(events, ev)
		case <-timeout:
			tb.Fatalf("watch did not end; %d events so far", len(events))
		}
	}
}

// TestWatcherDecodesAsClientGo: the one-pass watch decodes every stream — the four
// object events, an ERROR Status, another kind, an unknown event type, a
// pretty-printed stream, an event longer than the read buffer, a last event without
// its newline, a truncated one — into exactly the events client-go's watch does.
func TestWatcherDecodesAsClientGo(t *testing.T) {
	bookmark := &v1alpha1.PolicyEndpoint{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: "PolicyEndpoint"},
		ObjectMeta: metav1.ObjectMeta{ResourceVersion: "4242", Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}},
	}
	gone := map[string]any{"kind": "Status", "apiVersion": "v1", "metadata": map[string]any{}, "status": "Failure",
		"message": "too old resource version: 1 (42)", "reason": "Expired", "code": 410}
	big := benchPE(7, 100)
	for j := range 2000 {
		big.Spec.PodSelectorEndpoints = append(big.Spec.PodSelectorEndpoints, fixture.Pod("192.0.2.99", fmt.Sprintf("10.62.%d.%d", j/250, j%250+1)))
	}
	objects := bytes.Join([][]byte{
		eventJSON(t, "ADDED", benchPE(1, 100)), eventJSON(t, "MODIFIED", benchPE(2, 100)),
		eventJSON(t, "DELETED", benchPE(3, 100)), eventJSON(t, "BOOKMARK", bookmark),
	}, nil)
	var pretty bytes.Buffer
	for _, obj := range []any{benchPE(1, 100), benchPE(2, 100)} {
		data, err := json.MarshalIndent(map[string]any{"type": "MODIFIED", "object": obj}, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		pretty.Write(append(data, '\n'))
	}
	for _, tc := range []struct {
		name string
		body []byte
	}{
		{"objects", objects},
		{"error", append(eventJSON(t, "MODIFIED", benchPE(1, 100)), eventJSON(t, "ERROR", gone)...)},
		{"other kind", eventJSON(t, "ADDED", gone)},
		{"other group", eventJSON(t, "ADDED", map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "x"}})},
		{"unknown type", append(eventJSON(t, "MODIFIED", benchPE(1, 100)), eventJSON(t, "FOO", benchPE(2, 100))...)},
		{"bad field", []byte(`{"type":"ADDED","object":{"apiVersion":"networking.k8s.aws/v1alpha1","kind":"PolicyEndpoint","spec":{"ingress":7}}}` + "\n")},
		{"pretty", pretty.Bytes()},
		{"longer than the buffer", append(eventJSON(t, "MODIFIED", big), eventJSON(t, "MODIFIED", benchPE(2, 100))...)},
		{"blank lines", append(append([]byte("\n \n"), eventJSON(t, "ADDED", benchPE(1, 100))...), '\n')},
		{"no last newline", bytes.TrimSuffix(objects, []byte("\n"))},
		{"truncated", objects[:len(objects)-40]},
		{"empty", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := listServer(t, http.StatusOK, tc.body)
			watcher, err := NewWatcher(rc, testScheme(t), v1alpha1.ResourcePolicyEndpoints, func() runtime.Object { return &v1alpha1.PolicyEndpoint{} })
			if err != nil {
				t.Fatal(err)
			}
			clientGo := cache.NewListWatchFromClient(rc, v1alpha1.ResourcePolicyEndpoints, metav1.NamespaceAll, fields.Everything()).WatchFuncWithContext
			gw, err := watcher(context.Background(), metav1.ListOptions{ResourceVersion: "1"})
			if err != nil {
				t.Fatal(err)
			}
			ww, err := clientGo(context.Background(), metav1.ListOptions{ResourceVersion: "1"})
			if err != nil {
				t.Fatal(err)
			}
			got, want := drain(t, gw), drain(t, ww)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("decoded %d events %#v\nclient-go decoded %d events %#v", len(got), got, len(want), want)
			}
			if len(want) == 0 && len(tc.body) > 0 && tc.name != "truncated" {
				t.Fatal("client-go decoded nothing: the case tests nothing")
			}
		})
	}
}

// TestWatcherRequestsAsClientGo: the watch request is client-go's (path and query),
// and an error answer is client-go's error.
func TestWatcherRequestsAsClientGo(t *testing.T) {
	status := []byte(`{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"gone","reason":"Expired","code":410}`)
	var urls []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		urls = append(urls, r.Method+" "+r.URL.String()+" "+r.Header.Get("Accept"))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusGone)
		_, _ = w.Write(status)
	}))
	defer srv.Close()
	rc, err := NewRESTClient(&rest.Config{Host: srv.URL}, testScheme(t), v1alpha1.SchemeGroupVersion)
	if err != nil {
		t.Fatal(err)
	}
	watcher, err := NewWatcher(rc, testScheme(t), v1alpha1.ResourcePolicyEndpoints, func() runtime.Object { return &v1alpha1.PolicyEndpoint{} })
	if err != nil {
		t.Fatal(err)
	}
	opts := metav1.ListOptions{ResourceVersion: "5", AllowWatchBookmarks: true, TimeoutSeconds: ptr(int64(30))}
	_, gotErr := watcher(context.Background(), opts)
	_, wantErr := cache.NewListWatchFromClient(rc, v1alpha1.ResourcePolicyEndpoints, metav1.NamespaceAll, fields.Everything()).WatchFuncWithContext(context.Background(), opts)
	if gotErr == nil || wantErr == nil || gotErr.Error() != wantErr.Error() || !rvGone(gotErr) {
		t.Fatalf("error %v, client-go's %v", gotErr, wantErr)
	}
	if len(urls) != 2 || urls[0] != urls[1] {
		t.Fatalf("requests %q: want the same twice", urls)
	}
}
