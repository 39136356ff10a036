package seen

import (
	"encoding/binary"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/npagent/npagent/internal/report"
)

type config struct {
	statePath    string
	maxPending   int
	now          func() time.Time
	watermarkLag time.Duration
	maxSkew      time.Duration
	maxAge       time.Duration
}

// Option configures New. Options are applied in order; later ones win.
type Option func(*config)

// WithStatePath sets the file the set persists to and restores from.
// Default "": no persistence (every restart falls back to the start guard).
// The directory must exist and be the agent's own: the file is replaced
// atomically through a uniquely named temporary beside it (internal/atomicfile),
// and New removes the temporaries a process stopped mid-write left in it.
func WithStatePath(path string) Option { return func(c *config) { c.statePath = path } }

// WithMaxPending bounds the pending triggers kept per object. Default 8;
// values below 2 are raised to 2 (the oldest and the newest are always kept).
func WithMaxPending(n int) Option { return func(c *config) { c.maxPending = max(n, 2) } }

// WithNow sets the clock used for the persisted watermark and for receipt
// times that are missing. Default time.Now.
func WithNow(now func() time.Time) Option { return func(c *config) { c.now = now } }

// WithWatermarkLag sets how far behind the events observed the persisted watermark is
// kept. Default 5s. Events for objects created just before a shutdown may
// still be in flight (watch delivery, handler buffers); a lagging watermark
// lets the next process measure them instead of counting them before_start.
// It can never cause a second report: every uid this process saw is
// persisted with its own consumed and pending triggers, which decide its
// events after a restart (see doc.go). Negative values are treated as 0.
func WithWatermarkLag(d time.Duration) Option {
	return func(c *config) { c.watermarkLag = max(d, 0) }
}

// WithMaxWatermarkAge bounds how far before start a restored watermark may
// reach: objects the last process never saw, changed more than this before the
// start, are before_start rather than measured with a latency of (at least) the
// whole downtime. Default 1h; 0 or less: unbounded.
func WithMaxWatermarkAge(d time.Duration) Option { return func(c *config) { c.maxAge = d } }

// WithMaxSkew sets how far past the clock a trigger may lie and still count:
// later ones answer future and are not consumed (see report.Future). Default 5s;
// negative values are treated as 0.
func WithMaxSkew(d time.Duration) Option { return func(c *config) { c.maxSkew = max(d, 0) } }

// Entry flags.
const (
	// flagGuarded: nothing was restored or accepted for this uid in this
	// process, so the start guard still decides its old triggers. Persisted.
	flagGuarded uint8 = 1 << iota
	// flagLocal: a trigger of this uid was reported (this node had work for it),
	// and no version since had none. Persisted: such a uid stays in the state file.
	flagLocal
	// flagsPersisted are the entry flags the state file keeps.
	flagsPersisted = flagGuarded | flagLocal
)

// entry is the per-uid state. It is a map value (not a pointer) so an object
// with nothing pending costs one map slot: 16-byte key + 24 bytes.
type entry struct {
	consumed int64         // Unix ns of the newest trigger reported or suppressed; noTime if none
	pend     *pendingState // nil when nothing is pending and no commit ran ahead
	flags    uint8
}

// pendingState holds what only objects in flight need.
type pendingState struct {
	triggers []pendingTrigger // sorted by trigger, ascending, no duplicates
	// aheadThrough/aheadAt: a commit programmed trigger aheadThrough at aheadAt
	// before its event reached Observe (client-go updates the lister before it
	// runs event handlers). Triggers in (consumed, aheadThrough] observed later
	// are reported as programmed by that commit. noTime when unset.
	aheadThrough int64
	aheadAt      int64
	// aheadAttempt is that commit (nil once restored: the state file keeps
	// only its time).
	aheadAttempt *report.Attempt
	// failed holds the failed commit attempts since the last success, oldest
	// first, at most maxAttempts (the newest); each pending trigger counts how
	// many of them are its own.
	failed []report.Attempt
	inline [2]pendingTrigger // backing array for the common case
}

// maxAttempts bounds the failed attempts kept per object with their details
// (their count is kept whole, per trigger).
const maxAttempts = 16

