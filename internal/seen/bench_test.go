package seen

import (
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/npagent/npagent/internal/report"
)

// benchUIDs returns n distinct canonical UUID strings.
func benchUIDs(n int) []string {
	uids := make([]string, n)
	for i := range uids {
		uids[i] = fmt.Sprintf("%08x-%04x-4%03x-8%03x-%012x", i*2654435761&0xffffffff, i&0xffff, i&0xfff, (i>>12)&0xfff, i)
	}
	return uids
}

// committedSet returns a set tracking uids, each with one consumed trigger
// at(1) and nothing pending. It consumes through NoLocalWork, which reaches
// the same state as a commit without a state write per object.
func committedSet(tb testing.TB, uids []string, opts ...Option) *Set {
	s, err := New(at(0), opts...)
	if err != nil {
		tb.Fatal(err)
	}
	for _, uid := range uids {
		if r := s.Observe(uid, at(1), at(1)); r != report.Accepted {
			tb.Fatalf("Observe(%s) = %s", uid, r)
		}
		s.NoLocalWork(uid, at(1))
	}
	if st := s.Stats(); st.Objects != len(uids) || st.Pending != 0 {
		tb.Fatalf("objects %d pending %d, want %d and 0", st.Objects, st.Pending, len(uids))
	}
	return s
}

// threadCPU returns the CPU time the calling OS thread has used. On a
// machine shared with other work, wall-clock ns/op counts the time the
// benchmark was not even running; thread CPU time does not.
func threadCPU(tb testing.TB) time.Duration {
	var ts syscall.Timespec
	const clockThreadCPUTimeID = 3 // CLOCK_THREAD_CPUTIME_ID
	if _, _, errno := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTimeID, uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
		tb.Skipf("clock_gettime(CLOCK_THREAD_CPUTIME_ID): %v", errno)
	}
	return time.Duration(ts.Nano())
}

