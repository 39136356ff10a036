package bpfmaps

import (
	"errors"
	"net/netip"
	"testing"
)

// BenchmarkFlowEvents: the program's cost per denied packet under a deny flood from
// one pod (BPF_PROG_TEST_RUN, the kernel repeating the run), with flow events off
// and on: "limited", the pod's rate limit empty (the flood's steady state: a bucket
// check and a suppressed count); "reported", no limit and a reader draining the ring
// buffer (every packet reserves, fills and submits an event); "full", no limit and
// no reader (every reserve fails and is counted). "allowed" is the common path,
// which events never touch (only a new connection entry could report one).
func BenchmarkFlowEvents(b *testing.B) {
	e := openTestEBPF(b, EBPFOptions{})
	ifindex := dummyInterface(b)
	if _, err := e.Commit(ifindex, widePolicy(10, 80)); err != nil {
		b.Fatal(err)
	}
	denied := []verdictCase{{"denied", packetBytes(netip.MustParseAddr("11.0.0.1"), podAddrIngress4, ProtocolTCP, 40000, 80)}}
	allowed := []verdictCase{{"allowed", packetBytes(netip.MustParseAddr("10.0.0.7"), podAddrIngress4, ProtocolTCP, 40000, 80)}}
	set := func(cfg FlowEventConfig) {
		if err := e.SetFlowEvents(cfg); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("off", func(b *testing.B) {
		set(FlowEventConfig{Mode: FlowEventsOff})
		benchVerdicts(b, e, ifindex, append(denied, allowed...))
	})
	b.Run("limited", func(b *testing.B) {
		set(FlowEventConfig{Mode: FlowEventsAll, Rate: 1, Burst: 1})
		benchVerdicts(b, e, ifindex, append(denied, allowed...))
	})
	b.Run("full", func(b *testing.B) {
		set(FlowEventConfig{Mode: FlowEventsDeny})
		benchVerdicts(b, e, ifindex, denied)
	})
	b.Run("reported", func(b *testing.B) {
		r, err := e.OpenFlowEvents(FlowEventConfig{Mode: FlowEventsDeny})
		if err != nil {
			b.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			var ev FlowEvent
			for {
				if err := r.Read(&ev); errors.Is(err, ErrFlowEventsClosed) {
					return
				}
			}
		}()
		benchVerdicts(b, e, ifindex, denied)
		_ = r.Close()
		<-done
	})
}