type pendingTrigger struct {
	trigger      int64           // Unix ns
	receivedAt   int64           // Unix ns of first receipt
	programmedAt int64           // Unix ns of an earlier commit that already held it; noTime if none
	programmedBy *report.Attempt // that commit, when this process made it
	failures     uint32          // failed commits since it was accepted
	version      *Version        // the version that carried it (ObserveVersion); nil if none recorded
}

// Version is what the caller records, at event time, of the object version that
// carried a trigger: a commit may serve several pending triggers (versions coalesced
// while the object waited), and each is reported with its own version. The set keeps
// it with the pending trigger, under the same bound, until the trigger is reported,
// consumed or dropped; it is not persisted (a restored trigger has none).
type Version struct {
	ResourceVersion string
	TraceParent     string
	// LocalWork: the version changes this node's dataplane. A trigger whose version
	// has none is consumed by the commit that covers it without a report, counted
	// no_local_pods.
	LocalWork bool
	// RemovedOnly: the version's only change here removes pods an earlier version
	// selected.
	RemovedOnly bool
}

func newPendingState() *pendingState {
	p := &pendingState{aheadThrough: noTime, aheadAt: noTime}
	p.triggers = p.inline[:0]
	return p
}

func (p *pendingState) contains(t int64) bool {
	for i := range p.triggers {
		if p.triggers[i].trigger == t {
			return true
		}
	}
	return false
}

// idle reports whether p holds nothing worth keeping given consumed.
func (p *pendingState) idle(consumed int64) bool {
	return len(p.triggers) == 0 && p.aheadThrough <= consumed
}

// Report is one trigger to record: its latency is ProgrammedAt minus Trigger.
type Report struct {
	UID        string
	Trigger    time.Time // the trigger time to report
	ReceivedAt time.Time // local time the event carrying it was first received
	// Attempts are the commit attempts of this trigger, oldest first; the last
	// one is the commit that programmed it. Failed ones come first, at most the
	// newest maxAttempts of them. Reports of one Committed call share the
	// backing array: read, don't modify.
	Attempts []report.Attempt
	// AttemptCount is how many commits were tried for it, the successful one
	// included (failed+1), counting failures whose details were not kept (the
	// bound, or a restart: the state file keeps the count only).
	AttemptCount int
	// Ahead is set when an earlier commit already held this trigger before its
	// event was observed (the lister runs ahead of event handlers): Attempts
	// is then that commit alone, the true end of the trigger's latency, and it
	// may end before ReceivedAt.
	Ahead bool
	// Version is the version ObserveVersion recorded with the trigger, nil when none
	// was (Observe, or a trigger restored from the state file). Read, don't modify.
	Version *Version
}

// ProgrammedAt is when this node's dataplane first held the trigger: its last
// attempt's switch (report.Attempt.ProgrammedAt).
func (r *Report) ProgrammedAt() time.Time {
	if len(r.Attempts) == 0 {
		return time.Time{}
	}
	return r.Attempts[len(r.Attempts)-1].ProgrammedAt()
}

// Stats is a snapshot of the set's size and counters. Counters are cumulative
// for the life of the Set (a restart starts them at zero).
//
// Accounting: Accepted + Restored == Reported + Suppressed[NoLocalPods] +
// Suppressed[Deleted] + Suppressed[Overflow] + Pending, at every snapshot.
// The other reasons count observations that were never accepted.
type Stats struct {
	Objects       int                       // tracked uids
	Pending       int                       // pending triggers over all uids
	Accepted      uint64                    // Observe → Accepted
	Restored      uint64                    // pending triggers restored from the state file
	Reported      uint64                    // triggers returned by Committed
	Suppressed    [report.NumReasons]uint64 // by Reason; the Accepted slot is always 0
	PersistErrors uint64                    // failed state writes
	Persists      uint64                    // successful state writes (each one fsync'd rename)
}

// numShards splits the set so a state write, which encodes one shard at a
// time, blocks Observe only on the shard being encoded, and so handlers and
// workers on different objects rarely contend. A power of two.
const numShards = 32

