package seen

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/npagent/npagent/internal/report"
)

// clock is a settable time source for WithNow.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) set(t time.Time) { c.mu.Lock(); c.t = t; c.mu.Unlock() }

func statePath(t *testing.T) string { return filepath.Join(t.TempDir(), "seen.state") }

func restart(t *testing.T, start time.Time, path string, opts ...Option) *Set {
	t.Helper()
	// These tests' clocks stand still between the events they replay, so a
	// trigger may lie past them: the future check (TestFutureTriggerNotConsumed)
	// is not what they are about.
	s, err := New(start, append([]Option{WithStatePath(path), WithMaxSkew(time.Hour)}, opts...)...)
	if err != nil {
		t.Fatalf("restore from %s: %v", path, err)
	}
	return s
}

// TestRestartMeasuresDowntimeChanges: with a state file, a change written
// while the agent was down (older than the new process start) and an object
// created while it was down are each reported once; without the file both
// are before_start.
func TestRestartMeasuresDowntimeChanges(t *testing.T) {
	const uidC = "c0ffee00-0000-4000-8000-000000000001" // created during the downtime
	path := statePath(t)
	clk := &clock{t: at(0)}
	s1 := restart(t, at(0), path, WithNow(clk.now))
	mustObserve(t, s1, uidA, at(10), at(10.1), report.Accepted)
	mustCommit(t, s1, uidA, at(10), at(10.2))
	clk.set(at(100)) // shutdown
	if err := s1.Persist(); err != nil {
		t.Fatal(err)
	}

	// Downtime: uidA changed at 150, uidC created at 160; agent back at 200.
	s2 := restart(t, at(200), path, WithNow(clk.now))
	mustObserve(t, s2, uidA, at(150), at(201), report.Accepted)
	mustObserve(t, s2, uidC, at(160), at(201), report.Accepted)
	for _, c := range []struct {
		uid     string
		trigger time.Time
	}{{uidA, at(150)}, {uidC, at(160)}} {
		got := mustCommit(t, s2, c.uid, c.trigger, at(202))
		if len(got) != 1 || !got[0].Trigger.Equal(c.trigger) {
			t.Fatalf("%s: reported %v, want [%s]", c.uid, triggersOf(got), c.trigger)
		}
		mustObserve(t, s2, c.uid, c.trigger, at(230), report.Redelivered)
		if again := mustCommit(t, s2, c.uid, c.trigger, at(231)); len(again) != 0 {
			t.Fatalf("%s: reported again %v", c.uid, triggersOf(again))
		}
	}

	noState, err := New(at(200))
	if err != nil {
		t.Fatal(err)
	}
	mustObserve(t, noState, uidA, at(150), at(201), report.BeforeStart)
	mustObserve(t, noState, uidC, at(160), at(201), report.BeforeStart)
}

// TestPendingAtShutdownReportedAfterRestart: a trigger accepted but never
// committed before shutdown is reported after the restart, with its original
// receipt time and attempts — also when a newer version written during the
// downtime means the initial list never delivers it again.
func TestPendingAtShutdownReportedAfterRestart(t *testing.T) {
	path := statePath(t)
	clk := &clock{t: at(0)}
	s1 := restart(t, at(0), path, WithNow(clk.now))
	mustObserve(t, s1, uidA, at(10), at(10), report.Accepted)
	mustCommit(t, s1, uidA, at(10), at(11))
	mustObserve(t, s1, uidA, at(50), at(50.5), report.Accepted) // commit still failing at shutdown
	s1.Failed(uidA, failedAttempt)
	mustObserve(t, s1, uidB, at(60), at(60.5), report.Accepted) // never committed at all
	clk.set(at(100))
	if err := s1.Persist(); err != nil {
		t.Fatal(err)
	}

	s2 := restart(t, at(200), path, WithNow(clk.now))
	if st := s2.Stats(); st.Restored != 2 || st.Pending != 2 {
		t.Fatalf("restored %d pending %d, want 2 and 2", st.Restored, st.Pending)
	}
	// uidA is listed unchanged; uidB was changed again at 150 during the downtime.
	mustObserve(t, s2, uidA, at(50), at(201), report.Redelivered)
	mustObserve(t, s2, uidB, at(150), at(201), report.Accepted)

	got := mustCommit(t, s2, uidA, at(50), at(202))
	if len(got) != 1 || !got[0].Trigger.Equal(at(50)) || !got[0].ReceivedAt.Equal(at(50.5)) || got[0].AttemptCount != 2 {
		t.Fatalf("uidA reported %+v, want trigger %s received %s attempts 2", got, at(50), at(50.5))
	}
	got = mustCommit(t, s2, uidB, at(150), at(202))
	if want := []time.Time{at(60), at(150)}; !slices.EqualFunc(triggersOf(got), want, time.Time.Equal) {
		t.Fatalf("uidB reported %v, want %v", triggersOf(got), want)
	}
	checkBalance(t, s2)
}

