package seen

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/npagent/npagent/internal/report"
)

// The property test drives a Set the way the agent does — a controller
// writing objects, an informer delivering (in order, with resyncs, relists
// that skip versions, and a lister that runs ahead of handlers), workers
// committing, failing or finding no local pods, deletes, and restarts both
// graceful (Persist) and crashes (the last write only) with changes made
// during the downtime — and checks the invariants of DESIGN.md after every
// step.
//
// Reproduce one failure with: go test -run 'TestPropertyInvariants/seed=17$'

const (
	propertySeeds = 500
	propertyOps   = 300
)

type simObject struct {
	uid      string
	versions []int64 // trigger of each written version, strictly increasing
	listed   int     // newest version in the informer's store (lister); -1 none
	handled  int     // newest version the event handlers observed; -1 none
	// touched is the newest trigger ever passed to the set for this object,
	// in any process; a trigger newer than it and than the guard, delivered
	// in order, must be accepted.
	touched int64
}

type simulation struct {
	t    *testing.T
	rng  *rand.Rand
	path string // "" for runs without persistence
	opts []Option

	clock   int64 // Unix ns
	set     *Set
	live    map[string]*simObject
	nextID  int
	up      bool
	process int

	reported     map[string]map[int64]bool // uid → triggers reported, over all processes
	lastReported map[string]int64

	// unresolved models the accepted triggers not yet reported or consumed,
	// and durable what the last state write held of it (a crash goes back
	// to it). Without persistence a restart empties it.
	unresolved map[string]map[int64]bool
	durable    map[string]map[int64]bool
	dropped    uint64 // unresolved triggers a commit did not report: overflow
	overflowed uint64 // overflow counted by ended processes
	cov        *coverage
}

// coverage counts what the generator exercised, over all seeds.
type coverage struct {
	reports, programmedAhead, restarts, crashes uint64
	byReason                                    [report.NumReasons]uint64
	restored                                    uint64
}

func cloneTriggers(m map[string]map[int64]bool) map[string]map[int64]bool {
	out := make(map[string]map[int64]bool, len(m))
	for uid, ts := range m {
		if len(ts) > 0 {
			out[uid] = maps.Clone(ts)
		}
	}
	return out
}

func (sim *simulation) addUnresolved(uid string, tr int64) {
	if sim.unresolved[uid] == nil {
		sim.unresolved[uid] = map[int64]bool{}
	}
	sim.unresolved[uid][tr] = true
}

// stateWritten records that the set just wrote its state.
func (sim *simulation) stateWritten() {
	if sim.path != "" {
		sim.durable = cloneTriggers(sim.unresolved)
	}
}

func (sim *simulation) now() time.Time { return time.Unix(0, sim.clock).UTC() }

func (sim *simulation) tick() {
	sim.clock += int64(time.Millisecond) + sim.rng.Int64N(int64(8*time.Second))
}

func (sim *simulation) fatalf(format string, args ...any) {
	sim.t.Helper()
	sim.t.Fatalf("process %d: "+format, append([]any{sim.process}, args...)...)
}

func (sim *simulation) newUID() string {
	sim.nextID++
	if sim.rng.IntN(5) == 0 {
		return fmt.Sprintf("object-%d", sim.nextID) // a non-UUID uid takes the string-keyed path
	}
	var b [16]byte
	for i := range b {
		b[i] = byte(sim.rng.UintN(256))
	}
	return formatUUID(b)
}

// write is the controller stamping a new trigger on an object.
func (sim *simulation) write(o *simObject) {
	sim.tick()
	o.versions = append(o.versions, sim.clock)
	if sim.up && sim.rng.IntN(2) == 0 {
		o.listed = len(o.versions) - 1 // the informer's store has it; handlers may lag
	}
}

func (sim *simulation) create() {
	o := &simObject{uid: sim.newUID(), listed: -1, handled: -1}
	sim.live[o.uid] = o
	sim.write(o)
}