// Set is the consume-once seen-set. It is safe for concurrent use.
type Set struct {
	cfg   config
	guard int64 // triggers ≤ guard of guarded or unknown uids are before_start; fixed by New
	seed  maphash.Seed

	shards [numShards]shard
	// synced: the informers' initial lists were delivered (MarkSynced);
	// observedThrough: the newest receipt time of a trigger accepted since, Unix
	// ns. Together they move the persisted watermark.
	synced          atomic.Bool
	observedThrough atomic.Int64
	// changeSeq counts state changes, taken inside the changed shard's lock;
	// durableSeq (under writeMu) is the newest one a successful write covered.
	changeSeq     atomic.Uint64
	persists      atomic.Uint64
	persistErrors atomic.Uint64
	// redelivered counts CountRedelivered's re-deliveries, added to
	// Stats.Suppressed[report.Redelivered].
	redelivered atomic.Uint64

	writeMu    sync.Mutex
	durableSeq uint64
	encodeBuf  []byte
}

type shard struct {
	mu           sync.Mutex
	byUUID       map[[16]byte]entry
	byName       map[string]entry
	pendingCount int
	stats        Stats    // counters only; Objects, Pending and the persist counters are filled by Set.Stats
	_            [64]byte // keeps neighbouring shards' locks off one cache line
}

func (s *Set) shardOf(k *key) *shard {
	if k.isUUID {
		// Kubernetes UIDs are random (v4), but fold all 16 bytes so that
		// sequential test uids spread too.
		h := (binary.LittleEndian.Uint64(k.id[:8]) ^ binary.LittleEndian.Uint64(k.id[8:])) * 0x9e3779b97f4a7c15
		return &s.shards[h>>(64-5)] // top 5 bits: numShards = 32
	}
	return s.shardOfName(k.name)
}

func (s *Set) shardOfName(name string) *shard {
	return &s.shards[maphash.String(s.seed, name)>>(64-5)]
}

// New builds a Set whose before_start guard uses start (normally the process
// start), or, when a state file exists and is readable, the restored
// watermark instead (the earlier of the two, in case the clock stepped back).
// The Set is never nil. restoreErr is non-nil when the state file was damaged
// or unreadable: it was ignored (empty state, guard = start) and the caller
// should log it as a warning. A missing state file is not an error. A zero
// start disables the guard.
func New(start time.Time, opts ...Option) (s *Set, restoreErr error) {
	cfg := config{maxPending: 8, now: time.Now, watermarkLag: 5 * time.Second, maxSkew: 5 * time.Second, maxAge: time.Hour}
	for _, o := range opts {
		o(&cfg)
	}
	s = &Set{cfg: cfg, seed: maphash.MakeSeed()}
	for i := range s.shards {
		s.shards[i].byUUID = make(map[[16]byte]entry)
		s.shards[i].byName = make(map[string]entry)
	}
	s.guard = noTime + 1
	if g, ok := unixNano(start); ok {
		s.guard = g
	}
	if cfg.statePath == "" {
		return s, nil
	}
	removeStaleTemps(cfg.statePath)
	st, err := readState(cfg.statePath)
	if err != nil {
		return s, err
	}
	if st == nil {
		return s, nil
	}
	for _, r := range st.entries {
		k := makeKey(r.uid)
		sh, e := s.shardOf(&k), r.entry
		if e.pend != nil {
			n := len(e.pend.triggers)
			for len(e.pend.triggers) > cfg.maxPending { // a smaller bound than the last run's
				mid := len(e.pend.triggers) / 2
				e.pend.triggers = slices.Delete(e.pend.triggers, mid, mid+1)
				sh.stats.Suppressed[report.Overflow]++
			}
			sh.stats.Restored += uint64(n)
			sh.pendingCount += len(e.pend.triggers)
		}
		sh.put(&k, e)
	}
	watermark := st.watermark
	if cfg.maxAge > 0 {
		if oldest, ok := unixNano(start.Add(-cfg.maxAge)); ok {
			watermark = max(watermark, oldest)
		}
	}
	s.guard = min(s.guard, watermark)
	return s, nil
}

