package main

import (
	"fmt"
	"log"
	"net/http"
	"time"
)

// Bounds of the HTTP server on --metrics-addr (/metrics). Its clients are a
// Prometheus scrape or two; anything beyond is a misbehaving client, answered 503 at
// once rather than queued. Every pod can reach this listener (it is on the node IP,
// and node traffic is exempt from policy), so the probes are not served here: a few
// slow readers filling it must not get the agent restarted (newHealthServer).
const (
	httpReadHeaderTimeout = 5 * time.Second
	httpReadTimeout       = 10 * time.Second
	httpWriteTimeout      = 30 * time.Second // a scrape of the native histograms fits easily
	httpIdleTimeout       = 60 * time.Second
	httpMaxHeaderBytes    = 16 << 10
	httpMaxInFlight       = 16
)

// Bounds of the health server on --health-addr (/livez, /healthz, /readyz). Its
// clients are the kubelet's three probes and an operator's curl; the answers are a
// few lines computed without I/O, so the timeouts are short.
const (
	healthReadHeaderTimeout = 2 * time.Second
	healthReadTimeout       = 2 * time.Second
	healthWriteTimeout      = 5 * time.Second
	healthIdleTimeout       = 30 * time.Second
	healthMaxInFlight       = 8
)

// newHTTPServer returns the /metrics server for h: every timeout set, headers
// bounded, and at most httpMaxInFlight requests served at once (limitInFlight).
func newHTTPServer(h http.Handler, errorLog *log.Logger) *http.Server {
	return &http.Server{
		Handler:           limitInFlight(h, httpMaxInFlight),
		ReadHeaderTimeout: httpReadHeaderTimeout,
		ReadTimeout:       httpReadTimeout,
		WriteTimeout:      httpWriteTimeout,
		IdleTimeout:       httpIdleTimeout,
		MaxHeaderBytes:    httpMaxHeaderBytes,
		ErrorLog:          errorLog,
	}
}

// newHealthServer returns the probes' server for h: a listener, limiter and
// timeouts of its own, so that nothing done to /metrics delays a probe. It is meant
// for a loopback address (--health-addr, 127.0.0.1 by default), which pods cannot
// reach: a pod's packets to 127.0.0.1 never leave its own network namespace, and a
// forged one arriving at the host is a martian the kernel drops (kube-proxy also
// drops it when it sets route_localnet). The kubelet reaches it because the agent
// runs on the host network: an httpGet probe with host 127.0.0.1, as kubeadm's
// static pods use.
func newHealthServer(h http.Handler, errorLog *log.Logger) *http.Server {
	return &http.Server{
		Handler:           limitInFlight(h, healthMaxInFlight),
		ReadHeaderTimeout: healthReadHeaderTimeout,
		ReadTimeout:       healthReadTimeout,
		WriteTimeout:      healthWriteTimeout,
		IdleTimeout:       healthIdleTimeout,
		MaxHeaderBytes:    httpMaxHeaderBytes,
		ErrorLog:          errorLog,
	}
}

// limitInFlight serves at most n requests of h at once; a request beyond that is
// answered 503 with Retry-After at once, so a flood of slow clients cannot pile up
// goroutines and memory.
func limitInFlight(h http.Handler, n int) http.Handler {
	sem := make(chan struct{}, n)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case sem <- struct{}{}:
			defer func() { <-sem }()
			h.ServeHTTP(w, r)
		default:
			w.Header().Set("Retry-After", "1")
			http.Error(w, fmt.Sprintf("too many requests in flight (limit %d)", n), http.StatusServiceUnavailable)
		}
	})
}

// newMetricsHandler serves /metrics: the Prometheus exposition of every npagent
// instrument.
func newMetricsHandler(metrics http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metrics)
	return mux
}

// newHealthHandler serves the probes:
//
//   - /livez, and /healthz as its alias: 200 while the process makes progress, 500
//     with the reason when live() says it does not (a sync stuck, the loop wedged;
//     see stalled). Liveness, and the startup probe: it is 200 while the agent waits
//     for the apiserver, because restarting would not bring the apiserver back.
//   - /readyz: 200 once ready() returns no error, with its notes (what runs
//     degraded) after "ok"; else 503 with the reason (apiserver unreachable, CRDs
//     not served, informer caches not synced, dataplane not ready, stalled,
//     shutting down).
func newHealthHandler(live func() error, ready func() (notes []string, err error)) http.Handler {
	mux := http.NewServeMux()
	liveness := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err := live(); err != nil {
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprintf(w, "not alive: %v\n", err)
			return
		}
		fmt.Fprintln(w, "ok")
	}
	mux.HandleFunc("GET /livez", liveness)
	mux.HandleFunc("GET /healthz", liveness)
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		notes, err := ready()
		if err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "not ready: %v\n", err)
		} else {
			fmt.Fprintln(w, "ok")
		}
		for _, n := range notes {
			fmt.Fprintf(w, "degraded: %s\n", n)
		}
	})
	return mux
}
