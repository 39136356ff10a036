package bpfmaps

import (
	"errors"
	"fmt"
	"math/bits"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/npagent/npagent/internal/testenv/netlab"
	"github.com/npagent/npagent/internal/testenv/skip"
)

// flowEvents reads a dataplane's flow events in the background until the test ends.
type flowEvents struct {
	r  *FlowEventReader
	ch chan FlowEvent
}

func openFlowEvents(t *testing.T, e *EBPF, cfg FlowEventConfig) *flowEvents {
	t.Helper()
	r, err := e.OpenFlowEvents(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f := &flowEvents{r: r, ch: make(chan FlowEvent, 100000)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			var ev FlowEvent
			if err := r.Read(&ev); err != nil {
				if !errors.Is(err, ErrFlowEventsClosed) {
					t.Errorf("read flow event: %v", err)
				}
				return
			}
			f.ch <- ev
		}
	}()
	t.Cleanup(func() {
		_ = r.Close()
		<-done
	})
	return f
}

// collect returns the events read within d (after waiting that long), those keep
// selects only.
func (f *flowEvents) collect(d time.Duration, keep func(*FlowEvent) bool) []FlowEvent {
	var out []FlowEvent
	deadline := time.After(d)
	for {
		select {
		case ev := <-f.ch:
			if keep == nil || keep(&ev) {
				out = append(out, ev)
			}
		case <-deadline:
			return out
		}
	}
}

func (f *flowEvents) drain() { f.collect(50*time.Millisecond, nil) }

func describeFlow(ev *FlowEvent) string {
	s := fmt.Sprintf("%s %s %s proto %d %v:%d > %v:%d", ev.Kind, ev.Direction, ev.Reason, ev.Protocol, ev.Src, ev.SrcPort, ev.Dst, ev.DstPort)
	if ev.Audited {
		s += " audited"
	}
	return s
}