// BenchmarkObserveRedelivered is the resync/relist path: every object
// re-observed with its consumed trigger. Goal ≤ 50 ns/op, 0 allocs/op.
// cpu-ns/op is the benchmark thread's CPU time per op (see threadCPU).
// objects=16 keeps the set in cache; objects=100000 is a large cluster, where
// most lookups miss the CPU caches.
func BenchmarkObserveRedelivered(b *testing.B) {
	for _, n := range []int{16, 10000, 100000} {
		b.Run(fmt.Sprintf("objects=%d", n), func(b *testing.B) {
			uids := benchUIDs(n)
			s := committedSet(b, uids)
			trigger, received := at(1), at(100)
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			b.ReportAllocs()
			cpu := threadCPU(b)
			i := 0
			for b.Loop() {
				if s.Observe(uids[i%len(uids)], trigger, received) != report.Redelivered {
					b.Fatal("not redelivered")
				}
				i++
			}
			b.ReportMetric(float64(threadCPU(b)-cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}

// BenchmarkObserveRedeliveredParallel is the same with every core observing.
func BenchmarkObserveRedeliveredParallel(b *testing.B) {
	uids := benchUIDs(10000)
	s := committedSet(b, uids)
	trigger, received := at(1), at(100)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			s.Observe(uids[i%len(uids)], trigger, received)
			i++
		}
	})
}

// BenchmarkObserveAccepted is a new trigger for a tracked object. Objects
// take 4 triggers each, then are drained (untimed) so pending stays small.
func BenchmarkObserveAccepted(b *testing.B) {
	const perObject = 4
	uids := benchUIDs(16384)
	s := committedSet(b, uids)
	b.ReportAllocs()
	b.ResetTimer()
	round := 0
	for n := 0; n < b.N; {
		round++
		for v := range perObject {
			for _, uid := range uids {
				if n == b.N {
					break
				}
				if r := s.Observe(uid, at(float64(round*10+v+1)), at(1)); r != report.Accepted {
					b.Fatalf("Observe = %s", r)
				}
				n++
			}
		}
		b.StopTimer()
		for _, uid := range uids {
			s.NoLocalWork(uid, at(float64(round*10+perObject)))
		}
		b.StartTimer()
	}
}

// BenchmarkCommitted is one event and the commit that reports it, in memory
// and with the state fsync'd before the report is returned (O(objects) per
// write; concurrent commits share writes).
func BenchmarkCommitted(b *testing.B) {
	for _, c := range []struct {
		name    string
		objects int
		persist bool
	}{
		{"memory/objects=1000", 1000, false},
		{"persisted/objects=1000", 1000, true},
		{"persisted/objects=100000", 100000, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			uids := benchUIDs(c.objects)
			var opts []Option
			if c.persist {
				opts = append(opts, WithStatePath(b.TempDir()+"/seen.state"))
			}
			s := committedSet(b, uids, opts...)
			writesBefore := s.Stats().Persists
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				uid, trigger := uids[i%len(uids)], at(float64(2+i))
				s.Observe(uid, trigger, trigger)
				rs, err := s.Committed(uid, trigger, attemptAt(trigger))
				if err != nil || len(rs) != 1 {
					b.Fatalf("Committed = %v, %v", rs, err)
				}
				i++
			}
			b.ReportMetric(float64(s.Stats().Persists-writesBefore)/float64(b.N), "writes/op")
		})
	}
	// 16 goroutines per core committing at once: group commit shares writes.
	b.Run("persisted-parallel/objects=1000", func(b *testing.B) {
		uids := benchUIDs(1000)
		s := committedSet(b, uids, WithStatePath(b.TempDir()+"/seen.state"))
		var next struct {
			ch chan int
		}
		next.ch = make(chan int, len(uids))
		for i := range uids {
			next.ch <- i
		}
		b.ReportAllocs()
		b.SetParallelism(16)
		b.RunParallel(func(pb *testing.PB) {
			obj := <-next.ch // each goroutine owns one object, as a workqueue would
			v := 0
			for pb.Next() {
				v++
				trigger := at(float64(2 + v))
				s.Observe(uids[obj], trigger, trigger)
				if _, err := s.Committed(uids[obj], trigger, attemptAt(trigger)); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(s.Stats().Persists)/float64(b.N), "writes/op")
	})
}

// BenchmarkPersist is one state write (encode, write, fsync, rename, fsync
// dir) of 100,000 tracked objects.
func BenchmarkPersist(b *testing.B) {
	s := committedSet(b, benchUIDs(100000), WithStatePath(b.TempDir()+"/seen.state"))
	b.ReportAllocs()
	for b.Loop() {
		if err := s.Persist(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(s.encodeBuf)), "file-bytes")
}

// BenchmarkEncodeState is the in-memory part of a state write: encoding
// 100,000 tracked objects, one shard (1/32 of them) under its lock at a time.
func BenchmarkEncodeState(b *testing.B) {
	s := committedSet(b, benchUIDs(100000))
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		buf = s.appendState(buf[:0])
	}
	b.ReportMetric(float64(len(buf)), "file-bytes")
}

// heapPerObject measures the live heap a Set of n committed objects holds,
// per object.
func heapPerObject(tb testing.TB, n int) float64 {
	uids := benchUIDs(n)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s := committedSet(tb, uids)
	runtime.GC()
	runtime.ReadMemStats(&after)
	if s.Stats().Objects != n {
		tb.Fatalf("objects = %d, want %d", s.Stats().Objects, n)
	}
	runtime.KeepAlive(s)
	runtime.KeepAlive(uids)
	return float64(after.HeapAlloc-before.HeapAlloc) / float64(n)
}

// BenchmarkMemoryPerObject reports the heap held per tracked object with no
// pending trigger, at 100,000 objects (goal ≤ 128 bytes).
func BenchmarkMemoryPerObject(b *testing.B) {
	var perObject float64
	for b.Loop() {
		perObject = heapPerObject(b, 100000)
	}
	b.ReportMetric(perObject, "bytes/object")
}

func TestMemoryPerObject(t *testing.T) {
	if testing.Short() {
		t.Skip("builds 100,000 objects")
	}
	perObject := heapPerObject(t, 100000)
	t.Logf("%.1f bytes per tracked object at 100,000 objects", perObject)
	if perObject > 128 {
		t.Fatalf("%.1f bytes per tracked object, want ≤ 128", perObject)
	}
}
