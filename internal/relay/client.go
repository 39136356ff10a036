package relay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
)

// ClientOptions tune ClientConfig.
type ClientOptions struct {
	// CAFile is the CA bundle the relay's serving certificate is checked against.
	CAFile string
	// RetryAfter is how long requests go to the apiserver after the relay did not
	// answer, before the relay is asked again. Default 30s.
	RetryAfter time.Duration
	// DialTimeout bounds connecting to the relay. Default 3s.
	DialTimeout time.Duration
	// Logger; default slog.Default().
	Logger *slog.Logger
}

// ClientConfig returns the rest.Config an agent's PolicyEndpoint and
// ClusterPolicyEndpoint informers use with a relay at relayURL: the same requests,
// with api's bearer token (its service-account token; client certificates are not
// sent to the relay), to the relay; and while no relay answers (it cannot be
// reached, or answers 5xx, 401 or 403), to the apiserver api reaches, trying the
// relay again every RetryAfter. The relay is a cache: an agent is never left
// without its policies because the relay is gone.
//
// Moving between the two is a relist: the relay's view is the node's, the
// apiserver's the cluster's, so a watch continued on the other source would miss
// objects entering or leaving the view. A watch sent to the other source than the
// collection's last list is answered 410 Gone here (the client's ListWatch lists
// again), and when the relay is back the watches on the apiserver are ended (the
// client reopens them, to the relay, and lists again).
//
// ctx bounds the goroutine that waits for the relay's return.
func ClientConfig(ctx context.Context, api *rest.Config, relayURL string, opts ClientOptions) (*rest.Config, error) {
	if opts.RetryAfter <= 0 {
		opts.RetryAfter = 30 * time.Second
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = 3 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	relayBase, err := url.Parse(relayURL)
	if err != nil || relayBase.Scheme == "" || relayBase.Host == "" {
		return nil, fmt.Errorf("relay: --relay-url %q: want https://host:port", relayURL)
	}
	relayCfg := rest.CopyConfig(api)
	relayCfg.Host = relayURL
	relayCfg.APIPath = ""
	relayCfg.TLSClientConfig = rest.TLSClientConfig{CAFile: opts.CAFile}
	relayCfg.ExecProvider, relayCfg.AuthProvider = nil, nil
	relayCfg.Username, relayCfg.Password = "", ""
	relayCfg.Dial = (&net.Dialer{Timeout: opts.DialTimeout, KeepAlive: 30 * time.Second}).DialContext
	relayRT, err := rest.TransportFor(relayCfg)
	if err != nil {
		return nil, fmt.Errorf("relay: transport to %s: %w", relayURL, err)
	}
	apiRT, err := rest.TransportFor(api)
	if err != nil {
		return nil, fmt.Errorf("relay: transport to the apiserver: %w", err)
	}
	apiBase, err := url.Parse(api.Host)
	if err != nil {
		return nil, fmt.Errorf("relay: apiserver host %q: %w", api.Host, err)
	}
	if apiBase.Scheme == "" { // "host:port", as rest.Config allows
		apiBase, _ = url.Parse("https://" + api.Host)
	}
	t := &fallback{ctx: ctx, relay: relayRT, api: apiRT, relayBase: relayBase, apiBase: apiBase,
		retryAfter: opts.RetryAfter, log: opts.Logger, listed: map[string]source{}, apiWatches: map[*trackedBody]struct{}{}}
	return &rest.Config{
		Host:      relayURL,
		Transport: t,
		UserAgent: api.UserAgent,
		QPS:       api.QPS,
		Burst:     api.Burst,
		Timeout:   api.Timeout,
	}, nil
}

type source int

const (
	fromRelay source = iota + 1
	fromAPI
)

func (s source) String() string {
	if s == fromRelay {
		return "relay"
	}
	return "apiserver"
}

// fallback is the RoundTripper of ClientConfig.
type fallback struct {
	ctx                context.Context
	relay, api         http.RoundTripper
	relayBase, apiBase *url.URL
	retryAfter         time.Duration
	log                *slog.Logger

	mu         sync.Mutex
	down       bool              // the relay did not answer: requests go to the apiserver
	listed     map[string]source // collection path → where its last list came from
	apiWatches map[*trackedBody]struct{}
}

func (t *fallback) RoundTrip(req *http.Request) (*http.Response, error) {
	t.mu.Lock()
	down := t.down
	t.mu.Unlock()
	if !down {
		resp, err := t.relay.RoundTrip(req.Clone(req.Context()))
		if err == nil && !refused(resp.StatusCode) {
			return t.answered(req, fromRelay, resp)
		}
		if req.Context().Err() != nil {
			return resp, err
		}
		reason := ""
		if err != nil {
			reason = err.Error()
		} else {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
			resp.Body.Close()
			reason = resp.Status + ": " + string(body)
		}
		t.relayDown(reason)
	}
	return t.toAPI(req)
}

// refused reports whether the relay's answer means "no relay here": it is not
// ready or cannot review tokens (5xx), or refuses this agent (401, 403, e.g. a
// token with no node): the apiserver decides then.
func refused(code int) bool {
	return code >= 500 || code == http.StatusUnauthorized || code == http.StatusForbidden
}

// toAPI sends req to the apiserver.
func (t *fallback) toAPI(req *http.Request) (*http.Response, error) {
	r := req.Clone(req.Context())
	r.URL.Scheme, r.URL.Host = t.apiBase.Scheme, t.apiBase.Host
	r.URL.Path = strings.TrimSuffix(t.apiBase.Path, "/") + strings.TrimPrefix(req.URL.Path, strings.TrimSuffix(t.relayBase.Path, "/"))
	r.Host = ""
	resp, err := t.api.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	return t.answered(req, fromAPI, resp)
}

// answered records where a list came from, and turns a watch answered by the other
// source than its collection's last list into 410 Gone (see ClientConfig).
func (t *fallback) answered(req *http.Request, from source, resp *http.Response) (*http.Response, error) {
	if resp.StatusCode != http.StatusOK || req.Method != http.MethodGet {
		return resp, nil
	}
	q := req.URL.Query()
	path := strings.TrimPrefix(req.URL.Path, strings.TrimSuffix(t.relayBase.Path, "/"))
	if !strings.HasPrefix(path, "/apis/") {
		return resp, nil // /readyz and the like
	}
	watching := q.Get("watch") == "1" || q.Get("watch") == "true"
	listing := !watching || q.Get("sendInitialEvents") == "true" || q.Get("resourceVersion") == "" || q.Get("resourceVersion") == "0"
	t.mu.Lock()
	defer t.mu.Unlock()
	if listing {
		if prev := t.listed[path]; prev != 0 && prev != from {
			t.log.Info("listing from another source", "path", path, "from", from.String())
		}
		t.listed[path] = from
	} else if prev := t.listed[path]; prev != 0 && prev != from {
		resp.Body.Close() // a watch stream: not drained, the connection is dropped
		return gone(req, fmt.Sprintf("relay: the watch moved from the %s to the %s: list again", prev, from)), nil
	}
	if watching && from == fromAPI {
		tb := &trackedBody{ReadCloser: resp.Body, t: t}
		t.apiWatches[tb] = struct{}{}
		resp.Body = tb
	}
	return resp, nil
}

// relayDown sends requests to the apiserver from now, and tries the relay again
// every retryAfter until it answers /readyz.
func (t *fallback) relayDown(reason string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.down {
		return
	}
	t.down = true
	t.log.Warn("relay did not answer: using the apiserver until it does", "relay", t.relayBase.String(), "reason", reason, "retryAfter", t.retryAfter)
	go t.waitRelay()
}

func (t *fallback) waitRelay() {
	tick := time.NewTicker(t.retryAfter)
	defer tick.Stop()
	for {
		select {
		case <-t.ctx.Done():
			return
		case <-tick.C:
		}
		if t.probe() {
			break
		}
	}
	t.mu.Lock()
	t.down = false
	watches := t.apiWatches
	t.apiWatches = map[*trackedBody]struct{}{}
	t.mu.Unlock()
	t.log.Info("relay answers again: moving the watches back to it", "relay", t.relayBase.String(), "watches", len(watches))
	for tb := range watches {
		tb.end()
	}
}

// probe reports whether the relay answers /readyz with 200.
func (t *fallback) probe() bool {
	ctx, cancel := context.WithTimeout(t.ctx, 5*time.Second)
	defer cancel()
	u := *t.relayBase
	u.Path = strings.TrimSuffix(u.Path, "/") + "/readyz"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return false
	}
	resp, err := t.relay.RoundTrip(req)
	if err != nil {
		t.log.Debug("relay probe", "err", err)
		return false
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()
	t.log.Debug("relay probe", "status", resp.Status)
	return resp.StatusCode == http.StatusOK
}

// gone is a 410 Expired answer to req, as the apiserver gives one.
func gone(req *http.Request, msg string) *http.Response {
	st := apierrors.NewResourceExpired(msg).Status()
	st.Kind, st.APIVersion = "Status", "v1"
	body, _ := json.Marshal(st)
	return &http.Response{
		Status: "410 Gone", StatusCode: http.StatusGone, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Type": []string{"application/json"}},
		Body:          io.NopCloser(bytes.NewReader(body)),
		ContentLength: int64(len(body)),
		Request:       req,
	}
}

// trackedBody is a watch answered by the apiserver while the relay was down: ended
// (as a clean end of stream, which the client reopens) when the relay is back.
type trackedBody struct {
	io.ReadCloser
	t     *fallback
	mu    sync.Mutex
	ended bool
}

func (b *trackedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.mu.Lock()
		ended := b.ended
		b.mu.Unlock()
		if ended && !errors.Is(err, io.EOF) {
			err = io.EOF
		}
	}
	return n, err
}

func (b *trackedBody) end() {
	b.mu.Lock()
	b.ended = true
	b.mu.Unlock()
	_ = b.ReadCloser.Close()
}

func (b *trackedBody) Close() error {
	b.t.mu.Lock()
	delete(b.t.apiWatches, b)
	b.t.mu.Unlock()
	return b.ReadCloser.Close()
}
