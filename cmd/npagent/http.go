package main

import (
	"fmt"
	"net/http"
)

// newHTTPHandler serves the agent's endpoints:
//
//   - /healthz: 200 while the process serves HTTP at all (liveness);
//   - /readyz: 200 once ready() returns nil, else 503 with its reason (informer
//     caches not synced, dataplane not ready, shutting down);
//   - /metrics: the Prometheus exposition of every npagent instrument.
func newHTTPHandler(metrics http.Handler, ready func() error) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err := ready(); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "not ready: %v\n", err)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.Handle("GET /metrics", metrics)
	return mux
}
