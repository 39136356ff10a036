package telemetry

import (
	"slices"
	"sync"
	"time"

	"github.com/npagent/npagent/internal/report"
)

// handoff moves the drawing of span trees off the reconcile goroutine, in front of
// the one emission path (draw: the SDK's tracer), because measured on the real loop
// the tracer path costs several times more there than it does in a batch: between
// two reports the worker waits for an fsync, so each tree was drawn with cold caches
// (about 48 µs per trigger against 18 µs back to back). Report copies the record
// into a bounded queue; one goroutine wakes every drawInterval and draws what is
// queued, back to back. Nothing else is built here: no spans, no ids.
//
// Nothing is lost and nothing waits without bound: when the queue is full, or once
// Shutdown has begun, the caller draws the record itself; a scrape, ForceFlush and
// Shutdown drain the queue first, so they see every trigger reported before them.
// The histogram point of a queued trigger is recorded when its tree is drawn (the
// exemplar must name the drawn root): within drawInterval, or at the next drain.
type handoff struct {
	queue  chan *report.Record
	drawMu sync.Mutex // one drain at a time: the goroutine's, a flush's, a scrape's
	// closeMu: offer holds it shared while it checks closed and queues, close
	// exclusively to set closed, so no record is queued after the final drain.
	closeMu sync.RWMutex
	closed  bool
	stop    chan struct{}
	done    chan struct{}
}

// drawInterval is how often the goroutine draws what is queued: often enough that
// a point reaches an OTLP export round or a scrape promptly, rarely enough that a
// burst of reports is drawn back to back.
const drawInterval = 20 * time.Millisecond

func newHandoff(size int) *handoff {
	return &handoff{queue: make(chan *report.Record, size), stop: make(chan struct{}), done: make(chan struct{})}
}

// run is the drawing goroutine; it returns after stop, having drained the queue.
func (h *handoff) run(draw func(*report.Record)) {
	defer close(h.done)
	tick := time.NewTicker(drawInterval)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			h.drain(draw)
		case <-h.stop:
			h.drain(draw)
			return
		}
	}
}

// offer queues a copy of r; false when the queue is full or stopping (the caller
// draws it then).
func (h *handoff) offer(r *report.Record) bool {
	h.closeMu.RLock()
	defer h.closeMu.RUnlock()
	if h.closed {
		return false
	}
	c := *r
	c.Attempts = slices.Clone(r.Attempts) // the caller may reuse its record
	select {
	case h.queue <- &c:
		return true
	default:
		return false
	}
}

// drain draws everything queued now.
func (h *handoff) drain(draw func(*report.Record)) {
	h.drawMu.Lock()
	defer h.drawMu.Unlock()
	for {
		select {
		case r := <-h.queue:
			draw(r)
		default:
			return
		}
	}
}

// close stops the goroutine after it drained the queue; later offers fail, and
// none that began before can queue after the final drain.
func (h *handoff) close() {
	h.closeMu.Lock()
	first := !h.closed
	h.closed = true
	h.closeMu.Unlock()
	if first {
		close(h.stop)
	}
	<-h.done
}
