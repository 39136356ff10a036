package kubewatch

import (
	"sync/atomic"
	"time"

	"github.com/npagent/npagent/internal/report"
)

// Health is what one informer's ListWatch (client.go) records as it lists and
// watches: atomic stores only, read at each collection and by /readyz.
type Health struct {
	established  atomic.Bool
	lastEvent    atomic.Int64 // Unix ns of the last event, bookmark, list or watch opened; 0 = never
	downSince    atomic.Int64 // Unix ns when the watch last ended; 0 = never opened
	watchTimeout atomic.Int64 // the open watch's timeoutSeconds, in ns; 0 = none asked
	listErrors   atomic.Uint64
	watchErrors  atomic.Uint64
	relists      [report.NumRelistCauses]atomic.Uint64
	refused      atomic.Pointer[string] // report.WatchHealth.Refused; nil: none
}

// refuse records why a ready apiserver refused a request.
func (h *Health) refuse(err error) {
	msg := err.Error()
	h.refused.Store(&msg)
}

// answered records a request the apiserver granted: no refusal stands.
func (h *Health) answered() {
	if h.refused.Load() != nil {
		h.refused.Store(nil)
	}
}

// event records something received from the apiserver at now.
func (h *Health) event(now time.Time) { h.lastEvent.Store(now.UnixNano()) }

// opened records a watch opened at now, asked to end after timeout (0: none asked).
// The apiserver answering is an arrival.
func (h *Health) opened(now time.Time, timeout time.Duration) {
	h.watchTimeout.Store(int64(timeout))
	h.event(now)
	h.established.Store(true)
	h.answered()
}

// ended records the watch ended at now.
func (h *Health) ended(now time.Time) {
	h.downSince.Store(now.UnixNano())
	h.established.Store(false)
}

// Snapshot returns the health at now, Stalled judged against bound.
func (h *Health) Snapshot(now time.Time, bound time.Duration) report.WatchHealth {
	w := report.WatchHealth{
		Established: h.established.Load(),
		LastEvent:   unixNano(h.lastEvent.Load()),
		ListErrors:  h.listErrors.Load(),
		WatchErrors: h.watchErrors.Load(),
	}
	for c := range w.Relists {
		w.Relists[c] = h.relists[c].Load()
	}
	if r := h.refused.Load(); r != nil {
		w.Refused = *r
	}
	w.Age, w.Stalled = watchStalled(w.Established, w.LastEvent, unixNano(h.downSince.Load()),
		time.Duration(h.watchTimeout.Load()), now, bound)
	return w
}

// watchStalled is the stall rule, judged at now:
//
//   - a watch down (ended and not reopened: the apiserver unreachable, or the
//     reflector backing off) for longer than bound is stalled;
//   - an open watch is stalled when nothing arrived — no event, no bookmark, and
//     it was not reopened — for longer than its own timeout plus bound. A quiet
//     watch may legitimately be silent until its timeout: the apiserver's watch
//     cache sends a bookmark only when the resourceVersion it can vouch for has
//     moved (measured here: nothing in 70 s on an idle apiserver), but it ends
//     every watch at the timeout the reflector asks (5–10 min), and reopening is
//     an arrival. A watch open past that is one the apiserver no longer serves.
//
// Before the first list nothing is stalled: the initial sync is /readyz's own
// check. age is now minus the last arrival (0 before the first).
func watchStalled(established bool, lastEvent, downSince time.Time, watchTimeout time.Duration, now time.Time, bound time.Duration) (age time.Duration, stalled bool) {
	if lastEvent.IsZero() {
		return 0, false
	}
	age = now.Sub(lastEvent)
	if established {
		return age, age > watchTimeout+bound
	}
	down := age // listed, watch not opened yet
	if !downSince.IsZero() && downSince.After(lastEvent) {
		down = now.Sub(downSince)
	}
	return age, down > bound
}

// unixNano is the time of a Unix ns stamp, zero for 0 (never).
func unixNano(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}
