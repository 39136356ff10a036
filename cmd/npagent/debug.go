package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/npagent/npagent/internal/reconcile"
	"github.com/npagent/npagent/internal/report"
)

// The debug endpoint: a read-only JSON API on a unix socket (--debug-socket),
// for `npagent explain` and `npagent wait` on the node (or in an init container
// that mounts the socket's directory). Never TCP: what it shows (pod IPs, policy
// names, errors) is for whoever may read the node's /run, not the network.
//
//	GET /v1/object/pe/{namespace}/{name}   reconcile.ObjectExplain
//	GET /v1/object/cpe/{name}              reconcile.ObjectExplain
//	GET /v1/pod/{namespace}/{name}         reconcile.PodExplain
//	GET /v1/podip/{ip}                     reconcile.PodExplain
//
// Until the reconcile loop exists (the agent waits for the apiserver) and its
// caches synced, every request is answered 503 with {"error": "agent starting:
// ..."}; a bad path segment is 400.

// defaultDebugSocket is --debug-socket's default.
const defaultDebugSocket = "/run/npagent/debug.sock"

// maxDebugSocketPath bounds --debug-socket: a socket path has at most 107 bytes,
// and the socket is made under a temporary name (path.<pid>.tmp) first.
const maxDebugSocketPath = 90

// explainer is what the debug endpoint reads: the reconcile loop.
type explainer interface {
	HasSynced() bool
	ExplainObject(kind report.Kind, namespace, name string) reconcile.ObjectExplain
	ExplainPod(q reconcile.PodQuery) reconcile.PodExplain
}

var _ explainer = (*reconcile.Controller)(nil)

// debugAPI serves the endpoints; the loop is set once it exists.
type debugAPI struct {
	loop atomic.Pointer[explainer]
}

func (d *debugAPI) setLoop(e explainer) { d.loop.Store(&e) }

func (d *debugAPI) handler() http.Handler {
	mux := http.NewServeMux()
	with := func(f func(explainer, *http.Request) (any, error)) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			e := d.loop.Load()
			if e == nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				json.NewEncoder(w).Encode(debugError{"agent starting: the reconcile loop is not running yet (waiting for the apiserver)"})
				return
			}
			if !(*e).HasSynced() { // else every object would be "unknown"
				w.WriteHeader(http.StatusServiceUnavailable)
				json.NewEncoder(w).Encode(debugError{"agent starting: informer caches not synced yet (it has not read every object)"})
				return
			}
			v, err := f(*e, r)
			if err != nil {
				w.WriteHeader(http.StatusBadRequest)
				json.NewEncoder(w).Encode(debugError{err.Error()})
				return
			}
			json.NewEncoder(w).Encode(v)
		}
	}
	mux.HandleFunc("GET /v1/object/pe/{namespace}/{name}", with(func(e explainer, r *http.Request) (any, error) {
		return e.ExplainObject(report.KindPolicyEndpoint, r.PathValue("namespace"), r.PathValue("name")), nil
	}))
	mux.HandleFunc("GET /v1/object/cpe/{name}", with(func(e explainer, r *http.Request) (any, error) {
		return e.ExplainObject(report.KindClusterPolicyEndpoint, "", r.PathValue("name")), nil
	}))
	mux.HandleFunc("GET /v1/pod/{namespace}/{name}", with(func(e explainer, r *http.Request) (any, error) {
		return e.ExplainPod(reconcile.PodQuery{Namespace: r.PathValue("namespace"), Name: r.PathValue("name")}), nil
	}))
	mux.HandleFunc("GET /v1/podip/{ip}", with(func(e explainer, r *http.Request) (any, error) {
		ip, err := netip.ParseAddr(r.PathValue("ip"))
		if err != nil {
			return nil, fmt.Errorf("%q is not an IP address", r.PathValue("ip"))
		}
		return e.ExplainPod(reconcile.PodQuery{IP: ip}), nil
	}))
	return mux
}

// debugError is the body of every error answer.
type debugError struct {
	Error string `json:"error"`
}

// listenDebug listens on the unix socket path, readable and writable by the
// owner only (0600), in a directory it creates 0700 if missing. The socket is
// made under a temporary name, restricted, then renamed into place, so nobody
// can connect while it has the umask's mode. A stale socket left by a killed
// agent is replaced; a live one (another agent answers) or a file that is not a
// socket is an error. The returned listener removes the socket when closed.
func listenDebug(path string) (net.Listener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("%s exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("%s: another process (an agent still running?) answers on it", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale socket: %w", err)
		}
	}
	tmp := fmt.Sprintf("%s.%d.tmp", path, os.Getpid())
	os.Remove(tmp)
	ln, err := net.Listen("unix", tmp)
	if err != nil {
		return nil, err
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false) // it would unlink tmp, not path
	if err := os.Chmod(tmp, 0o600); err != nil {
		ln.Close()
		os.Remove(tmp)
		return nil, err
	}
	if err := os.Rename(tmp, path); err != nil {
		ln.Close()
		os.Remove(tmp)
		return nil, err
	}
	return &unlinkListener{Listener: ln, path: path}, nil
}

// unlinkListener removes its socket file when closed.
type unlinkListener struct {
	net.Listener
	path string
}

func (l *unlinkListener) Close() error {
	err := l.Listener.Close()
	if rerr := os.Remove(l.path); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
		err = errors.Join(err, rerr)
	}
	return err
}

// serveDebug serves d on the unix socket path until the returned stop is called,
// with the bounds of the metrics server (timeouts, headers, requests in flight).
func serveDebug(path string, d *debugAPI, log *slog.Logger) (stop func(), err error) {
	ln, err := listenDebug(path)
	if err != nil {
		return nil, err
	}
	srv := newHTTPServer(d.handler(), slog.NewLogLogger(log.Handler(), slog.LevelWarn))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("debug socket server failed", "debug_socket", path, "err", err)
		}
	}()
	log.Info("serving the debug API (npagent explain, npagent wait)", "debug_socket", path)
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			log.Warn("debug socket server shutdown", "debug_socket", path, "err", err)
		}
		<-done
	}, nil
}
