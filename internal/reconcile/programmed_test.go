package reconcile

import (
	"testing"
	"time"

	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/report"
)

// TestLatencyEndsAtTheSwitch: a trigger's latency ends when the pod's switch made
// the new policy the one packets see (the attempt's Programmed), not when the commit
// returned: the cleanup after the switch changes no verdict, and under load it took
// over a millisecond (the packet prober saw reports 1.07 ms after the packets).
func TestLatencyEndsAtTheSwitch(t *testing.T) {
	sink := newRecordingSink()
	c := offlineController(t, bpfmaps.NewMemory(), newLookupTableResolver("10.60.0.1", 7), sink)
	store, h := c.informers[report.KindPolicyEndpoint].GetIndexer(), c.handler(report.KindPolicyEndpoint)
	pe, trigger := newVersion(benchPE(0, 1), nil)
	_ = store.Add(pe)
	h.OnAdd(pe, false)
	if c.sync(keyOf(report.KindPolicyEndpoint, pe), time.Now()) != outcomeDone {
		t.Fatal("sync failed")
	}
	recs := sink.recordsFor(string(pe.UID))
	if len(recs) != 1 || len(recs[0].Attempts) != 1 {
		t.Fatalf("records %+v, want one with one attempt", recs)
	}
	r, a := recs[0], recs[0].Attempts[0]
	if a.Programmed.IsZero() || a.Programmed.Before(a.Start) || a.Programmed.After(a.End) {
		t.Fatalf("attempt %v..%v programmed at %v: want the switch, inside the attempt", a.Start, a.End, a.Programmed)
	}
	if !r.Committed().Equal(a.Programmed) || r.Latency() != a.Programmed.Sub(trigger) {
		t.Errorf("committed %v, latency %v; want the switch %v and %v", r.Committed(), r.Latency(), a.Programmed, a.Programmed.Sub(trigger))
	}
}
