package relay

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/npagent/npagent/api/v1alpha1"
)

// apiPrefix is where the apiserver serves the group: the relay answers on the same
// paths, so a client's REST client only changes its host.
var apiPrefix = "/apis/" + v1alpha1.SchemeGroupVersion.String() + "/"

// stats are the relay's counters, exposed on /metrics.
type stats struct {
	watchers     atomic.Int64
	eventsSent   atomic.Uint64
	bookmarks    atomic.Uint64
	bytesSent    atomic.Uint64
	lists        atomic.Uint64
	expired      atomic.Uint64 // 410s answered or sent
	refused      atomic.Uint64 // 401 and 403
	watchesTotal atomic.Uint64
}

// Handler serves the relay's API (list and watch of both resources, for an
// authenticated node) and its health (/readyz, /healthz, /livez, unauthenticated:
// a client's ListWatch reads the relay's /readyz as it would the apiserver's) and
// /metrics.
func (r *Relay) Handler() http.Handler {
	return http.HandlerFunc(r.serveHTTP)
}

func (r *Relay) serveHTTP(w http.ResponseWriter, req *http.Request) {
	switch req.URL.Path {
	case "/readyz":
		if !r.Ready() {
			http.Error(w, "relay: not synced with the apiserver yet", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
		return
	case "/healthz", "/livez":
		fmt.Fprintln(w, "ok")
		return
	case "/metrics":
		r.writeMetrics(w)
		return
	}
	resource, ok := strings.CutPrefix(req.URL.Path, apiPrefix)
	f := r.feeds[resource]
	if !ok || f == nil {
		writeStatus(w, apierrors.NewNotFound(v1alpha1.SchemeGroupVersion.WithResource(resource).GroupResource(), ""))
		return
	}
	if req.Method != http.MethodGet {
		writeStatus(w, apierrors.NewMethodNotSupported(v1alpha1.SchemeGroupVersion.WithResource(resource).GroupResource(), req.Method))
		return
	}
	q := req.URL.Query()
	watching := q.Get("watch") == "1" || q.Get("watch") == "true"
	verb := "list"
	if watching {
		verb = "watch"
	}
	node, serr := r.auth.authorize(req.Context(), req, verb, resource)
	if serr != nil {
		r.stats.refused.Add(1)
		writeStatus(w, serr)
		return
	}
	var addrs []netip.Addr
	var changed uint64
	if f.grouped {
		ne, known, _ := r.nodes.get(node)
		if !known {
			r.stats.refused.Add(1)
			writeStatus(w, apierrors.NewForbidden(v1alpha1.SchemeGroupVersion.WithResource(resource).GroupResource(), "",
				fmt.Errorf("relay: node %s (from the token) has no Node object the relay knows", node)))
			return
		}
		addrs, changed = ne.addrs, ne.changed
	}
	ctx, cancel := context.WithTimeout(req.Context(), r.cfg.SyncWait)
	synced := f.waitSynced(ctx)
	cancel()
	if !synced {
		writeStatus(w, apierrors.NewServiceUnavailable("relay: not synced with the apiserver"))
		return
	}
	if watching {
		r.serveWatch(w, req, f, node, addrs, changed)
		return
	}
	r.serveList(w, q.Get("limit"), q.Get("continue"), f, addrs, changed)
}

// continueToken is a list page's continuation: good while the node's view is the
// same as at the first page — the feed's generation and the node's addresses stand,
// and no change since the feed's last change then touched the view (an entry that
// renders no event for the node, another node's object, leaves it as it was);
// otherwise 410, and the client lists again. Expiring on any change would make a
// view of several pages unlistable while the cluster is being written to.
type continueToken struct {
	Gen     uint64 `json:"g"`
	Changed uint64 `json:"c"`
	Addrs   uint64 `json:"a"` // the node's addresses' last change (nodes.get)
	RV      uint64 `json:"r"`
	Key     string `json:"k"`
}

func (r *Relay) serveList(w http.ResponseWriter, limitParam, cont string, f *feed, addrs []netip.Addr, addrsChanged uint64) {
	r.stats.lists.Add(1)
	var prev continueToken
	if cont != "" {
		raw, err := base64.RawURLEncoding.DecodeString(cont)
		if err == nil {
			err = json.Unmarshal(raw, &prev)
		}
		if err != nil {
			writeStatus(w, apierrors.NewBadRequest("relay: continue token: "+err.Error()))
			return
		}
	}
	f.mu.RLock()
	view := f.viewLocked(addrs)
	tok := continueToken{Gen: f.gen, Changed: f.changed, Addrs: addrsChanged, RV: f.rv}
	expired := cont != "" && (prev.Gen != tok.Gen || prev.Addrs != tok.Addrs ||
		prev.Changed != tok.Changed && f.viewChangedLocked(prev.Changed, addrs))
	f.mu.RUnlock()
	if cont != "" {
		if expired {
			r.stats.expired.Add(1)
			writeStatus(w, apierrors.NewResourceExpired("relay: the continue token is expired: list again without it"))
			return
		}
		tok.Changed, tok.RV = prev.Changed, prev.RV // the view as of the first page, which it still is
		i, _ := slices.BinarySearchFunc(view, prev.Key, func(o *object, k string) int { return strings.Compare(o.key, k) })
		for i < len(view) && view[i].key <= prev.Key {
			i++
		}
		view = view[i:]
	}
	next := ""
	if limit, err := strconv.Atoi(limitParam); err == nil && limit > 0 && len(view) > limit {
		view = view[:limit]
		tok.Key = view[limit-1].key
		raw, _ := json.Marshal(tok)
		next = base64.RawURLEncoding.EncodeToString(raw)
	}
	w.Header().Set("Content-Type", "application/json")
	bw := bufio.NewWriterSize(w, 64<<10)
	fmt.Fprintf(bw, `{"kind":%q,"apiVersion":%q,"metadata":{"resourceVersion":"%d"`, f.gvk.Kind+"List", f.gvk.GroupVersion().String(), tok.RV)
	if next != "" {
		fmt.Fprintf(bw, `,"continue":%q`, next)
	}
	bw.WriteString(`},"items":[`)
	for i, o := range view {
		if i > 0 {
			bw.WriteByte(',')
		}
		bw.Write(o.raw)
	}
	bw.WriteString("]}\n")
	r.stats.bytesSent.Add(uint64(bw.Buffered()))
	_ = bw.Flush()
}

// serveWatch streams the node's view from the resourceVersion asked for: the
// window's events after it, rendered for the node (render), then live ones, with
// bookmarks; a resourceVersion older than the window, or than the node's addresses,
// is 410 Gone, as are a watcher that fell behind the window and an upstream relist
// (sent as an ERROR event once streaming).
func (r *Relay) serveWatch(w http.ResponseWriter, req *http.Request, f *feed, node string, addrs []netip.Addr, addrsChanged uint64) {
	q := req.URL.Query()
	rvParam := q.Get("resourceVersion")
	initial := q.Get("sendInitialEvents") == "true"
	bookmarks := q.Get("allowWatchBookmarks") == "true"
	ctx := req.Context()
	if s, err := strconv.Atoi(q.Get("timeoutSeconds")); err == nil && s > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(s)*time.Second)
		defer cancel()
	}
	f.mu.RLock()
	gen := f.gen
	var (
		start  []*object
		cursor uint64
	)
	if initial || rvParam == "" || rvParam == "0" {
		start, cursor = f.viewLocked(addrs), f.rv
	} else {
		n, err := parseRV(rvParam)
		if err != nil {
			f.mu.RUnlock()
			writeStatus(w, apierrors.NewBadRequest("relay: resourceVersion: "+err.Error()))
			return
		}
		if _, ok := f.sinceLocked(n); !ok || n > f.rv || (f.grouped && n < addrsChanged) {
			have := f.start
			f.mu.RUnlock()
			r.stats.expired.Add(1)
			writeStatus(w, apierrors.NewResourceExpired(fmt.Sprintf("relay: too old resource version: %d (%d)", n, have)))
			return
		}
		cursor = n
	}
	f.mu.RUnlock()

	r.stats.watchers.Add(1)
	r.stats.watchesTotal.Add(1)
	defer r.stats.watchers.Add(-1)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Transfer-Encoding", "chunked")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	ew := &eventWriter{bw: bufio.NewWriterSize(w, 32<<10), kind: f.gvk.Kind, apiVersion: f.gvk.GroupVersion().String()}
	flush := func() bool {
		r.stats.bytesSent.Add(uint64(ew.bw.Buffered()))
		r.stats.eventsSent.Add(ew.events)
		ew.events = 0
		if ew.bw.Flush() != nil {
			return false
		}
		if flusher != nil {
			flusher.Flush()
		}
		return true
	}
	for _, o := range start {
		ew.event(watch.Added, o)
	}
	if initial {
		ew.bookmark(cursor, true)
		r.stats.bookmarks.Add(1)
	}
	if !flush() {
		return
	}
	tick := time.NewTicker(r.cfg.BookmarkInterval)
	defer tick.Stop()
	var out []outEvent
	_, _, nodesWake := r.nodes.get(node)
	for {
		f.mu.RLock()
		stale := f.gen != gen
		entries, ok := f.sinceLocked(cursor)
		frv, wake := f.rv, f.wake
		f.mu.RUnlock()
		if stale || !ok {
			r.stats.expired.Add(1)
			ew.expired(fmt.Sprintf("relay: the watch fell behind or the relay relisted: resourceVersion %d is gone", cursor))
			flush()
			return
		}
		for i := range entries {
			out = f.render(out[:0], &entries[i], addrs)
			for _, ev := range out {
				ew.event(ev.typ, ev.obj)
			}
		}
		cursor = max(cursor, frv)
		if len(entries) > 0 && !flush() {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-wake:
		case <-nodesWake:
			var ne nodeEntry
			ne, _, nodesWake = r.nodes.get(node)
			if f.grouped && !slices.Equal(ne.addrs, addrs) {
				r.stats.expired.Add(1)
				ew.expired(fmt.Sprintf("relay: node %s's addresses changed: list again", node))
				flush()
				return
			}
		case <-tick.C:
			if bookmarks {
				ew.bookmark(cursor, false)
				r.stats.bookmarks.Add(1)
				if !flush() {
					return
				}
			}
		}
	}
}