// TestRealTrafficFlowEvents: real packets denied by a pod's policy (UDP, TCP, ICMP
// echo; IPv4 and IPv6) each produce one event with the packet's facts, attributed
// to the isolating object; an allowed flow produces none in FlowEventsDeny, one
// new_flow event (its first packet only) in FlowEventsAll, and FlowEventsOff
// reports nothing.
func TestRealTrafficFlowEvents(t *testing.T) {
	lab := newTrafficLab(t)
	for _, a := range []struct{ network, addr string }{
		{"udp4", labPod4 + ":5353"}, {"udp6", "[" + labPod6 + "]:5353"},
	} {
		netlab.ServeEcho(t, lab.pod, a.network, a.addr)
	}
	lab.enterNode(t)
	e := openTestEBPF(t, EBPFOptions{})
	objA := Origin{UID: "uid-a", Kind: "PolicyEndpoint", Namespace: "ns", Name: "a", Index: -1}
	udp := []PortRule{{Protocol: ProtocolUDP, Port: 5353}}
	pol := PodPolicy{
		Ingress: DirectionPolicy{Isolated: true, Sources: []Origin{objA},
			Allow: []Rule{{CIDR: labPeerNet4, Ports: udp}, {CIDR: labPeerNet6, Ports: udp}}},
		Egress: DirectionPolicy{Isolated: true, Sources: []Origin{objA}},
	}
	if _, err := e.Commit(lab.hostIfindex, pol); err != nil {
		t.Fatal(err)
	}
	settleVerdicts(t, e, lab.hostIfindex)
	ev := openFlowEvents(t, e, FlowEventConfig{Mode: FlowEventsDeny})
	fromPeer := func(f *FlowEvent) bool {
		return f.Src == netip.MustParseAddr(labPeer4) || f.Src == netip.MustParseAddr(labPeer6)
	}
	for _, fam := range []struct {
		name, pod, udp, tcp string
		v6                  bool
		peer, podAddr       netip.Addr
	}{
		{"IPv4", labPod4, "udp4", "tcp4", false, netip.MustParseAddr(labPeer4), netip.MustParseAddr(labPod4)},
		{"IPv6", "[" + labPod6 + "]", "udp6", "tcp6", true, netip.MustParseAddr(labPeer6), netip.MustParseAddr(labPod6)},
	} {
		check := func(what string, got []FlowEvent, n int, proto uint8, dport uint16) {
			t.Helper()
			if len(got) != n {
				var ds []string
				for i := range got {
					ds = append(ds, describeFlow(&got[i]))
				}
				t.Fatalf("%s %s: %d events, want %d: %v", fam.name, what, len(got), n, ds)
			}
			for i := range got {
				g := &got[i]
				if g.Kind != FlowDenied || g.Direction != Ingress || g.Reason != ReasonDefaultDeny || g.Audited ||
					g.Src != fam.peer || g.Dst != fam.podAddr || g.Protocol != proto || g.DstPort != dport ||
					g.Ifindex != lab.hostIfindex || g.Length == 0 {
					t.Errorf("%s %s: event %s ifindex %d length %d, want a default deny of proto %d to %v:%d on %d",
						fam.name, what, describeFlow(g), g.Ifindex, g.Length, proto, fam.podAddr, dport, lab.hostIfindex)
				}
				if proto != unix.IPPROTO_ICMP && proto != unix.IPPROTO_ICMPV6 && g.SrcPort == 0 {
					t.Errorf("%s %s: no source port in %s", fam.name, what, describeFlow(g))
				}
				if d := time.Since(g.Time); d < 0 || d > 10*time.Second {
					t.Errorf("%s %s: event time %v is %v from now", fam.name, what, g.Time, d)
				}
				if a := e.AttributeFlow(g); !a.Attributed || !slices.Equal(a.Sources, []Origin{objA}) {
					t.Errorf("%s %s: attributed to %+v, want the isolating object a", fam.name, what, a)
				}
			}
		}
		ev.drain()
		const n = 3
		for range n {
			if err := netlab.Exchange(lab.peer, fam.udp, fmt.Sprintf("%s:%d", fam.pod, 5356), trafficTimeout); err == nil {
				t.Fatal("UDP to a denied port passed")
			}
		}
		check("UDP denied", ev.collect(200*time.Millisecond, fromPeer), n, unix.IPPROTO_UDP, 5356)
		// One SYN: the timeout is shorter than the first retransmission.
		if err := netlab.Exchange(lab.peer, fam.tcp, fmt.Sprintf("%s:%d", fam.pod, 8081), trafficTimeout); err == nil {
			t.Fatal("TCP to a denied port passed")
		}
		check("TCP denied", ev.collect(200*time.Millisecond, fromPeer), 1, unix.IPPROTO_TCP, 8081)
		domain, proto, typ := unix.AF_INET, unix.IPPROTO_ICMP, byte(8)
		if fam.v6 {
			domain, proto, typ = unix.AF_INET6, unix.IPPROTO_ICMPV6, 128
		}
		fd := rawSocket(t, lab.peer, domain, unix.SOCK_RAW, proto, time.Second)
		for i := range n {
			if err := unix.Sendto(fd, echoMessage(fam.v6, typ, 0x4e70, uint16(i)), 0, labSockaddr(fam.podAddr)); err != nil {
				t.Fatal(err)
			}
		}
		icmp := ev.collect(200*time.Millisecond, fromPeer)
		check("ICMP echo denied", icmp, n, uint8(proto), 0)
		for _, g := range icmp {
			if g.ICMPID != 0x4e70 {
				t.Errorf("%s ICMP echo: identifier %#x, want 0x4e70", fam.name, g.ICMPID)
			}
		}
		// Allowed: no event while only denials are reported.
		if err := netlab.Exchange(lab.peer, fam.udp, fmt.Sprintf("%s:%d", fam.pod, 5353), trafficTimeout); err != nil {
			t.Fatal(err)
		}
		if got := ev.collect(200*time.Millisecond, fromPeer); len(got) != 0 {
			t.Errorf("%s: events for an allowed flow with mode deny: %v", fam.name, describeFlow(&got[0]))
		}
	}

	// FlowEventsAll: a new flow's first packet reports it, once.
	if err := e.SetFlowEvents(FlowEventConfig{Mode: FlowEventsAll}); err != nil {
		t.Fatal(err)
	}
	ev.drain()
	// Three datagrams of one flow (one socket, one source port).
	c, err := netlab.In(lab.peer, func() (net.Conn, error) { return net.DialTimeout("udp4", labPod4+":5353", trafficTimeout) })
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range 3 {
		_ = c.SetDeadline(time.Now().Add(trafficTimeout))
		buf := make([]byte, 16)
		if _, err := c.Write([]byte("flow")); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Read(buf); err != nil {
			t.Fatal(err)
		}
	}
	sport := uint16(c.LocalAddr().(*net.UDPAddr).Port)
	got := ev.collect(200*time.Millisecond, fromPeer)
	if len(got) != 1 || got[0].Kind != FlowNew || got[0].Reason != ReasonAllow || got[0].SrcPort != sport || got[0].DstPort != 5353 {
		var ds []string
		for i := range got {
			ds = append(ds, describeFlow(&got[i]))
		}
		t.Errorf("mode all: events %v, want one new_flow policy_allow from port %d", ds, sport)
	}

	// Off: nothing.
	if err := e.SetFlowEvents(FlowEventConfig{Mode: FlowEventsOff}); err != nil {
		t.Fatal(err)
	}
	ev.drain()
	_ = netlab.Exchange(lab.peer, "udp4", labPod4+":5356", trafficTimeout)
	if got := ev.collect(200*time.Millisecond, fromPeer); len(got) != 0 {
		t.Errorf("mode off: %d events", len(got))
	}
}

