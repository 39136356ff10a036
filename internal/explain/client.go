package explain

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// Client talks to an agent's debug socket (npagent explain, npagent wait).
type Client struct {
	socket string
	http   *http.Client
}

// NewClient returns a client of the debug socket at socket; each request times out
// after 10 s.
func NewClient(socket string) *Client {
	var d net.Dialer
	return &Client{socket: socket, http: &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", socket)
		}},
	}}
}

// ErrUnreachable wraps every failure to reach the agent.
var ErrUnreachable = errors.New("agent unreachable")

// StartingError is the agent's 503: it answers, but knows nothing yet (its loop is
// not running or its caches have not synced).
type StartingError struct{ Msg string }

func (e StartingError) Error() string { return e.Msg + "; ask again once its /readyz passes" }

// Get fetches path (see server.go) into v. A transport failure wraps
// ErrUnreachable; an answer other than 200 is an error with the agent's message.
func (c *Client) Get(ctx context.Context, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://npagent"+path, nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%w: debug socket %s: %v (is npagent running on this node with --debug-socket=%s, and is its directory mounted here?)", ErrUnreachable, c.socket, err, c.socket)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("%w: debug socket %s: %v", ErrUnreachable, c.socket, err)
	}
	if resp.StatusCode != http.StatusOK {
		var e ErrorBody
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			if resp.StatusCode == http.StatusServiceUnavailable {
				return StartingError{e.Error}
			}
			return fmt.Errorf("agent answered %d: %s", resp.StatusCode, e.Error)
		}
		return fmt.Errorf("agent answered %d: %s", resp.StatusCode, strings.TrimSpace(string(body)))
	}
	return json.Unmarshal(body, v)
}
