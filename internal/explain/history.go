package explain

import (
	"slices"
	"sync"
	"time"

	"github.com/npagent/npagent/internal/report"
)

// History bounds per object uid.
const (
	maxVersions = 8 // versions kept, newest last
	maxReports  = 4 // reports kept, newest last
	maxAttempts = 8 // attempts kept per report: the newest, the successful one last
)

// History is what is gone by the time an operator asks, recorded as it happens,
// per object uid: each version the events brought, with its trigger and receipt,
// and the outcome of its last sync (recorded by the worker); and the last reports
// with their phases (recorded as they pass to the Sink). It is bounded per uid and
// dropped with the uid (Forget), so it stays O(live objects). Its methods are safe
// for concurrent use, and on a nil History (they do nothing), for tests that build
// parts of the loop alone.
type History struct {
	mu    sync.Mutex
	byUID map[string]*objectHistory
}

type objectHistory struct {
	versions []VersionInfo
	reports  []ReportInfo
}

func (l *History) get(uid string) *objectHistory {
	if l.byUID == nil {
		l.byUID = map[string]*objectHistory{}
	}
	h := l.byUID[uid]
	if h == nil {
		h = &objectHistory{}
		l.byUID[uid] = h
	}
	return h
}

// version returns the entry of rv, adding it (the oldest dropped beyond the bound).
func (h *objectHistory) version(rv string) *VersionInfo {
	for i := range h.versions {
		if h.versions[i].ResourceVersion == rv {
			return &h.versions[i]
		}
	}
	if len(h.versions) == maxVersions {
		h.versions = slices.Delete(h.versions, 0, 1)
	}
	h.versions = append(h.versions, VersionInfo{ResourceVersion: rv})
	return &h.versions[len(h.versions)-1]
}

// Received records version rv of uid the first time an event brings it, at event
// time: its trigger (zero if none) and whether it has work on this node.
func (l *History) Received(uid, rv string, trigger time.Time, localWork bool, at time.Time) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.get(uid).version(rv)
	e.Trigger, e.Received = trigger, at
	e.LocalWork = &localWork
}

// Sync is how a worker's sync of a version ended.
type Sync struct {
	Outcome  string // StateProgrammed, StateNoLocalWork, StateWaiting, StateFailed or StateRejected
	Detail   string // the error, or the pods waiting for an interface
	Pods     int    // local pods committed or removed
	SyncedAt time.Time
}

// Synced records how a worker's sync of version rv of uid ended; trigger is the
// version's (kept if an event recorded one first).
func (l *History) Synced(uid, rv string, trigger time.Time, s Sync) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	ve := l.get(uid).version(rv)
	if ve.Trigger.IsZero() {
		ve.Trigger = trigger
	}
	ve.Outcome, ve.Detail, ve.Pods, ve.SyncedAt = s.Outcome, s.Detail, s.Pods, s.SyncedAt
}

// Reported records a report as it goes to the Sink.
func (l *History) Reported(r *report.Record) {
	if l == nil || len(r.Attempts) == 0 {
		return
	}
	ri := ReportOf(r)
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.get(r.UID)
	if len(h.reports) == maxReports {
		h.reports = slices.Delete(h.reports, 0, 1)
	}
	h.reports = append(h.reports, ri)
}

// Forget drops uid's history.
func (l *History) Forget(uid string) {
	if l == nil {
		return
	}
	l.mu.Lock()
	delete(l.byUID, uid)
	l.mu.Unlock()
}

// Snapshot copies uid's history.
func (l *History) Snapshot(uid string) (versions []VersionInfo, reports []ReportInfo) {
	if l == nil {
		return nil, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.byUID[uid]
	if h == nil {
		return nil, nil
	}
	return slices.Clone(h.versions), slices.Clone(h.reports)
}

// Refine adds what the last sync of version rv found to state, which the pod
// table gave: programmed may be no-local-work, and so may not-synced (the table
// keeps nothing of a version with no work here that it never held: a stub, see
// internal/reconcile); failed may be waiting for interfaces; failed and rejected get
// their detail.
func (l *History) Refine(uid, rv, state string) (string, string) {
	if l == nil {
		return state, ""
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.byUID[uid]
	if h == nil {
		return state, ""
	}
	for _, ve := range h.versions {
		if ve.ResourceVersion != rv || ve.Outcome == "" {
			continue
		}
		switch {
		case (state == StateProgrammed || state == StateNotSynced) && ve.Outcome == StateNoLocalWork:
			return StateNoLocalWork, ""
		case state == StateFailed && ve.Outcome == StateWaiting:
			return StateWaiting, ve.Detail
		case state == StateFailed || state == StateRejected:
			return state, ve.Detail
		}
	}
	return state, ""
}

// Holds reports whether uid has a history.
func (l *History) Holds(uid string) bool {
	if l == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.byUID[uid]
	return ok
}

// Sink returns a report.Sink that records each report in l, then passes
// everything on to next.
func (l *History) Sink(next report.Sink) report.Sink { return historySink{next: next, log: l} }

type historySink struct {
	next report.Sink
	log  *History
}

func (s historySink) Report(r *report.Record) {
	s.log.Reported(r) // before: the Sink owns r once it has it
	s.next.Report(r)
}

func (s historySink) Committed(k report.Kind, a *report.Attempt) { s.next.Committed(k, a) }

var _ report.Sink = historySink{}