// MarkSynced tells the set that the informers' caches hold every object as of
// at (their initial list was delivered). Until then the persisted watermark does
// not move; from then on it follows the new triggers accepted (see doc.go).
func (s *Set) MarkSynced(at time.Time) {
	s.synced.Store(true)
	s.observed(at)
}

// observed moves the time through which events were seen forward to at.
func (s *Set) observed(at time.Time) {
	t, ok := unixNano(at)
	if !ok {
		return
	}
	for {
		cur := s.observedThrough.Load()
		if t <= cur || s.observedThrough.CompareAndSwap(cur, t) {
			return
		}
	}
}

func (sh *shard) get(k *key) (entry, bool) {
	if k.isUUID {
		e, ok := sh.byUUID[k.id]
		return e, ok
	}
	e, ok := sh.byName[k.name]
	return e, ok
}

func (sh *shard) put(k *key, e entry) {
	if k.isUUID {
		sh.byUUID[k.id] = e
	} else {
		sh.byName[k.name] = e
	}
}

// store puts e, or removes the uid when e holds nothing worth keeping.
func (sh *shard) store(k *key, e entry) {
	if e.consumed == noTime && e.pend == nil {
		sh.del(k)
		return
	}
	sh.put(k, e)
}

func (sh *shard) del(k *key) {
	if k.isUUID {
		delete(sh.byUUID, k.id)
	} else {
		delete(sh.byName, k.name)
	}
}

// nanoOrNow converts t, falling back to the configured clock when t does not
// fit (a zero time from a careless caller).
func (s *Set) nanoOrNow(t time.Time) int64 {
	if n, ok := unixNano(t); ok {
		return n
	}
	n, _ := unixNano(s.cfg.now())
	return n
}

// Observe records a trigger seen in an informer event at receivedAt, and
// answers Accepted or the suppression reason (already counted in Stats).
// It does not allocate on the re-delivery path (trigger equals consumed or a
// pending trigger). A zero or out-of-range trigger counts as
// invalid_annotation. When the object already has the maximum of pending
// triggers, one in the middle (possibly this one) is dropped and counted
// overflow; the answer is still Accepted, as the trigger was.
func (s *Set) Observe(uid string, trigger, receivedAt time.Time) report.Reason {
	return s.observe(uid, trigger, receivedAt, nil)
}

// ObserveVersion is Observe that also records, if the trigger is accepted, the
// version that carried it (see Version): the commit that covers the trigger
// reports it with that version, or consumes it without a report when the version
// had no local work. Only an accepted trigger allocates the record.
func (s *Set) ObserveVersion(uid string, trigger, receivedAt time.Time, v Version) report.Reason {
	return s.observe(uid, trigger, receivedAt, &v)
}