// eventWriter writes watch events as the apiserver's JSON watch stream does: one
// metav1.WatchEvent per line.
type eventWriter struct {
	bw               *bufio.Writer
	kind, apiVersion string
	events           uint64
}

func (ew *eventWriter) event(typ watch.EventType, o *object) {
	ew.bw.WriteString(`{"type":"`)
	ew.bw.WriteString(string(typ))
	ew.bw.WriteString(`","object":`)
	ew.bw.Write(o.raw)
	ew.bw.WriteString("}\n")
	ew.events++
}

func (ew *eventWriter) bookmark(rv uint64, initialEnd bool) {
	annotations := ""
	if initialEnd {
		annotations = fmt.Sprintf(`,"annotations":{%q:"true"}`, metav1.InitialEventsAnnotationKey)
	}
	fmt.Fprintf(ew.bw, `{"type":"BOOKMARK","object":{"kind":%q,"apiVersion":%q,"metadata":{"resourceVersion":"%d"%s}}}`+"\n",
		ew.kind, ew.apiVersion, rv, annotations)
}

func (ew *eventWriter) expired(msg string) {
	st := apierrors.NewResourceExpired(msg).Status()
	st.Kind, st.APIVersion = "Status", "v1"
	body, _ := json.Marshal(st)
	ew.bw.WriteString(`{"type":"ERROR","object":`)
	ew.bw.Write(body)
	ew.bw.WriteString("}\n")
}

