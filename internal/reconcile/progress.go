package reconcile

import (
	"sync/atomic"
	"time"
)

// Progress is a snapshot of how far the loop has got, for a liveness check: a sync
// that never ends, or a queue that nobody drains, shows as an old time here. The
// workers record it with atomic stores only (no lock, no allocation), so they pay
// next to nothing for it; reading it takes the
// queue's lock once (for its length).
type Progress struct {
	// WorkersStarted is when the workers began taking keys, after the informer caches
	// synced. Zero before.
	WorkersStarted time.Time
	// InFlight holds, per worker slot, when the sync in it took its key from the
	// queue; zero while the slot is idle. A worker claims a free slot for each key
	// it takes, so a slot is one sync in flight, not one goroutine.
	InFlight []time.Time
	// LastSyncDone is when a worker last finished with a key (synced, retried or
	// given up). Zero before the first.
	LastSyncDone time.Time
	// Queued is how many keys wait in the queue, ready to be taken (keys waiting for
	// a retry's backoff are not counted until it elapses).
	Queued int
}

// Progress returns the loop's progress now.
func (c *Controller) Progress() Progress {
	p := Progress{
		WorkersStarted: unixNano(c.progress.workersStarted.Load()),
		InFlight:       make([]time.Time, len(c.progress.inFlight)),
		LastSyncDone:   unixNano(c.progress.lastSyncDone.Load()),
		Queued:         c.queue.Len(),
	}
	for i := range c.progress.inFlight {
		p.InFlight[i] = unixNano(c.progress.inFlight[i].Load())
	}
	return p
}

// progress is what the loop records for Progress: Unix nanoseconds, 0 for never.
type progress struct {
	workersStarted atomic.Int64
	inFlight       []atomic.Int64 // one slot per worker; 0 = idle
	lastSyncDone   atomic.Int64
}

func (p *progress) init(workers int) { p.inFlight = make([]atomic.Int64, workers) }

// started records that the workers start now.
func (p *progress) started(now time.Time) { p.workersStarted.Store(now.UnixNano()) }

// take records a key taken at now in a free slot and returns the slot, or -1 when
// none is free (more concurrent callers than workers; not recorded). At most
// Workers syncs run at once, so the first or second compare-and-swap succeeds.
func (p *progress) take(now time.Time) int {
	t := now.UnixNano()
	for i := range p.inFlight {
		if p.inFlight[i].CompareAndSwap(0, t) {
			return i
		}
	}
	return -1
}

// done frees slot (from take) and records a sync finished now.
func (p *progress) done(slot int) {
	p.lastSyncDone.Store(time.Now().UnixNano())
	if slot >= 0 {
		p.inFlight[slot].Store(0)
	}
}

func unixNano(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}