// TestCrashAfterCommitDoesNotReportAgain: Committed makes the state durable
// before it returns reports, so even without a final Persist the next process
// answers redelivered.
func TestCrashAfterCommitDoesNotReportAgain(t *testing.T) {
	path := statePath(t)
	s1 := restart(t, at(0), path)
	mustObserve(t, s1, uidA, at(10), at(10), report.Accepted)
	mustObserve(t, s1, uidB, at(11), at(11), report.Accepted)
	mustCommit(t, s1, uidA, at(10), at(12))
	mustCommit(t, s1, uidB, at(11), at(13))
	// crash: s1 is abandoned without Persist

	s2 := restart(t, at(20), path)
	mustObserve(t, s2, uidA, at(10), at(21), report.Redelivered)
	mustObserve(t, s2, uidB, at(11), at(21), report.Redelivered)
}

// TestRestartKeepsOldObjectsBeforeStart: objects that predate the first
// process stay unmeasured across any number of restarts. Nothing of them is
// persisted (they had no work here), so their re-listing counts before_start
// again, not redelivered.
func TestRestartKeepsOldObjectsBeforeStart(t *testing.T) {
	path := statePath(t)
	clk := &clock{t: at(0)}
	s1 := restart(t, at(0), path, WithNow(clk.now))
	mustObserve(t, s1, uidA, at(-50), at(1), report.BeforeStart)
	clk.set(at(100))
	if err := s1.Persist(); err != nil {
		t.Fatal(err)
	}
	s2 := restart(t, at(200), path, WithNow(clk.now))
	mustObserve(t, s2, uidA, at(-50), at(201), report.BeforeStart)
	mustObserve(t, s2, uidA, at(-50), at(202), report.Redelivered)
	// An older version arriving late is still before the original start.
	mustObserve(t, s2, "old-object", at(-40), at(201), report.BeforeStart)
}