// writeStatus answers err as the apiserver does: a metav1.Status with its code.
func writeStatus(w http.ResponseWriter, err *apierrors.StatusError) {
	st := err.Status()
	st.Kind, st.APIVersion = "Status", "v1"
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(int(st.Code))
	_ = json.NewEncoder(w).Encode(st)
}

func parseRV(s string) (uint64, error) {
	return strconv.ParseUint(s, 10, 64)
}

// writeMetrics writes the relay's counters in the Prometheus text format.
func (r *Relay) writeMetrics(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	for _, m := range []struct {
		name, typ, help string
		v               float64
	}{
		{"npagent_relay_watchers", "gauge", "Watches open now.", float64(r.stats.watchers.Load())},
		{"npagent_relay_watches_total", "counter", "Watches opened.", float64(r.stats.watchesTotal.Load())},
		{"npagent_relay_events_sent_total", "counter", "Watch events sent (bookmarks not counted).", float64(r.stats.eventsSent.Load())},
		{"npagent_relay_bookmarks_sent_total", "counter", "Bookmark events sent.", float64(r.stats.bookmarks.Load())},
		{"npagent_relay_bytes_sent_total", "counter", "Bytes of list and watch bodies sent.", float64(r.stats.bytesSent.Load())},
		{"npagent_relay_lists_total", "counter", "List requests (pages) served.", float64(r.stats.lists.Load())},
		{"npagent_relay_expired_total", "counter", "410 Gone answered or sent (the client lists again).", float64(r.stats.expired.Load())},
		{"npagent_relay_refused_total", "counter", "Requests refused (401, 403).", float64(r.stats.refused.Load())},
	} {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n%s %g\n", m.name, m.help, m.name, m.typ, m.name, m.v)
	}
	ready := 0
	if r.Ready() {
		ready = 1
	}
	fmt.Fprintf(w, "# HELP npagent_relay_ready Whether the relay is synced with the apiserver.\n# TYPE npagent_relay_ready gauge\nnpagent_relay_ready %d\n", ready)
}
