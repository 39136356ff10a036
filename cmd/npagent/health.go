package main

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/npagent/npagent/internal/reconcile"
)

// loop is what the probes read of the reconcile loop (*reconcile.Controller).
type loop interface {
	Progress() reconcile.Progress
	HasSynced() bool
	LocalPending() int
	WatchProblem(now time.Time) error
}

// agentHealth is what /livez and /readyz answer from. run fills it in as the agent
// starts: HTTP is served from the first moment, so the probes must make sense
// before the loop exists.
type agentHealth struct {
	stallTimeout time.Duration
	now          func() time.Time

	mu        sync.Mutex
	waiting   error // why the loop does not run yet (nil once it does)
	loop      loop  // nil until built
	dataplane func() error
	degraded  []string
	checks    []func() (note string, err error)
	stopping  bool
}

func newAgentHealth(stallTimeout time.Duration) *agentHealth {
	return &agentHealth{stallTimeout: stallTimeout, now: time.Now, waiting: errors.New("starting")}
}

// setWaiting records why the agent cannot start its loop yet (apiserver unreachable,
// CRDs not served): /readyz answers it.
func (h *agentHealth) setWaiting(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.waiting = err
}

// setLoop records the running loop and its dataplane's readiness check.
func (h *agentHealth) setLoop(l loop, dataplaneReady func() error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.waiting, h.loop, h.dataplane = nil, l, dataplaneReady
}

// addDegraded records something the agent runs without (telemetry it could not set
// up as configured); /readyz lists it, ready or not.
func (h *agentHealth) addDegraded(what string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.degraded = append(h.degraded, what)
}

// addCheck adds a condition /readyz asks at every request once the loop runs: an
// error makes the agent not ready, a note is listed as degraded.
func (h *agentHealth) addCheck(check func() (note string, err error)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.checks = append(h.checks, check)
}

func (h *agentHealth) setStopping() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stopping = true
}

// live is /livez: nil unless the loop runs and is stalled. While the agent waits for
// the apiserver it is alive: a restart would not make the apiserver answer.
func (h *agentHealth) live() error {
	h.mu.Lock()
	l := h.loop
	h.mu.Unlock()
	if l == nil {
		return nil
	}
	return stalled(l.Progress(), h.now(), h.stallTimeout)
}

// ready is /readyz: nil once the loop runs, its caches synced, the dataplane is ready,
// every object of the initial list that selects a pod here was programmed (the
// node's pods have their policy, not only the caches the cluster's objects), the
// loop is not stalled, no informer's watch is (--watch-stall-timeout) and no
// check (addCheck) fails; else the first of those that fails. notes are what runs
// degraded.
func (h *agentHealth) ready() (notes []string, err error) {
	h.mu.Lock()
	waiting, l, dataplane, stopping, checks := h.waiting, h.loop, h.dataplane, h.stopping, h.checks
	notes = append(notes, h.degraded...)
	h.mu.Unlock()
	var checkErr error
	for _, check := range checks {
		note, err := check()
		if note != "" {
			notes = append(notes, note)
		}
		if checkErr == nil {
			checkErr = err
		}
	}
	switch {
	case stopping:
		return notes, errors.New("shutting down")
	case waiting != nil:
		return notes, waiting
	case !l.HasSynced():
		return notes, errors.New("informer caches not synced yet")
	}
	if err := dataplane(); err != nil {
		return notes, err
	}
	switch n := l.LocalPending(); {
	case n < 0:
		return notes, errors.New("workers not started yet")
	case n > 0:
		return notes, fmt.Errorf("%d objects selecting pods on this node not programmed yet", n)
	}
	if err := stalled(l.Progress(), h.now(), h.stallTimeout); err != nil {
		return notes, fmt.Errorf("stalled: %w", err)
	}
	// A stalled or refused watch leaves the agent alive (a restart would not bring
	// the apiserver back or restore its rights) but not ready: the policy it
	// enforces may be out of date.
	if err := l.WatchProblem(h.now()); err != nil {
		return notes, err
	}
	// What the agent found wrong in its own setup (the node's addresses do not fit
	// the dataplane): it enforces, but not as configured.
	return notes, checkErr
}

// stalled reports why the loop makes no progress at now, or nil:
//
//   - a sync in flight for longer than bound: a worker took a key from the queue
//     and has not finished with it (a commit that never returns, a deadlock);
//   - keys queued and no sync finished for longer than bound since the workers
//     started: nobody drains the queue.
//
// Before the workers start (informer caches not synced) nothing is stalled: a slow
// initial list is /readyz's business, and a restart would not speed it up. An idle
// loop with an empty queue is never stalled, however long since its last event.
func stalled(p reconcile.Progress, now time.Time, bound time.Duration) error {
	for i, took := range p.InFlight {
		if !took.IsZero() && now.Sub(took) > bound {
			return fmt.Errorf("worker slot %d: one sync in flight for %v (bound %v, --stall-timeout)",
				i, now.Sub(took).Round(time.Second), bound)
		}
	}
	if p.Queued == 0 || p.WorkersStarted.IsZero() {
		return nil
	}
	last := p.LastSyncDone
	if last.Before(p.WorkersStarted) {
		last = p.WorkersStarted
	}
	if d := now.Sub(last); d > bound {
		return fmt.Errorf("loop wedged: %d keys queued and no sync finished for %v (bound %v, --stall-timeout)",
			p.Queued, d.Round(time.Second), bound)
	}
	return nil
}
