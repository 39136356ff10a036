package seen

import (
	"testing"

	"github.com/npagent/npagent/internal/report"
)

// BenchmarkReportCost is one report on a node with 100 objects of its own in a
// cluster of objects=N: the event and the commit that reports it, the state
// fsync'd before the report returns. Half the cluster was listed at the start
// (before_start), half written since and consumed without local work
// (no_local_pods), all before the watermark; the node's objects are committed in
// turn, each with a new trigger. Goal (issue 23): the cost at 100,000 objects
// within 2× of 1,000.
func BenchmarkReportCost(b *testing.B) {
	for _, c := range []struct {
		name    string
		objects int
	}{{"objects=1000", 1000}, {"objects=100000", 100000}} {
		b.Run(c.name, func(b *testing.B) {
			s, err := New(at(0), WithStatePath(b.TempDir()+"/seen.state"))
			if err != nil {
				b.Fatal(err)
			}
			for i, uid := range benchUIDs(c.objects) {
				if i%2 == 0 {
					if r := s.Observe(uid, at(-1), at(1)); r != report.BeforeStart {
						b.Fatalf("Observe(%s) = %s", uid, r)
					}
					continue
				}
				if r := s.Observe(uid, at(1), at(1)); r != report.Accepted {
					b.Fatalf("Observe(%s) = %s", uid, r)
				}
				s.NoLocalWork(uid, at(1))
			}
			s.MarkSynced(at(2))
			local := benchUIDs(c.objects + 100)[c.objects:]
			writesBefore := s.Stats().Persists
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				uid, trigger := local[i%len(local)], at(float64(100+i))
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
}
