package seen

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/npagent/npagent/internal/report"
)

// TestConcurrentHandlersAndWorkers runs informer handlers, workers (one per
// uid at a time, as a workqueue guarantees), a stats reader and a persister
// against one persisted Set. Run it with -race. Every trigger must be
// reported at most once, and the counters must balance at the end.
func TestConcurrentHandlersAndWorkers(t *testing.T) {
	const (
		objects  = 32
		versions = 40
		workers  = 4
	)
	s := newTestSet(t, WithStatePath(statePath(t)), WithMaxPending(64))
	uids := make([]string, objects)
	for i := range uids {
		uids[i] = fmt.Sprintf("%08x-0000-4000-8000-%012x", i, i)
	}
	trigger := func(obj, v int) time.Time { return at(float64(1 + v*objects + obj)) }

	var reportsMu sync.Mutex
	reported := map[string]map[time.Time]int{}
	record := func(rs []Report) {
		reportsMu.Lock()
		defer reportsMu.Unlock()
		for _, r := range rs {
			if reported[r.UID] == nil {
				reported[r.UID] = map[time.Time]int{}
			}
			reported[r.UID][r.Trigger]++
		}
	}

	// Each worker owns uids i ≡ w (mod workers), so one uid is never worked
	// on by two workers at once; handlers deliver to any uid.
	var wg sync.WaitGroup
	progress := make([]int, objects) // newest version delivered, guarded by progressMu
	var progressMu sync.Mutex
	for h := range 2 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(h), 1))
			for range objects * versions {
				obj := rng.IntN(objects)
				progressMu.Lock()
				v := progress[obj]
				if v < versions && rng.IntN(3) > 0 {
					progress[obj]++ // a new version; otherwise a resync of the current one
				}
				progressMu.Unlock()
				s.Observe(uids[obj], trigger(obj, v), time.Now())
			}
		})
	}
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 2))
			for range objects * versions / 2 {
				obj := w + workers*rng.IntN(objects/workers)
				progressMu.Lock()
				v := progress[obj]
				progressMu.Unlock()
				switch rng.IntN(4) {
				case 0:
					s.Failed(uids[obj], failedAttempt)
				default:
					rs, err := s.Committed(uids[obj], trigger(obj, v), attemptAt(time.Now()))
					if err != nil {
						t.Error(err)
						return
					}
					record(rs)
				}
			}
		})
	}
	wg.Go(func() {
		for range 50 {
			checkBalance(t, s)
			if err := s.Persist(); err != nil {
				t.Error(err)
				return
			}
		}
	})
	wg.Wait()

	for obj, uid := range uids {
		rs, err := s.Committed(uid, trigger(obj, versions), attemptAt(time.Now()))
		if err != nil {
			t.Fatal(err)
		}
		record(rs)
	}
	for uid, triggers := range reported {
		for tr, n := range triggers {
			if n != 1 {
				t.Errorf("%s: trigger %s reported %d times", uid, tr, n)
			}
		}
	}
	for _, uid := range uids {
		s.Forget(uid)
	}
	checkBalance(t, s)
	st := s.Stats()
	if st.Reported == 0 || st.Suppressed[report.Redelivered] == 0 {
		t.Fatalf("the run exercised nothing: %+v", st)
	}
	t.Logf("reported %d, redelivered %d, writes %d", st.Reported, st.Suppressed[report.Redelivered], st.Persists)
}