func (sim *simulation) randomObject() *simObject {
	if len(sim.live) == 0 {
		return nil
	}
	uids := make([]string, 0, len(sim.live))
	for uid := range sim.live {
		uids = append(uids, uid)
	}
	slices.Sort(uids) // map order is random; the seed must decide
	return sim.live[uids[sim.rng.IntN(len(uids))]]
}

func (sim *simulation) observe(o *simObject, v int, inOrder bool) {
	trigger := o.versions[v]
	sim.tick()
	got := sim.set.Observe(o.uid, time.Unix(0, trigger), sim.now())
	sim.cov.byReason[got]++
	if inOrder && trigger > o.touched && trigger > sim.set.guard && got != report.Accepted {
		sim.fatalf("%s: new trigger %d (newest touched %d, guard %d) answered %s, want accepted",
			o.uid, trigger, o.touched, sim.set.guard, got)
	}
	// A trigger still owed a report is pending (redelivered) or, if
	// overflow dropped it, accepted again: never stale or before_start.
	if sim.unresolved[o.uid][trigger] && got != report.Redelivered && got != report.Accepted {
		sim.fatalf("%s: unresolved trigger %d answered %s", o.uid, trigger, got)
	}
	if got == report.Accepted {
		sim.addUnresolved(o.uid, trigger)
	}
	o.touched = max(o.touched, trigger)
}

// deliver runs the event handler for the next version in order.
func (sim *simulation) deliver(o *simObject) {
	if o.handled == len(o.versions)-1 {
		return
	}
	o.handled++
	o.listed = max(o.listed, o.handled)
	sim.observe(o, o.handled, true)
}

// checkReports checks the reports of Committed(o, programmed).
func (sim *simulation) checkReports(o *simObject, programmed int64, reports []Report) {
	for _, r := range reports {
		if !sim.unresolved[o.uid][r.Trigger.UnixNano()] {
			sim.fatalf("%s: reported %d, which is not owed a report", o.uid, r.Trigger.UnixNano())
		}
		delete(sim.unresolved[o.uid], r.Trigger.UnixNano())
		sim.cov.reports++
		if r.Ahead {
			sim.cov.programmedAhead++
		}
	}
	for tr := range sim.unresolved[o.uid] {
		if tr <= programmed {
			delete(sim.unresolved[o.uid], tr)
			sim.dropped++
		}
	}
	if len(reports) > 0 {
		sim.stateWritten()
	}
	prev := sim.lastReported[o.uid]
	for _, r := range reports {
		tr := r.Trigger.UnixNano()
		if r.UID != o.uid {
			sim.fatalf("report for %s carries uid %s", o.uid, r.UID)
		}
		if sim.reported[o.uid][tr] {
			sim.fatalf("%s: trigger %d reported twice", o.uid, tr)
		}
		if tr <= prev {
			sim.fatalf("%s: reported %d after %d: reported triggers must strictly increase", o.uid, tr, prev)
		}
		if !slices.Contains(o.versions, tr) {
			sim.fatalf("%s: reported %d, which was never written", o.uid, tr)
		}
		if r.AttemptCount < 1 || len(r.Attempts) < 1 {
			sim.fatalf("%s: attempts %d", o.uid, r.AttemptCount)
		}
		if sim.reported[o.uid] == nil {
			sim.reported[o.uid] = map[int64]bool{}
		}
		sim.reported[o.uid][tr] = true
		prev = tr
	}
	sim.lastReported[o.uid] = prev
}

// work is one worker pass over o: it reads the lister's version.
func (sim *simulation) work(o *simObject) {
	if o.listed < 0 {
		return
	}
	trigger := o.versions[o.listed]
	sim.tick()
	switch n := sim.rng.IntN(10); {
	case n < 6:
		reports, err := sim.set.Committed(o.uid, time.Unix(0, trigger), attemptAt(sim.now()))
		if err != nil {
			sim.fatalf("Committed: %v", err)
		}
		o.touched = max(o.touched, trigger)
		sim.checkReports(o, trigger, reports)
	case n < 8:
		sim.set.Failed(o.uid, failedAttempt)
	default:
		sim.set.NoLocalWork(o.uid, time.Unix(0, trigger))
		o.touched = max(o.touched, trigger)
		for tr := range sim.unresolved[o.uid] {
			if tr <= trigger {
				delete(sim.unresolved[o.uid], tr)
			}
		}
	}
}

