package reconcile

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/npagent/npagent/internal/report"
)

// watchHealth is what one informer's ListWatch (client.go) records as it lists and
// watches: atomic stores only, read at each collection and by /readyz.
type watchHealth struct {
	established atomic.Bool
	lastEvent   atomic.Int64 // Unix ns of the last event, bookmark or list; 0 = never
	downSince   atomic.Int64 // Unix ns when the watch last ended; 0 = never opened
	listErrors  atomic.Uint64
	watchErrors atomic.Uint64
	relists     [report.NumRelistCauses]atomic.Uint64
}

// event records something received from the apiserver at now.
func (h *watchHealth) event(now time.Time) { h.lastEvent.Store(now.UnixNano()) }

// watching records a watch opened (true) or ended (false) at now.
func (h *watchHealth) watching(open bool, now time.Time) {
	if !open {
		h.downSince.Store(now.UnixNano())
	}
	h.established.Store(open)
}

// snapshot returns the health at now, Stalled judged against bound.
func (h *watchHealth) snapshot(now time.Time, bound time.Duration) report.WatchHealth {
	w := report.WatchHealth{
		Established: h.established.Load(),
		LastEvent:   unixNano(h.lastEvent.Load()),
		ListErrors:  h.listErrors.Load(),
		WatchErrors: h.watchErrors.Load(),
	}
	for c := range w.Relists {
		w.Relists[c] = h.relists[c].Load()
	}
	w.Age, w.Stalled = watchStalled(w.Established, w.LastEvent, unixNano(h.downSince.Load()), now, bound)
	return w
}

// watchStalled is the stall rule. A watch delivers events when objects change and a
// bookmark about once a minute when none do (the reflector asks for bookmarks and the
// apiserver's watch cache sends them), so a healthy watch of a quiet cluster is never
// silent for long. The informer is stalled when
//
//   - its watch is open but nothing (event or bookmark) arrived for longer than bound;
//   - or its watch is down (not yet opened, or ended and not reopened) and nothing
//     arrived for longer than bound, and it has been down that long.
//
// Before the first list nothing is stalled: the initial sync is /readyz's own check.
// age is now minus the last arrival (0 before the first).
func watchStalled(established bool, lastEvent, downSince, now time.Time, bound time.Duration) (age time.Duration, stalled bool) {
	if lastEvent.IsZero() {
		return 0, false
	}
	age = now.Sub(lastEvent)
	if age <= bound {
		return age, false
	}
	if !established && !downSince.IsZero() && now.Sub(downSince) <= bound {
		return age, false // went down recently after a long quiet watch
	}
	return age, true
}

// watchCounts fills dst.Watch, stall judged at now against the configured bound.
func (c *Controller) watchCounts(dst *report.Counts, now time.Time) {
	for k := range dst.Watch {
		dst.Watch[k] = c.watch[k].snapshot(now, c.cfg.WatchStallTimeout)
	}
}

// WatchStalled returns an error naming each informer whose watch is stalled at now
// (see watchStalled), or nil. For /readyz.
func (c *Controller) WatchStalled(now time.Time) error {
	var err error
	for k := range c.watch {
		w := c.watch[k].snapshot(now, c.cfg.WatchStallTimeout)
		if !w.Stalled {
			continue
		}
		state := "open"
		if !w.Established {
			state = "down"
		}
		e := fmt.Errorf("%s watch stalled: %s, nothing received for %v (bound %v, --watch-stall-timeout)",
			report.Kind(k), state, w.Age.Round(time.Second), c.cfg.WatchStallTimeout)
		if err == nil {
			err = e
		} else {
			err = fmt.Errorf("%w; %w", err, e)
		}
	}
	return err
}
