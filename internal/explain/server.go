package explain

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"sync/atomic"

	"github.com/npagent/npagent/internal/report"
)

// The debug API, read-only JSON over a unix socket (cmd/npagent listens):
//
//	GET /v1/object/pe/{namespace}/{name}   ObjectExplain
//	GET /v1/object/cpe/{name}              ObjectExplain
//	GET /v1/pod/{namespace}/{name}         PodExplain
//	GET /v1/podip/{ip}                     PodExplain
//	GET /v1/verdict?from=&to=&port=        VerdictExplain (VerdictQuery.Path)
//
// Until the reconcile loop exists (the agent waits for the apiserver) and its caches
// synced, every request is answered 503 with an ErrorBody saying the agent is
// starting (else every object would read as unknown); a bad path segment is 400.

// Source is what the debug API reads: the reconcile loop.
type Source interface {
	HasSynced() bool
	ExplainObject(kind report.Kind, namespace, name string) ObjectExplain
	ExplainPod(q PodQuery) PodExplain
}

// Server serves the debug API; its Source is set once it exists. The zero value
// answers 503 until then.
type Server struct {
	src atomic.Pointer[Source]
}

// SetSource makes s answer from src.
func (s *Server) SetSource(src Source) { s.src.Store(&src) }

// ErrorBody is the body of every error answer.
type ErrorBody struct {
	Error string `json:"error"`
}

// Handler returns the API's handler.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	with := func(f func(Source, *http.Request) (any, error)) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			e := s.src.Load()
			if e == nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				json.NewEncoder(w).Encode(ErrorBody{"agent starting: the reconcile loop is not running yet (waiting for the apiserver)"})
				return
			}
			if !(*e).HasSynced() { // else every object would be "unknown"
				w.WriteHeader(http.StatusServiceUnavailable)
				json.NewEncoder(w).Encode(ErrorBody{"agent starting: informer caches not synced yet (it has not read every object)"})
				return
			}
			v, err := f(*e, r)
			if err != nil {
				w.WriteHeader(http.StatusBadRequest)
				json.NewEncoder(w).Encode(ErrorBody{err.Error()})
				return
			}
			json.NewEncoder(w).Encode(v)
		}
	}
	mux.HandleFunc("GET /v1/object/pe/{namespace}/{name}", with(func(e Source, r *http.Request) (any, error) {
		return e.ExplainObject(report.KindPolicyEndpoint, r.PathValue("namespace"), r.PathValue("name")), nil
	}))
	mux.HandleFunc("GET /v1/object/cpe/{name}", with(func(e Source, r *http.Request) (any, error) {
		return e.ExplainObject(report.KindClusterPolicyEndpoint, "", r.PathValue("name")), nil
	}))
	mux.HandleFunc("GET /v1/pod/{namespace}/{name}", with(func(e Source, r *http.Request) (any, error) {
		return e.ExplainPod(PodQuery{Namespace: r.PathValue("namespace"), Name: r.PathValue("name")}), nil
	}))
	mux.HandleFunc("GET /v1/podip/{ip}", with(func(e Source, r *http.Request) (any, error) {
		ip, err := netip.ParseAddr(r.PathValue("ip"))
		if err != nil {
			return nil, fmt.Errorf("%q is not an IP address", r.PathValue("ip"))
		}
		return e.ExplainPod(PodQuery{IP: ip}), nil
	}))
	mux.HandleFunc("GET /v1/verdict", with(func(e Source, r *http.Request) (any, error) {
		vs, ok := e.(VerdictSource)
		if !ok {
			return nil, errors.New("this agent does not judge packets (no dataplane to read)")
		}
		q, err := parseVerdictQuery(r.URL.Query())
		if err != nil {
			return nil, err
		}
		return vs.ExplainVerdict(q)
	}))
	return mux
}