func (sim *simulation) checkStats() {
	sim.t.Helper()
	st := sim.set.Stats()
	ends := st.Reported + st.Suppressed[report.NoLocalPods] + st.Suppressed[report.Deleted] + st.Suppressed[report.Overflow] + uint64(st.Pending)
	if st.Accepted+st.Restored != ends {
		sim.fatalf("accounting: accepted %d + restored %d != reported %d + no_local_pods %d + deleted %d + overflow %d + pending %d",
			st.Accepted, st.Restored, st.Reported, st.Suppressed[report.NoLocalPods], st.Suppressed[report.Deleted], st.Suppressed[report.Overflow], st.Pending)
	}
	if sim.dropped > sim.overflowed+st.Suppressed[report.Overflow] {
		sim.fatalf("%d owed triggers went unreported, only %d overflowed", sim.dropped, sim.overflowed+st.Suppressed[report.Overflow])
	}
	if st.Objects > len(sim.live) {
		sim.fatalf("%d tracked objects for %d live ones", st.Objects, len(sim.live))
	}
}

// start runs a new process: restore, initial list, prune after cache sync.
func (sim *simulation) start() {
	sim.tick()
	sim.process++
	s, err := New(sim.now(), append([]Option{WithStatePath(sim.path), WithNow(sim.now)}, sim.opts...)...)
	if err != nil {
		sim.fatalf("restore: %v", err)
	}
	sim.set, sim.up = s, true
	sim.cov.restored += s.Stats().Restored
	for uid := range sim.unresolved {
		if sim.live[uid] == nil {
			delete(sim.unresolved, uid)
		}
	}
	for _, o := range sim.sortedLive() {
		o.listed, o.handled = len(o.versions)-1, len(o.versions)-1
		sim.observe(o, o.handled, true)
	}
	sim.set.Prune(func(uid string) bool { return sim.live[uid] != nil })
}

func (sim *simulation) sortedLive() []*simObject {
	objs := make([]*simObject, 0, len(sim.live))
	for _, o := range sim.live {
		objs = append(objs, o)
	}
	slices.SortFunc(objs, func(a, b *simObject) int { return strings.Compare(a.uid, b.uid) })
	return objs
}

// stop ends the process gracefully (Persist) or by a crash, then lets the
// cluster change while the agent is down.
func (sim *simulation) stop(graceful bool) {
	sim.checkStats()
	sim.cov.restarts++
	if graceful {
		sim.tick()
		if err := sim.set.Persist(); err != nil {
			sim.fatalf("Persist: %v", err)
		}
		sim.stateWritten()
	} else {
		sim.cov.crashes++
	}
	sim.overflowed += sim.set.Stats().Suppressed[report.Overflow]
	sim.unresolved = cloneTriggers(sim.durable) // what the next process restores
	if sim.path == "" {
		sim.unresolved = map[string]map[int64]bool{}
	}
	sim.up = false
	for range sim.rng.IntN(6) {
		switch o := sim.randomObject(); {
		case o == nil || sim.rng.IntN(3) == 0:
			sim.create()
		case sim.rng.IntN(4) == 0:
			delete(sim.live, o.uid)
		default:
			sim.write(o)
		}
	}
}

