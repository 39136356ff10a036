package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/npagent/npagent/internal/explain"
	"github.com/npagent/npagent/internal/reconcile"
)

// The debug endpoint: a read-only JSON API on a unix socket (--debug-socket),
// for `npagent explain` and `npagent wait` on the node (or in an init container
// that mounts the socket's directory). Never TCP: what it shows (pod IPs, policy
// names, errors) is for whoever may read the node's /run, not the network.
//
// The API itself (paths, answers, the 503 until the reconcile loop exists) is
// internal/explain's Server; this file listens.

// defaultDebugSocket is --debug-socket's default.
const defaultDebugSocket = "/run/npagent/debug.sock"

// maxDebugSocketPath bounds --debug-socket: a socket path has at most 107 bytes,
// and the socket is made under a temporary name (path.<pid>.tmp) first.
const maxDebugSocketPath = 90

// The reconcile loop is the debug API's source (internal/explain serves it).
var _ explain.Source = (*reconcile.Controller)(nil)

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
func serveDebug(path string, d *explain.Server, log *slog.Logger) (stop func(), err error) {
	ln, err := listenDebug(path)
	if err != nil {
		return nil, err
	}
	srv := newHTTPServer(d.Handler(), slog.NewLogLogger(log.Handler(), slog.LevelWarn))
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