// TestFlowEventRateLimitPerPod floods one pod with denied packets (BPF_PROG_TEST_RUN,
// the kernel repeating the run) under a rate limit: that pod reports no more than
// its burst, every other event is counted as rate limited, and another pod's
// denial right after the flood is still reported.
func TestFlowEventRateLimitPerPod(t *testing.T) {
	e := openTestEBPF(t, EBPFOptions{})
	flooder, other := dummyInterface(t), dummyInterface(t)
	for _, ifindex := range []int{flooder, other} {
		if _, err := e.Commit(ifindex, widePolicy(10, 80)); err != nil {
			t.Fatal(err)
		}
	}
	const burst, flood = 5, 2000
	ev := openFlowEvents(t, e, FlowEventConfig{Mode: FlowEventsDeny, Rate: 1, Burst: burst})
	denied := packetBytes(netip.MustParseAddr("11.0.0.1"), podAddrIngress4, ProtocolTCP, 40000, 80)
	if _, err := e.objs.ToPod.Run(&ebpf.RunOptions{Data: denied, Context: skbContext{Ifindex: uint32(flooder)}, Repeat: flood}); err != nil {
		t.Fatal(err)
	}
	if run(t, e.objs.ToPod, other, denied) {
		t.Fatal("the other pod's packet passed")
	}
	got := ev.collect(300*time.Millisecond, nil)
	per := map[int]int{}
	for _, g := range got {
		per[g.Ifindex]++
	}
	if per[flooder] != burst || per[other] != 1 {
		t.Errorf("events: %d from the flooding pod (want its burst, %d), %d from the other (want 1)", per[flooder], burst, per[other])
	}
	s, err := e.FlowEventsSuppressed()
	if err != nil {
		t.Fatal(err)
	}
	if s.RateLimited != flood-burst || s.BufferFull != 0 {
		t.Errorf("suppressed %+v, want %d rate limited and none for a full buffer", s, flood-burst)
	}
}