func (sim *simulation) step() {
	o := sim.randomObject()
	switch n := sim.rng.IntN(100); {
	case n < 8 || o == nil:
		sim.create()
	case n < 25:
		sim.write(o)
	case n < 50:
		sim.deliver(o)
	case n < 58: // resync: OnUpdate with the version the handlers have
		if o.handled >= 0 {
			sim.observe(o, o.handled, false)
		}
	case n < 60: // relist after 410 Gone: jump to the newest version
		for _, o := range sim.sortedLive() {
			last := len(o.versions) - 1
			inOrder := o.handled < last
			o.listed, o.handled = last, last
			sim.observe(o, last, inOrder)
		}
	case n < 62: // an old version replayed (misbehaving source): never reported again
		sim.observe(o, sim.rng.IntN(len(o.versions)), false)
	case n < 85:
		sim.work(o)
	case n < 89: // delete event
		delete(sim.live, o.uid)
		delete(sim.unresolved, o.uid)
		sim.set.Forget(o.uid)
	case n < 91:
		if err := sim.set.Persist(); err != nil {
			sim.fatalf("Persist: %v", err)
		}
		sim.stateWritten()
	case n < 94:
		sim.stop(true)
		sim.start()
	case n < 96:
		sim.stop(false)
		sim.start()
	default:
		sim.tick()
		_, _ = sim.set.Pending(o.uid)
	}
	sim.checkStats()
}

// propertyDir holds the state files: tmpfs when the machine has one, so
// tens of thousands of fsync'd writes do not make the test take minutes.
func propertyDir(t *testing.T) string {
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		if dir, err := os.MkdirTemp("/dev/shm", "seen-property-"); err == nil {
			t.Cleanup(func() { os.RemoveAll(dir) })
			return dir
		}
	}
	return t.TempDir()
}

func TestPropertyInvariants(t *testing.T) {
	seeds := propertySeeds
	if testing.Short() {
		seeds = 50
	}
	dir := propertyDir(t)
	cov := &coverage{}
	defer func() {
		if t.Failed() {
			return
		}
		t.Logf("coverage over %d seeds: %+v", seeds, *cov)
		// The generator must reach every path, or the invariants prove little.
		for r := report.Accepted; r <= report.BeforeStart; r++ {
			if cov.byReason[r] == 0 {
				t.Errorf("no observation answered %s", r)
			}
		}
		if cov.reports == 0 || cov.programmedAhead == 0 || cov.crashes == 0 || cov.restored == 0 {
			t.Errorf("generator missed a path: %+v", *cov)
		}
	}()
	for seed := range uint64(seeds) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 0x5ee75ee7))
			sim := &simulation{
				t:            t,
				rng:          rng,
				clock:        base.UnixNano(),
				live:         map[string]*simObject{},
				reported:     map[string]map[int64]bool{},
				lastReported: map[string]int64{},
				unresolved:   map[string]map[int64]bool{},
				durable:      map[string]map[int64]bool{},
				cov:          cov,
			}
			if seed%2 == 0 { // odd seeds run without persistence
				sim.path = filepath.Join(dir, fmt.Sprintf("seed-%d.state", seed))
			}
			sim.opts = []Option{
				WithMaxPending(2 + rng.IntN(8)),
				WithWatermarkLag(time.Duration(rng.IntN(3)) * 5 * time.Second),
			}
			for range 3 + rng.IntN(5) { // objects that predate the first process
				sim.create()
			}
			sim.start()
			for range propertyOps {
				sim.step()
			}
			// Deliver and commit everything: nothing accepted may be lost.
			for _, o := range sim.sortedLive() {
				for o.handled < len(o.versions)-1 {
					sim.deliver(o)
				}
				o.listed = len(o.versions) - 1
				newest := o.versions[o.listed]
				reports, err := sim.set.Committed(o.uid, time.Unix(0, newest), attemptAt(sim.now()))
				if err != nil {
					t.Fatal(err)
				}
				sim.checkReports(o, newest, reports)
				if _, ok := sim.set.Pending(o.uid); ok {
					sim.fatalf("%s still pending after committing its newest version", o.uid)
				}
			}
			for uid, ts := range sim.unresolved {
				if len(ts) > 0 {
					sim.fatalf("%s: triggers %v accepted and never reported", uid, slices.Sorted(maps.Keys(ts)))
				}
			}
			for _, o := range sim.sortedLive() {
				sim.set.Forget(o.uid)
			}
			sim.live = map[string]*simObject{}
			sim.checkStats()
			if st := sim.set.Stats(); st.Pending != 0 || st.Objects != 0 {
				t.Fatalf("after forgetting everything: pending %d objects %d", st.Pending, st.Objects)
			}
		})
		if t.Failed() {
			return
		}
	}
}