// TestStateHoldsOnlyLocalWork: with 10,000 objects that never had work on this
// node — listed before the start, or written since and consumed as no_local_pods
// before the watermark — and three that did, the state file holds the three and
// the object still pending, nothing else; after a restart no trigger is reported
// again, the three answer redelivered, the others before_start, and the pending
// one is reported.
func TestStateHoldsOnlyLocalWork(t *testing.T) {
	path := statePath(t)
	clk := &clock{t: at(0)}
	s1 := restart(t, at(0), path, WithNow(clk.now), WithWatermarkLag(time.Second))
	uids := benchUIDs(10000)
	for i, uid := range uids {
		if i%2 == 0 { // listed at the start
			mustObserve(t, s1, uid, at(-50), at(1), report.BeforeStart)
			continue
		}
		mustObserve(t, s1, uid, at(2), at(2), report.Accepted) // written since, elsewhere
		s1.NoLocalWork(uid, at(2))
	}
	s1.MarkSynced(at(3))
	local := []string{uidA, uidB, "local-not-a-uuid"}
	for _, uid := range local {
		mustObserve(t, s1, uid, at(10), at(10), report.Accepted)
		mustCommit(t, s1, uid, at(10), at(11))
	}
	pending := "pending-not-a-uuid"
	mustObserve(t, s1, pending, at(20), at(20), report.Accepted)
	clk.set(at(30))
	if err := s1.Persist(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := decodeState(data)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range st.entries {
		got = append(got, r.uid)
	}
	slices.Sort(got)
	want := slices.Sorted(slices.Values(append(slices.Clone(local), pending)))
	if !slices.Equal(got, want) {
		t.Fatalf("state file holds %d uids (%d bytes), want %d: %q…", len(got), len(data), len(want), got[:min(len(got), 6)])
	}

	s2 := restart(t, at(40), path, WithNow(clk.now))
	for _, uid := range local {
		mustObserve(t, s2, uid, at(10), at(41), report.Redelivered)
	}
	for i, uid := range uids[:10] {
		trigger := at(2)
		if i%2 == 0 {
			trigger = at(-50)
		}
		mustObserve(t, s2, uid, trigger, at(41), report.BeforeStart)
	}
	mustCommit(t, s2, pending, at(20), at(42))
	if st := s2.Stats(); st.Reported != 1 {
		t.Fatalf("reported %d after the restart, want 1 (the pending trigger)", st.Reported)
	}
}

func TestNonUUIDUIDsSurviveRestart(t *testing.T) {
	path := statePath(t)
	s1 := restart(t, at(0), path)
	for _, uid := range []string{"plain-name", "6F1C2A9E-3B7D-4C1E-9A2F-0D4B5E6F7A81", ""} {
		mustObserve(t, s1, uid, at(10), at(10), report.Accepted)
		mustCommit(t, s1, uid, at(10), at(11))
	}
	s2 := restart(t, at(20), path)
	for _, uid := range []string{"plain-name", "6F1C2A9E-3B7D-4C1E-9A2F-0D4B5E6F7A81", ""} {
		mustObserve(t, s2, uid, at(10), at(21), report.Redelivered)
	}
	if got := s2.Stats().Objects; got != 3 {
		t.Fatalf("objects = %d, want 3", got)
	}
}

func TestDamagedStateIsReportedAndIgnored(t *testing.T) {
	good := func(t *testing.T) []byte {
		path := statePath(t)
		s := restart(t, at(0), path)
		for i, uid := range []string{uidA, uidB, "plain"} {
			mustObserve(t, s, uid, at(10+float64(i)), at(10), report.Accepted)
			mustCommit(t, s, uid, at(10+float64(i)), at(11))
		}
		if err := s.Persist(); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}(t)

	cases := map[string]func(path string) error{
		"empty":     func(p string) error { return os.WriteFile(p, nil, 0o600) },
		"truncated": func(p string) error { return os.WriteFile(p, good[:len(good)/2], 0o600) },
		"garbage": func(p string) error {
			return os.WriteFile(p, []byte("{\"not\": \"a state file\"}\n\x00\x01\x02 padding padding"), 0o600)
		},
		"trailing":   func(p string) error { return os.WriteFile(p, append(append([]byte{}, good...), 0), 0o600) },
		"unreadable": func(p string) error { return os.Mkdir(p, 0o700) }, // read fails with EISDIR, also as root
		"future version": func(p string) error { // a valid checksum over an unknown version
			b := append([]byte{}, good[:len(good)-4]...)
			b[6] = 9
			return os.WriteFile(p, binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli)), 0o600)
		},
		"wrong checksum": func(p string) error {
			b := append([]byte{}, good...)
			b[len(b)-10] ^= 0x40 // inside the last entry
			return os.WriteFile(p, b, 0o600)
		},
	}
	for name, damage := range cases {
		t.Run(name, func(t *testing.T) {
			path := statePath(t)
			if err := damage(path); err != nil {
				t.Fatal(err)
			}
			s, err := New(at(100), WithStatePath(path))
			if err == nil {
				t.Fatal("New returned no restore error for a damaged state file")
			}
			if s == nil {
				t.Fatal("New returned a nil Set")
			}
			t.Logf("restore error: %v", err)
			if got := s.Stats().Objects; got != 0 {
				t.Fatalf("objects = %d after a damaged restore, want 0", got)
			}
			// The guard is the process start: uidA's old trigger is before_start.
			mustObserve(t, s, uidA, at(10), at(101), report.BeforeStart)
		})
	}
	t.Run("good copy restores", func(t *testing.T) {
		path := statePath(t)
		if err := os.WriteFile(path, good, 0o600); err != nil {
			t.Fatal(err)
		}
		s := restart(t, at(100), path)
		mustObserve(t, s, uidA, at(10), at(101), report.Redelivered)
	})
}