func (s *Set) observe(uid string, trigger, receivedAt time.Time, v *Version) report.Reason {
	t, valid := unixNano(trigger)
	k := makeKey(uid)
	sh := s.shardOf(&k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if !valid {
		sh.stats.Suppressed[report.InvalidAnnotation]++
		return report.InvalidAnnotation
	}
	e, found := sh.get(&k)
	if found {
		switch {
		case t == e.consumed:
			sh.stats.Suppressed[report.Redelivered]++
			return report.Redelivered
		case t < e.consumed:
			sh.stats.Suppressed[report.Stale]++
			return report.Stale
		case e.pend != nil && e.pend.contains(t):
			sh.stats.Suppressed[report.Redelivered]++
			return report.Redelivered
		}
	}
	// Only a trigger new to the uid reads the clock: a consumed or pending one
	// was not future when it was taken, and the re-delivery path above stays
	// free of it.
	if s.future(t) {
		sh.stats.Suppressed[report.Future]++
		return report.Future
	}
	if (!found || e.flags&flagGuarded != 0) && t <= s.guard {
		// Consuming it makes the next re-delivery answer redelivered, so
		// before_start counts each old trigger once per process, not once
		// per resync; and persisting it keeps it suppressed after a restart.
		if !found {
			e = entry{consumed: t, flags: flagGuarded}
		}
		e.consumed = max(e.consumed, t)
		if e.pend != nil && e.pend.idle(e.consumed) {
			e.pend = nil
		}
		sh.put(&k, e)
		s.changeSeq.Add(1)
		sh.stats.Suppressed[report.BeforeStart]++
		return report.BeforeStart
	}
	if !found {
		e = entry{consumed: noTime}
	}
	if e.pend == nil {
		e.pend = newPendingState()
	}
	p := e.pend
	pt := pendingTrigger{trigger: t, receivedAt: s.nanoOrNow(receivedAt), programmedAt: noTime}
	if v != nil {
		rec := *v // escapes only here: the re-delivery paths above do not allocate
		pt.version = &rec
	}
	if t <= p.aheadThrough {
		pt.programmedAt, pt.programmedBy = p.aheadAt, p.aheadAttempt
	}
	i, _ := slices.BinarySearchFunc(p.triggers, t, func(q pendingTrigger, t int64) int {
		switch {
		case q.trigger < t:
			return -1
		case q.trigger > t:
			return 1
		}
		return 0
	})
	p.triggers = slices.Insert(p.triggers, i, pt)
	sh.stats.Accepted++
	sh.pendingCount++
	if len(p.triggers) > s.cfg.maxPending {
		// Keep the oldest (the longest latency, the tail the histogram is
		// for) and the newest (the one the next commit reports last).
		mid := len(p.triggers) / 2
		p.triggers = slices.Delete(p.triggers, mid, mid+1)
		sh.stats.Suppressed[report.Overflow]++
		sh.pendingCount--
	}
	e.flags &^= flagGuarded
	sh.put(&k, e)
	s.changeSeq.Add(1)
	if s.synced.Load() {
		// A new trigger came over the watch (a resync or relist only re-delivers
		// known ones): the watermark may follow it.
		s.observed(receivedAt)
	}
	return report.Accepted
}

// future reports whether trigger t (Unix ns) lies more than the allowed skew past
// the clock.
func (s *Set) future(t int64) bool {
	limit, ok := unixNano(s.cfg.now().Add(s.cfg.maxSkew))
	return ok && t > limit
}

// CountRedelivered counts a re-delivery whose answer the caller already knows
// without asking: a trigger Observe answered Accepted, Redelivered or
// BeforeStart for the uid, delivered again with the same object version, and
// the uid not forgotten since. Such a trigger is pending or consumed, and Observe
// would answer Redelivered again and change nothing; this counts it the same,
// without the lookup (a relist re-delivers every object).
func (s *Set) CountRedelivered() {
	s.redelivered.Add(1)
}

// ObserveInvalid counts an event whose annotation could not be parsed
// (invalid_annotation). The uid is not tracked because of it.
func (s *Set) ObserveInvalid(uid string) {
	k := makeKey(uid)
	sh := s.shardOf(&k)
	sh.mu.Lock()
	sh.stats.Suppressed[report.InvalidAnnotation]++
	sh.mu.Unlock()
}

// Committed tells the set that this node's dataplane now holds the object
// version carrying trigger programmed, since attempt a ended. It returns the
// pending triggers ≤ programmed, oldest first, each exactly once ever, with
// their attempts (the failed ones Failed recorded, then a); consumed becomes
// max(consumed, programmed) and the failed attempts are cleared.
//
// One refinement: if programmed itself has not been observed yet (the
// reconciler read the lister, which client-go updates before it runs event
// handlers), it is not consumed but remembered as committed ahead, by a; when
// its event arrives it is accepted and the next Committed reports it as
// programmed by a (Report.Ahead), instead of the event answering redelivered
// and the measurement being lost.
//
// With a state path, and reports to return, the new state is persisted
// atomically (write temp, fsync, rename, fsync dir) BEFORE returning;
// concurrent callers share one write. On a persist error the reports are
// still returned with the error (the caller logs it: at-most-once across a
// restart is then not guaranteed for them), and Stats.PersistErrors counts it.
// A zero programmed time (an object without the annotation) changes nothing.
//
// A pending trigger whose recorded Version (ObserveVersion) has no local work is
// consumed without a report and counted no_local_pods: its own version changed
// nothing on this node, whatever the committed one did.
func (s *Set) Committed(uid string, programmed time.Time, a report.Attempt) ([]Report, error) {
	pt, ok := unixNano(programmed)
	if !ok || s.future(pt) {
		return nil, nil // a future trigger is never observed: nothing to report or remember
	}
	k := makeKey(uid)
	sh := s.shardOf(&k)
	sh.mu.Lock()
	e, found := sh.get(&k)
	if !found {
		e = entry{consumed: noTime, flags: flagGuarded}
	}
	var reports []Report
	if p := e.pend; p != nil {
		n := 0
		for n < len(p.triggers) && p.triggers[n].trigger <= pt {
			n++
		}
		if n > 0 {
			// Every trigger's attempts are a suffix of the same list: the
			// failures since it was accepted, then a.
			attempts := append(p.failed[:len(p.failed):len(p.failed)], a)
			reports = make([]Report, 0, n)
			for _, q := range p.triggers[:n] {
				if q.version != nil && !q.version.LocalWork {
					sh.stats.Suppressed[report.NoLocalPods]++
					continue
				}
				r := Report{
					UID:          uid,
					Trigger:      timeOf(q.trigger),
					ReceivedAt:   timeOf(q.receivedAt),
					AttemptCount: int(q.failures) + 1,
					Version:      q.version,
				}
				if q.programmedAt != noTime {
					r.Ahead = true
					if q.programmedBy != nil {
						r.Attempts = []report.Attempt{*q.programmedBy}
					} else { // restored: only the commit's time is known
						at := timeOf(q.programmedAt)
						r.Attempts = []report.Attempt{{Start: at, End: at}}
					}
				} else {
					kept := min(int(q.failures), len(p.failed))
					r.Attempts = attempts[len(attempts)-1-kept:]
				}
				reports = append(reports, r)
			}
			e.consumed = max(e.consumed, p.triggers[n-1].trigger)
			if len(reports) > 0 {
				e.flags |= flagLocal
			}
			p.triggers = slices.Delete(p.triggers, 0, n)
			sh.pendingCount -= n
			sh.stats.Reported += uint64(len(reports))
		}
		for i := range p.triggers {
			p.triggers[i].failures = 0
		}
		p.failed = nil
	}
	// programmed was not observed: remember the commit (see above), unless the
	// start guard would suppress its event anyway.
	if pt > e.consumed && !(e.flags&flagGuarded != 0 && pt <= s.guard) {
		if e.pend == nil {
			e.pend = newPendingState()
		}
		if pt > e.pend.aheadThrough {
			e.pend.aheadThrough = pt
			e.pend.aheadAt = s.nanoOrNow(a.ProgrammedAt())
			e.pend.aheadAttempt = &a
		}
	}
	if e.pend != nil && e.pend.idle(e.consumed) {
		e.pend = nil
	}
	sh.store(&k, e)
	seq := s.changeSeq.Add(1)
	sh.mu.Unlock()

	if len(reports) == 0 || s.cfg.statePath == "" {
		return reports, nil
	}
	return reports, s.persistThrough(seq, false)
}

// Failed tells the set that commit attempt a for uid failed: nothing is
// consumed, pending triggers are kept, each counts one more attempt, and a is
// kept (the newest maxAttempts) to be reported with them.
func (s *Set) Failed(uid string, a report.Attempt) {
	k := makeKey(uid)
	sh := s.shardOf(&k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, found := sh.get(&k)
	if !found || e.pend == nil || len(e.pend.triggers) == 0 {
		return
	}
	for i := range e.pend.triggers {
		e.pend.triggers[i].failures++
	}
	p := e.pend
	if len(p.failed) == maxAttempts {
		p.failed = slices.Delete(p.failed, 0, 1)
	}
	p.failed = append(p.failed, a)
}

// NoLocalWork tells the set the object (at trigger) has nothing for this
// node. Pending triggers ≤ trigger are consumed without a report, each
// counted as no_local_pods; consumed = max(consumed, trigger). Later events
// carrying those triggers answer redelivered or stale.
func (s *Set) NoLocalWork(uid string, trigger time.Time) {
	t, ok := unixNano(trigger)
	if !ok || s.future(t) {
		return // consuming a future trigger would make later genuine ones stale
	}
	k := makeKey(uid)
	sh := s.shardOf(&k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, found := sh.get(&k)
	if !found {
		e = entry{consumed: noTime, flags: flagGuarded}
	}
	if p := e.pend; p != nil {
		n := 0
		for n < len(p.triggers) && p.triggers[n].trigger <= t {
			n++
		}
		p.triggers = slices.Delete(p.triggers, 0, n)
		sh.pendingCount -= n
		sh.stats.Suppressed[report.NoLocalPods] += uint64(n)
	}
	// A guarded uid's triggers ≤ guard stay the guard's business, so their
	// events count before_start rather than redelivered.
	if !(e.flags&flagGuarded != 0 && t <= s.guard) {
		e.consumed = max(e.consumed, t)
	}
	e.flags &^= flagLocal // the object's current version has nothing here
	if e.pend != nil && e.pend.idle(e.consumed) {
		e.pend = nil
	}
	sh.store(&k, e)
	s.changeSeq.Add(1)
}

// Forget tells the set the object was deleted: its pending triggers are
// dropped (each counted deleted) and its entry removed. Call it only on
// deletion: a uid observed after Forget is a new object to the set.
func (s *Set) Forget(uid string) {
	k := makeKey(uid)
	sh := s.shardOf(&k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, found := sh.get(&k)
	if !found {
		return
	}
	sh.dropPending(e)
	sh.del(&k)
	s.changeSeq.Add(1)
}

func (sh *shard) dropPending(e entry) {
	if e.pend == nil {
		return
	}
	n := len(e.pend.triggers)
	sh.pendingCount -= n
	sh.stats.Suppressed[report.Deleted] += uint64(n)
}

// Prune drops the entries (restored or otherwise) whose uid keep rejects,
// counting their pending triggers deleted, and returns how many it dropped.
// Call it once after the informer caches sync, so objects deleted while the
// agent was down do not keep memory forever. keep runs under a shard's lock:
// it must not call back into the Set.
func (s *Set) Prune(keep func(uid string) bool) int {
	dropped := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for id, e := range sh.byUUID {
			if !keep(formatUUID(id)) {
				sh.dropPending(e)
				delete(sh.byUUID, id)
				dropped++
			}
		}
		for name, e := range sh.byName {
			if !keep(name) {
				sh.dropPending(e)
				delete(sh.byName, name)
				dropped++
			}
		}
		sh.mu.Unlock()
	}
	if dropped > 0 {
		s.changeSeq.Add(1)
	}
	return dropped
}

// Pending reports whether uid has pending triggers, and the newest one.
func (s *Set) Pending(uid string) (newest time.Time, ok bool) {
	k := makeKey(uid)
	sh := s.shardOf(&k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, found := sh.get(&k)
	if !found || e.pend == nil || len(e.pend.triggers) == 0 {
		return time.Time{}, false
	}
	return timeOf(e.pend.triggers[len(e.pend.triggers)-1].trigger), true
}

// Stats returns a snapshot of the set's size and counters.
func (s *Set) Stats() Stats {
	var st Stats
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		st.Objects += len(sh.byUUID) + len(sh.byName)
		st.Pending += sh.pendingCount
		st.Accepted += sh.stats.Accepted
		st.Restored += sh.stats.Restored
		st.Reported += sh.stats.Reported
		for r := range st.Suppressed {
			st.Suppressed[r] += sh.stats.Suppressed[r]
		}
		sh.mu.Unlock()
	}
	st.Suppressed[report.Redelivered] += s.redelivered.Load()
	st.Persists = s.persists.Load()
	st.PersistErrors = s.persistErrors.Load()
	return st
}

// Persist writes the state now, whatever changed (the watermark moves with
// the clock); call it at shutdown. No-op without a state path.
func (s *Set) Persist() error {
	if s.cfg.statePath == "" {
		return nil
	}
	return s.persistThrough(0, true)
}
