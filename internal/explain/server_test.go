package explain

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/npagent/npagent/internal/report"
)

type fakeSource struct{ unsynced bool }

func (f fakeSource) HasSynced() bool { return !f.unsynced }

func (fakeSource) ExplainObject(kind report.Kind, namespace, name string) ObjectExplain {
	return ObjectExplain{Kind: kind.String(), Namespace: namespace, Name: name, State: StateProgrammed}
}

func (fakeSource) ExplainPod(q PodQuery) PodExplain {
	out := PodExplain{Namespace: q.Namespace, Name: q.Name}
	if q.IP.IsValid() {
		out.IP = q.IP.String()
	}
	return out
}

// TestServerAndClient: through a unix socket, the client reads what the server
// answers: 503 with the reason until the source is set, then each path's answer,
// 400 for a bad IP; a socket nobody listens on is ErrUnreachable.
func TestServerAndClient(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "d.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var s Server
	srv := &http.Server{Handler: s.Handler()}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	ctx := context.Background()
	c := NewClient(sock)

	var ex ObjectExplain
	if err := c.Get(ctx, "/v1/object/pe/shop/web", &ex); !errors.As(err, new(StartingError)) || !strings.Contains(err.Error(), "not running yet") || errors.Is(err, ErrUnreachable) {
		t.Errorf("before the source is set: %v; want 503 (StartingError) with the reason", err)
	}
	// Before the caches synced every object would read as unknown: still starting.
	s.SetSource(fakeSource{unsynced: true})
	if err := c.Get(ctx, "/v1/object/pe/shop/web", &ex); !errors.As(err, new(StartingError)) || !strings.Contains(err.Error(), "caches not synced") {
		t.Errorf("before the caches synced: %v; want 503 (StartingError) saying so", err)
	}
	s.SetSource(fakeSource{})
	if err := c.Get(ctx, "/v1/object/pe/shop/web", &ex); err != nil || ex.Kind != "PolicyEndpoint" || ex.Namespace != "shop" || ex.Name != "web" {
		t.Errorf("pe: %+v, %v", ex, err)
	}
	var cpe ObjectExplain
	if err := c.Get(ctx, "/v1/object/cpe/deny", &cpe); err != nil || cpe.Kind != "ClusterPolicyEndpoint" || cpe.Namespace != "" || cpe.Name != "deny" {
		t.Errorf("cpe: %+v, %v", cpe, err)
	}
	var pod PodExplain
	if err := c.Get(ctx, "/v1/pod/shop/web-1", &pod); err != nil || pod.Namespace != "shop" || pod.Name != "web-1" {
		t.Errorf("pod: %+v, %v", pod, err)
	}
	var byIP PodExplain
	if err := c.Get(ctx, "/v1/podip/10.1.0.1", &byIP); err != nil || byIP.IP != netip.MustParseAddr("10.1.0.1").String() {
		t.Errorf("podip: %+v, %v", byIP, err)
	}
	if err := c.Get(ctx, "/v1/podip/nope", &pod); err == nil || !strings.Contains(err.Error(), "400") || !strings.Contains(err.Error(), "not an IP address") {
		t.Errorf("bad IP: %v; want 400 naming it", err)
	}
	if err := NewClient(filepath.Join(t.TempDir(), "none.sock")).Get(ctx, "/v1/object/cpe/x", &ex); !errors.Is(err, ErrUnreachable) {
		t.Errorf("no agent: %v; want ErrUnreachable", err)
	}
}

type verdictFake struct {
	fakeSource
	got *VerdictQuery
}

func (f verdictFake) ExplainVerdict(q VerdictQuery) (VerdictExplain, error) {
	*f.got = q
	return VerdictExplain{Verdict: VerdictDeny, Protocol: q.Protocol, Port: q.Port}, nil
}

// TestServerVerdict: GET /v1/verdict hands the source the query the client built
// (pod and IP ends, port and protocol, icmp without a port); a malformed query is
// 400 naming the parameter; a source that cannot judge packets says so (400).
func TestServerVerdict(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "d.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var s Server
	srv := &http.Server{Handler: s.Handler()}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	ctx := context.Background()
	c := NewClient(sock)
	s.SetSource(fakeSource{})
	q := VerdictQuery{From: PodQuery{Namespace: "shop", Name: "web-1"}, To: PodQuery{IP: netip.MustParseAddr("fd00::5")}, Protocol: "udp", Port: 53}
	var v VerdictExplain
	if err := c.Get(ctx, q.Path(), &v); err == nil || !strings.Contains(err.Error(), "does not judge packets") {
		t.Errorf("a source without verdicts: %v; want 400 saying so", err)
	}
	var got VerdictQuery
	s.SetSource(verdictFake{got: &got})
	for _, want := range []VerdictQuery{q, {From: PodQuery{IP: netip.MustParseAddr("10.0.0.1")}, To: PodQuery{Namespace: "a", Name: "b"}, Protocol: "icmp"}} {
		if err := c.Get(ctx, want.Path(), &v); err != nil || got != want || v.Verdict != VerdictDeny {
			t.Errorf("query %+v: source got %+v, answer %+v, %v", want, got, v, err)
		}
	}
	for path, param := range map[string]string{
		"/v1/verdict?from=10.0.0.1&to=pod/a/b&port=80":      "port",
		"/v1/verdict?from=pod/a&to=pod/a/b&port=80/tcp":     "from",
		"/v1/verdict?from=10.0.0.1&to=x&port=80/tcp":        "to",
		"/v1/verdict?from=10.0.0.1&to=pod/a/b&port=0/tcp":   "port",
		"/v1/verdict?from=10.0.0.1&to=pod/a/b&port=80/icmp": "port",
	} {
		if err := c.Get(ctx, path, &v); err == nil || !strings.Contains(err.Error(), "400") || !strings.Contains(err.Error(), param+":") {
			t.Errorf("%s: %v; want 400 naming %s", path, err, param)
		}
	}
}