func TestDamagedStateIsReplacedByNextWrite(t *testing.T) {
	path := statePath(t)
	if err := os.WriteFile(path, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := New(at(0), WithStatePath(path))
	if err == nil {
		t.Fatal("want a restore error")
	}
	mustObserve(t, s, uidA, at(10), at(10), report.Accepted)
	mustCommit(t, s, uidA, at(10), at(11))
	s2 := restart(t, at(20), path)
	mustObserve(t, s2, uidA, at(10), at(21), report.Redelivered)
}

func TestMissingStateFileIsAFirstStart(t *testing.T) {
	s, err := New(at(0), WithStatePath(statePath(t)))
	if err != nil {
		t.Fatalf("missing state file: %v", err)
	}
	mustObserve(t, s, uidA, at(-1), at(1), report.BeforeStart)
}

// TestPersistErrorStillReturnsReports: a failed write must not swallow the
// measurement; the caller gets both and the failure is counted.
func TestPersistErrorStillReturnsReports(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing-dir", "seen.state")
	s := restart(t, at(0), path)
	mustObserve(t, s, uidA, at(10), at(10), report.Accepted)
	reports, err := s.Committed(uidA, at(10), attemptAt(at(11)))
	if len(reports) != 1 {
		t.Fatalf("reported %v, want one despite the write error", triggersOf(reports))
	}
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Committed error = %v, want a not-exist write error", err)
	}
	if st := s.Stats(); st.PersistErrors != 1 || st.Persists != 0 {
		t.Fatalf("persist errors %d persists %d, want 1 and 0", st.PersistErrors, st.Persists)
	}
	if err := s.Persist(); err == nil {
		t.Fatal("Persist into a missing directory succeeded")
	}
}

// TestConcurrentCommitsShareOneWrite: commits that queue behind an ongoing
// write are all covered by the next one.
func TestConcurrentCommitsShareOneWrite(t *testing.T) {
	path := statePath(t)
	s := restart(t, at(0), path)
	const n = 20
	uids := make([]string, n)
	for i := range uids {
		uids[i] = "object-" + string(rune('a'+i))
		mustObserve(t, s, uids[i], at(10), at(10), report.Accepted)
	}
	s.writeMu.Lock() // a write is in progress
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for _, uid := range uids {
		wg.Go(func() {
			reports, err := s.Committed(uid, at(10), attemptAt(at(11)))
			if err == nil && len(reports) != 1 {
				err = errors.New(uid + ": want one report")
			}
			errs <- err
		})
	}
	for s.Stats().Reported != n { // every commit has updated state and waits for durability
		time.Sleep(time.Millisecond)
	}
	s.writeMu.Unlock()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := s.Stats().Persists; got != 1 {
		t.Fatalf("%d concurrent commits cost %d writes, want 1", n, got)
	}
	s2 := restart(t, at(20), path)
	for _, uid := range uids {
		mustObserve(t, s2, uid, at(10), at(21), report.Redelivered)
	}
}

func TestRestoredWatermarkLaterThanStartIsCapped(t *testing.T) {
	// The clock stepped back between runs: the guard must not hide triggers
	// newer than the new process start.
	path := statePath(t)
	clk := &clock{t: at(1000)}
	s1 := restart(t, at(900), path, WithNow(clk.now))
	if err := s1.Persist(); err != nil {
		t.Fatal(err)
	}
	s2 := restart(t, at(100), path)
	mustObserve(t, s2, uidA, at(150), at(151), report.Accepted)
}