// TestFlowEventRateLimitAcrossCPUs floods one pod with denied packets from several
// CPUs at once (one BPF_PROG_TEST_RUN per CPU, each on a thread pinned to its CPU),
// at a high rate so that the CPUs contend for the pod's bucket for the whole run.
// A bucket updated without a lock loses updates under such a race, and each CPU then
// admits at up to the full rate. Two bounds, each round:
//   - over the wall-clock window around the runs: at most the burst plus one event
//     per interval (coarse: time in which the machine's other load kept the CPUs
//     from running together races less and hides the excess);
//   - over every span between two admitted events, by the program's own clock (each
//     event's ktime is the now it was judged with): at most the burst plus one event
//     per interval of the span. Exact for the bucket whatever order the CPUs take its
//     lock in, and sensitive: a span in which the CPUs did run together shows what
//     lost updates let through.
func TestFlowEventRateLimitAcrossCPUs(t *testing.T) {
	var allowed unix.CPUSet
	if err := unix.SchedGetaffinity(0, &allowed); err != nil {
		t.Fatal(err)
	}
	var cpus []int
	for c := 0; c < 1024 && len(cpus) < 4; c++ {
		if allowed.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	if runtime.NumCPU() < 2 || len(cpus) < 2 {
		skip.Unmet(t, "needs 2 CPUs to race on one pod's bucket: %d usable", len(cpus))
	}
	const rate, burst, repeat, rounds = 1_000_000, 5, 100_000, 3
	// Room for every run of a round admitted (a record is the event and the ring
	// buffer's 8-byte header), so that each admitted event is read back.
	e := openTestEBPF(t, EBPFOptions{FlowEventBuffer: 1 << bits.Len(uint(len(cpus)*repeat*(flowEventSize+8)))})
	ifindex := dummyInterface(t)
	if _, err := e.Commit(ifindex, widePolicy(10, 80)); err != nil {
		t.Fatal(err)
	}
	// 1 µs between events, a burst of 5: the bucket refuses most packets (a run takes
	// a few hundred ns) and admits one every microsecond, so the CPUs race at each
	// admission.
	interval := time.Second / rate
	r, err := e.OpenFlowEvents(FlowEventConfig{Mode: FlowEventsDeny, Rate: rate, Burst: burst})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	denied := packetBytes(netip.MustParseAddr("11.0.0.1"), podAddrIngress4, ProtocolTCP, 40000, 80)
	var before FlowSuppressed
	for round := range rounds {
		window := floodFromCPUs(t, e.objs.ToPod, cpus, ifindex, denied, repeat)
		s, err := e.FlowEventsSuppressed()
		if err != nil {
			t.Fatal(err)
		}
		// A run interrupted by a signal is run again whole (cilium/ebpf), after an
		// unknown number of its repetitions: count what was admitted from the events
		// themselves, read until none is left, not from the runs.
		full := s.BufferFull - before.BufferFull
		before = s
		var times []time.Time
		for {
			r.rd.SetDeadline(time.Now().Add(200 * time.Millisecond))
			var ev FlowEvent
			if err := r.Read(&ev); errors.Is(err, os.ErrDeadlineExceeded) {
				break
			} else if err != nil {
				t.Fatalf("round %d: read event %d: %v", round, len(times), err)
			}
			times = append(times, ev.Time)
		}
		admitted := uint64(len(times)) + full
		if full != 0 {
			t.Logf("round %d: %d events found the ring buffer full", round, full)
		}
		slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
		// The tightest span: (j-i)*interval - (t_j-t_i) at its largest over i <= j,
		// which the bucket keeps within (burst-1)*interval.
		var excess, lowest time.Duration
		for k, tk := range times {
			x := time.Duration(k)*interval - tk.Sub(times[0])
			lowest = min(lowest, x)
			excess = max(excess, x-lowest)
		}
		bound := burst + uint64(window/interval)
		bound += bound / 100 // the clock reads around the runs
		t.Logf("round %d: %d CPUs %v, %d runs each in %v: %d admitted, bound %d (%.2f of it); tightest span holds %.1f bursts' worth (limit %d)",
			round, len(cpus), cpus, repeat, window, admitted, bound, float64(admitted)/float64(bound), 1+float64(excess)/float64(interval), burst)
		if admitted > bound {
			t.Errorf("round %d: %d events admitted from one pod in %v across %d CPUs, want at most %d (burst %d + one per %v)",
				round, admitted, window, len(cpus), bound, burst, interval)
		}
		if excess > (burst-1)*interval {
			t.Errorf("round %d: a span of the program's clock held %.1f events beyond one per %v, want at most the burst, %d",
				round, 1+float64(excess)/float64(interval), interval, burst)
		}
	}
}

// floodFromCPUs runs prog repeat times on pkt from each of cpus at once, each run
// on a thread pinned to its CPU, and returns the wall-clock time they took together.
func floodFromCPUs(t *testing.T, prog *ebpf.Program, cpus []int, ifindex int, pkt []byte, repeat uint32) time.Duration {
	t.Helper()
	var ready, done sync.WaitGroup
	errs := make([]error, len(cpus))
	start := make(chan struct{})
	for i, c := range cpus {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			// The thread goes back to the runtime only with its own CPUs again; one
			// left pinned would run later goroutines on one CPU. Still locked at
			// exit, it ends with the goroutine.
			runtime.LockOSThread()
			var own, set unix.CPUSet
			set.Set(c)
			if errs[i] = unix.SchedGetaffinity(0, &own); errs[i] == nil {
				errs[i] = unix.SchedSetaffinity(0, &set)
			}
			ready.Done()
			<-start
			if errs[i] != nil {
				return
			}
			_, errs[i] = prog.Run(&ebpf.RunOptions{Data: pkt, Context: skbContext{Ifindex: uint32(ifindex)}, Repeat: repeat})
			if unix.SchedSetaffinity(0, &own) == nil {
				runtime.UnlockOSThread()
			}
		}()
	}
	ready.Wait()
	begin := time.Now()
	close(start)
	done.Wait()
	window := time.Since(begin)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("CPU %d: %v", cpus[i], err)
		}
	}
	return window
}

