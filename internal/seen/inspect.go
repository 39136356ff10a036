package seen

import (
	"slices"
	"time"

	"github.com/npagent/npagent/internal/report"
)

// Read-only views of the set, for an operator's debugging view (npagent explain)
// and for the oldest-pending gauge. They take a shard's lock like every other
// call and change nothing, not even a counter.

// PendingTrigger is one trigger waiting for a commit, as Inspect shows it.
type PendingTrigger struct {
	Trigger    time.Time // the annotation's trigger time
	ReceivedAt time.Time // local time the event carrying it was first received
	// ProgrammedAt is set when an earlier commit already held this trigger
	// before its event was observed (see Report.Ahead); zero otherwise.
	ProgrammedAt time.Time
	// Failures is how many commits failed since it was accepted.
	Failures int
}

// Entry is what the set holds for one uid.
type Entry struct {
	// Consumed is the newest trigger reported or deliberately suppressed; zero
	// if none.
	Consumed time.Time
	// Pending are the triggers waiting for a commit, oldest first.
	Pending []PendingTrigger
	// Failed are the failed commit attempts since the last success, oldest
	// first (the newest 16 in detail; Pending[i].Failures counts them all).
	Failed []report.Attempt
}

// Inspect returns a copy of what the set holds for uid, and false when it
// tracks nothing for it.
func (s *Set) Inspect(uid string) (Entry, bool) {
	k := makeKey(uid)
	sh := s.shardOf(&k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, found := sh.get(&k)
	if !found {
		return Entry{}, false
	}
	var out Entry
	if e.consumed != noTime {
		out.Consumed = timeOf(e.consumed)
	}
	if p := e.pend; p != nil {
		out.Pending = make([]PendingTrigger, len(p.triggers))
		for i, q := range p.triggers {
			out.Pending[i] = PendingTrigger{Trigger: timeOf(q.trigger), ReceivedAt: timeOf(q.receivedAt), Failures: int(q.failures)}
			if q.programmedAt != noTime {
				out.Pending[i].ProgrammedAt = timeOf(q.programmedAt)
			}
		}
		out.Failed = slices.Clone(p.failed)
	}
	return out, true
}

// OldestPending returns the oldest trigger time pending a commit over every uid,
// and the local time its event was received; ok is false when nothing is
// pending. It visits every tracked uid, one shard lock at a time: O(objects),
// meant for a metric collection, not for a hot path.
func (s *Set) OldestPending() (trigger, receivedAt time.Time, ok bool) {
	oldest, received := int64(0), int64(0)
	visit := func(e entry) {
		if e.pend == nil || len(e.pend.triggers) == 0 {
			return
		}
		q := e.pend.triggers[0] // sorted: the oldest first
		if !ok || q.trigger < oldest {
			oldest, received, ok = q.trigger, q.receivedAt, true
		}
	}
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		if sh.pendingCount > 0 {
			for _, e := range sh.byUUID {
				visit(e)
			}
			for _, e := range sh.byName {
				visit(e)
			}
		}
		sh.mu.Unlock()
	}
	if !ok {
		return time.Time{}, time.Time{}, false
	}
	return timeOf(oldest), timeOf(received), true
}