// TestWatermarkFollowsObservedEvents: the persisted watermark moves only once
// the caches synced, and then only with new triggers accepted, never with the
// wall clock alone nor with re-deliveries. So an object created while the watch delivered nothing (an
// outage), first seen after a restart, is measured; before, the watermark had
// followed the clock past its trigger and it was before_start.
func TestWatermarkFollowsObservedEvents(t *testing.T) {
	const uidC = "c0ffee00-0000-4000-8000-000000000002" // created during the outage
	path := statePath(t)
	clk := &clock{t: at(0)}
	s1 := restart(t, at(0), path, WithNow(clk.now), WithWatermarkLag(5*time.Second))
	clk.set(at(20))
	if err := s1.Persist(); err != nil { // before the caches synced: no move
		t.Fatal(err)
	}
	if s := restart(t, at(30), path); s.guard != at(0).UnixNano() {
		t.Fatalf("guard %v after a persist before sync, want the start %v", timeOf(s.guard), at(0))
	}
	s1.MarkSynced(at(20))
	mustObserve(t, s1, uidA, at(25), at(30), report.Accepted) // the last write before the outage
	clk.set(at(100))                                          // the watch delivers nothing from here
	// A resync re-delivers from the informer's cache, not the watch: it does not
	// move the watermark.
	mustObserve(t, s1, uidA, at(25), at(90), report.Redelivered)
	if err := s1.Persist(); err != nil {
		t.Fatal(err)
	}
	s2 := restart(t, at(200), path, WithNow(clk.now))
	if want := at(30).Add(-5 * time.Second).UnixNano(); s2.guard != want {
		t.Errorf("guard %v, want the last observed event minus the lag (%v)", timeOf(s2.guard), timeOf(want))
	}
	mustObserve(t, s2, uidC, at(60), at(201), report.Accepted)
}

// TestWatermarkAgeBounded: a restored watermark far older than the start does
// not turn every object the last process never saw into a downtime-long latency:
// only changes within the bound before the start are measured.
func TestWatermarkAgeBounded(t *testing.T) {
	path := statePath(t)
	clk := &clock{t: at(0)}
	s1 := restart(t, at(0), path, WithNow(clk.now))
	s1.MarkSynced(at(0))
	if err := s1.Persist(); err != nil {
		t.Fatal(err)
	}
	start := at(0).Add(3 * time.Hour)
	clk.set(start)
	s2 := restart(t, start, path, WithNow(clk.now), WithMaxWatermarkAge(time.Hour))
	mustObserve(t, s2, uidA, start.Add(-2*time.Hour), start, report.BeforeStart)
	mustObserve(t, s2, uidB, start.Add(-30*time.Minute), start, report.Accepted)
}

// TestNewRemovesStaleTemporaries: New removes the temporaries a process stopped
// mid-write left beside the state file, an older build's fixed path+".tmp"
// included.
func TestNewRemovesStaleTemporaries(t *testing.T) {
	path := statePath(t)
	dir := filepath.Dir(path)
	for _, stale := range []string{path + ".tmp", filepath.Join(dir, ".seen.state.tmp-5eed")} {
		if err := os.WriteFile(stale, []byte("half a write"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	restart(t, at(0), path)
	for _, stale := range []string{path + ".tmp", filepath.Join(dir, ".seen.state.tmp-5eed")} {
		if _, err := os.Lstat(stale); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("stale temporary %s still there after New: %v", filepath.Base(stale), err)
		}
	}
}

// TestPersistNeverFollowsSymlinks: a symlink planted where an older build wrote
// its temporary (path+".tmp", a fixed name) is never written through: its target
// keeps its content and the state file stays a regular file the next process
// restores.
func TestPersistNeverFollowsSymlinks(t *testing.T) {
	path := statePath(t)
	dir := filepath.Dir(path)
	s := restart(t, at(0), path)
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, path+".tmp"); err != nil {
		t.Fatal(err)
	}
	mustObserve(t, s, uidA, at(10), at(10.1), report.Accepted)
	mustCommit(t, s, uidA, at(10), at(10.2))
	if err := s.Persist(); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(victim); err != nil || string(b) != "precious" {
		t.Errorf("the planted symlink's target was written: %q, %v", b, err)
	}
	if fi, err := os.Lstat(path); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("state file is not a regular file: %v", err)
	}
	s2 := restart(t, at(20), path)
	mustObserve(t, s2, uidA, at(10), at(21), report.Redelivered)
}