// TestFlowEventBufferFull: without a rate limit, a flood that outruns the reader
// fills the ring buffer; what does not fit is counted, never waited for.
func TestFlowEventBufferFull(t *testing.T) {
	e := openTestEBPF(t, EBPFOptions{FlowEventBuffer: unix.Getpagesize()})
	ifindex := dummyInterface(t)
	if _, err := e.Commit(ifindex, widePolicy(10, 80)); err != nil {
		t.Fatal(err)
	}
	r, err := e.OpenFlowEvents(FlowEventConfig{Mode: FlowEventsDeny})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	const flood = 1000
	denied := packetBytes(netip.MustParseAddr("11.0.0.1"), podAddrIngress4, ProtocolTCP, 40000, 80)
	if _, err := e.objs.ToPod.Run(&ebpf.RunOptions{Data: denied, Context: skbContext{Ifindex: uint32(ifindex)}, Repeat: flood}); err != nil {
		t.Fatal(err)
	}
	s, err := e.FlowEventsSuppressed()
	if err != nil {
		t.Fatal(err)
	}
	fits := unix.Getpagesize() / (flowEventSize + 8) // each record has an 8-byte header
	if s.BufferFull < uint64(flood-fits) || s.BufferFull >= flood || s.RateLimited != 0 {
		t.Errorf("suppressed %+v, want about %d for a full buffer (%d fit)", s, flood-fits, fits)
	}
}

func TestFlowEventConfig(t *testing.T) {
	c, err := eventConfig(FlowEventConfig{Mode: FlowEventsAll, Rate: 100, Burst: 20})
	if err != nil || c.IntervalNs != 10_000_000 || c.BurstNs != 19*10_000_000 || c.Mode != 2 {
		t.Errorf("rate 100/s burst 20: %+v, %v", c, err)
	}
	if c, err := eventConfig(FlowEventConfig{Mode: FlowEventsDeny}); err != nil || c.IntervalNs != 0 {
		t.Errorf("no rate: %+v, %v: want no limit", c, err)
	}
	if _, err := eventConfig(FlowEventConfig{Rate: -1}); err == nil {
		t.Error("a negative rate was accepted")
	}
	for _, s := range []string{"off", "deny", "all"} {
		if m, err := ParseFlowEventMode(s); err != nil || m.String() != s {
			t.Errorf("ParseFlowEventMode(%q) = %v, %v", s, m, err)
		}
	}
	if _, err := ParseFlowEventMode("some"); err == nil {
		t.Error(`ParseFlowEventMode("some") succeeded`)
	}
}
