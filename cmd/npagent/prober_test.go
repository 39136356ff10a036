package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"golang.org/x/sys/unix"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/explain"
	"github.com/npagent/npagent/internal/testenv"
	"github.com/npagent/npagent/internal/testenv/netlab"
)

// The packet prober: clusterloader2's NetworkPolicyEnforcement idea on one node.
// A peer sends a datagram to a pod every proberInterval while a PolicyEndpoint flips
// the peer between allowed and denied; the datagrams show when each flip took effect
// in the kernel, and the agent's reported commit time for the flip's trigger must
// agree with them.
const (
	proberInterval = 500 * time.Microsecond
	proberPeriod   = 300 * time.Millisecond // between flips: every report is read before the next
	proberPort     = 7000
	// proberSlack is how much later than the packets the reported commit may be.
	proberSlack = time.Millisecond
	// proberE2E selects the full profile (make e2e-full).
	proberE2E = "NPAGENT_E2E"
)

// proberFlips is the number of flips that must pin their commit sharply (a window
// within proberSlack): 16 under make e2e-full, 4 under make test. The test makes twice as
// many and checks every one (sharpFlipsNeeded).
func proberFlips() int {
	if os.Getenv(proberE2E) == "1" {
		return 16
	}
	return 4
}

// probe is what the prober saw of one datagram, indexed by its sequence number.
type probe struct {
	sent    time.Time // CLOCK_REALTIME just before the send; carried in the datagram
	written time.Time // just after the send returned (veth: the packet has passed the node by then, as a rule)
	arrived time.Time // when the pod read it; zero if it never arrived
}

// flipWindow finds, in the datagrams ps[a:b] sent from one flip's trigger to the
// next flip's (a ≥ 1: the datagram before a was sent under the previous policy),
// where the verdict changed to allowed (toAllow) or denied: lo is the last datagram
// the old policy judged, hi = lo+1 the first the new one judged. The change must be
// one clean step: under allow every datagram arrives, under deny none does.
func flipWindow(ps []probe, a, b int, toAllow bool) (lo, hi int, err error) {
	if a < 1 || a >= b || b > len(ps) {
		return 0, 0, fmt.Errorf("datagrams [%d, %d) of %d: the prober did not send around the flip", a, b, len(ps))
	}
	got := func(i int) bool { return !ps[i].arrived.IsZero() }
	// The step: the first datagram from a-1 on whose fate is the new policy's.
	hi = -1
	for i := a - 1; i < b; i++ {
		if got(i) == toAllow {
			hi = i
			break
		}
	}
	switch {
	case hi == -1:
		return 0, 0, fmt.Errorf("no datagram sent in the %d after the trigger shows the new policy", b-a)
	case hi == a-1:
		return 0, 0, fmt.Errorf("datagram %d, sent before the trigger, already shows the new policy", hi)
	}
	for i := a - 1; i < b; i++ {
		if want := (i >= hi) == toAllow; got(i) != want {
			return 0, 0, fmt.Errorf("datagram %d (sent %s after the step's first) arrived=%v: the verdict did not change in one step",
				i, ps[i].sent.Sub(ps[hi].sent), got(i))
		}
	}
	return hi - 1, hi, nil
}

// flip is one PolicyEndpoint update and what the packets and the agent say of it.
type flip struct {
	toAllow   bool
	trigger   time.Time // the annotation
	committed time.Time // the agent's reported commit for this trigger
	// cleanup is the reported commit's last phase, after the switch: deleting the
	// old generation's entries (in the table: what lies between the switch the
	// packets see and the commit time the agent reports).
	cleanup time.Duration
	lo, hi  int // datagrams: last under the old policy, first under the new
}

// TestProberFlipLatency flips a PolicyEndpoint between allowing and denying a peer
// that sends a UDP datagram to the pod every 0.5 ms, and checks for each flip that
// the agent's reported commit time (explain's report for the flip's trigger) lies
// after the last datagram the old policy judged and no later than 1 ms after the
// first one the new policy judged: a reported latency never earlier than the
// packets show, and within 1 ms of them. The agent is the binary with the eBPF
// dataplane in a node namespace (nodeLab); the clocks agree because both ends are
// on this host.
//
// The agent's commit time is the attempt's switch (report.Attempt.Programmed), the
// store the packets see. It used to be the attempt's end, after the cleanup phase
// (the old entry set brought level or deleted): a cleanup delayed past the slack
// (1.15 ms under CPU contention here, about one flip in forty) failed this test,
// which is how that was found; the cleanup column still shows it.
//
// Sharpness: a flip whose window (last old-policy datagram to the first new one) is
// wider than the slack fell in a gap of the sender and pins nothing. On this
// PREEMPT_NONE VM the real-time sender still stalls 1–10 ms in 1–3 % of its
// intervals while make test's other packages run, spread evenly over the run, so
// two of four flips sometimes fell in such gaps (a red CI). The test therefore makes
// 2n flips, checks every one as before, and needs n of them sharp — more sharp flips
// than the n−n/4 of n it needed before.
func TestProberFlipLatency(t *testing.T) {
	skipIfShort(t)
	if raceDetector {
		// Not a missing prerequisite: a 1 ms bound cannot be judged when the race
		// detector stalls the sender for milliseconds (it did in CI). make test and
		// make e2e run it in a plain pass of its own (RACE_SKIPPED), make e2e-full in full.
		t.Skip("timing test: the race detector stalls the 0.5 ms sender; run without -race (make test and make e2e run it in a plain pass of its own; make e2e-full)")
	}
	n := proberFlips() // sharp flips needed; 2n are made
	l := newNodeLab(t, "npr", 207)
	cp, _ := l.startAgent(t)
	ctx := context.Background()
	debug := explain.NewClient(l.debugSocket)

	// reported waits for the agent's report of trigger and returns its commit time.
	reported := func(trigger time.Time, rv string) explain.ReportInfo {
		t.Helper()
		var r *explain.ReportInfo
		testenv.Eventually(t, 20*time.Second, "the agent reports trigger "+trigger.Format(time.RFC3339Nano), func() bool {
			var ex explain.ObjectExplain
			if err := debug.Get(ctx, "/v1/object/pe/default/prober", &ex); err != nil {
				return false
			}
			for i := range ex.Reports {
				if ex.Reports[i].Trigger.Equal(trigger) {
					r = &ex.Reports[i]
					return true
				}
			}
			return false
		})
		if r.ResourceVersion != rv || r.Committed.Before(trigger) || len(r.Attempts) == 0 {
			t.Fatalf("report of trigger %s: %+v; want resourceVersion %s, committed after the trigger", trigger.Format(time.RFC3339Nano), *r, rv)
		}
		return *r
	}
	udp, tcp := corev1.ProtocolUDP, corev1.ProtocolTCP
	port, other := int32(proberPort), int32(80)
	ingress := func(allow bool) []v1alpha1.EndpointInfo {
		if allow {
			return []v1alpha1.EndpointInfo{{CIDR: v1alpha1.NetworkAddress(l.peerIP), Ports: []v1alpha1.Port{{Protocol: &udp, Port: &port}}}}
		}
		// Denied: the peer keeps a rule, for another protocol and port.
		return []v1alpha1.EndpointInfo{{CIDR: v1alpha1.NetworkAddress(l.peerIP), Ports: []v1alpha1.Port{{Protocol: &tcp, Port: &other}}}}
	}
	// stamp sets the trigger annotation to now, as the controller does just before
	// its write, and returns it as the agent will parse it.
	stamp := func(pe *v1alpha1.PolicyEndpoint) time.Time {
		s := time.Now().UTC().Format(time.RFC3339Nano)
		pe.Annotations[v1alpha1.AnnotationLastChangeTriggerTime] = s
		trigger, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return trigger
	}

	pe := &v1alpha1.PolicyEndpoint{
		ObjectMeta: metav1.ObjectMeta{Name: "prober", Namespace: "default", Annotations: map[string]string{}},
		Spec: v1alpha1.PolicyEndpointSpec{
			PolicyRef:            v1alpha1.PolicyReference{Name: "prober", Namespace: "default"},
			PodIsolation:         []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			PodSelectorEndpoints: []v1alpha1.PodEndpoint{{HostIP: v1alpha1.NetworkAddress(l.nodeIP), PodIP: v1alpha1.NetworkAddress(l.podIP), Name: "prober-0", Namespace: "default"}},
			Ingress:              ingress(true),
		},
	}
	created := stamp(pe)
	if err := cp.Client.Create(ctx, pe); err != nil {
		t.Fatalf("create PolicyEndpoint default/prober: %v", err)
	}
	reported(created, pe.ResourceVersion) // programs attach here; the flips only switch

	pr := startProber(t, l)
	time.Sleep(proberPeriod) // the first datagrams find the ARP entries made

	flips := make([]flip, 2*n)
	for i := range flips {
		allow := i%2 == 1 // allowed now: deny first
		pe.Spec.Ingress = ingress(allow)
		trigger := stamp(pe)
		if err := cp.Client.Update(ctx, pe); err != nil {
			t.Fatalf("flip %d: update default/prober: %v", i, err)
		}
		r := reported(trigger, pe.ResourceVersion)
		flips[i] = flip{toAllow: allow, trigger: trigger, committed: r.Committed, cleanup: r.Attempts[len(r.Attempts)-1].Phases.Cleanup}
		time.Sleep(time.Until(trigger.Add(proberPeriod)))
	}
	ps := pr.stop(t)
	var maxTransit time.Duration
	for _, p := range ps {
		if !p.arrived.IsZero() {
			maxTransit = max(maxTransit, p.arrived.Sub(p.sent))
		}
	}
	var errs []string
	for i := range flips {
		f := &flips[i]
		end := len(ps)
		if i+1 < len(flips) {
			end = firstAt(ps, flips[i+1].trigger)
		}
		var err error
		if f.lo, f.hi, err = flipWindow(ps, firstAt(ps, f.trigger), end, f.toAllow); err != nil {
			errs = append(errs, fmt.Sprintf("flip %d: %v", i, err))
		}
	}
	if len(errs) > 0 {
		t.Fatalf("the datagrams do not show each flip as one step:\n%s", strings.Join(errs, "\n"))
	}

	// The table, and the checks.
	var (
		tab        strings.Builder
		minD, maxD time.Duration
		blurred    int
	)
	w := tabwriter.NewWriter(&tab, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "flip\tto\ttrigger\treported\tpackets\tpackets−reported\twindow\tcleanup\t")
	ms := func(d time.Duration) string { return fmt.Sprintf("%.3f ms", float64(d)/float64(time.Millisecond)) }
	t0 := flips[0].trigger
	for i, f := range flips {
		lo, hi := ps[f.lo], ps[f.hi]
		// The switch happened after the old policy judged lo (sent before that) and,
		// as a rule, before hi's send returned: hi.written − lo.sent is how sharply the
		// packets pin it.
		window := hi.written.Sub(lo.sent)
		diff := hi.sent.Sub(f.committed)
		if i == 0 {
			minD, maxD = diff, diff
		}
		minD, maxD = min(minD, diff), max(maxD, diff)
		to := "deny"
		if f.toAllow {
			to = "allow"
		}
		fmt.Fprintf(w, "%d\t%s\t+%s\t%s\t%s\t%s\t%s\t%s\t\n", i, to, ms(f.trigger.Sub(t0)),
			ms(f.committed.Sub(f.trigger)), ms(hi.sent.Sub(f.trigger)), ms(diff), ms(window), ms(f.cleanup))
		if !f.committed.After(lo.sent) {
			errs = append(errs, fmt.Sprintf("flip %d: reported commit %s before datagram %d, sent later, was still judged by the old policy",
				i, ms(lo.sent.Sub(f.committed)), f.lo))
		}
		if f.committed.After(hi.written.Add(proberSlack)) {
			errs = append(errs, fmt.Sprintf("flip %d: reported commit %s after the send of datagram %d, the first the new policy judged, returned (want ≤ %s; the commit's cleanup, after the switch, took %s)",
				i, ms(f.committed.Sub(hi.written)), f.hi, ms(proberSlack), ms(f.cleanup)))
		}
		if window > proberSlack {
			blurred++
		}
	}
	_ = w.Flush()
	t.Logf("%d flips, %d datagrams every %v, longest transit %s; packets = send time of the first datagram the new policy judged; window = from the last the old one judged to it; cleanup = the commit's phase after the switch:\n%s"+
		"packets minus reported: %s … %s", len(flips), len(ps), proberInterval, ms(maxTransit), tab.String(), ms(minD), ms(maxD))
	// A sender that stalled over the flips would make every check easy: n windows
	// must be sharper than the slack.
	if sharp := len(flips) - blurred; sharp < n {
		errs = append(errs, fmt.Sprintf("%d of %d flips fell in a gap of the sender wider than %s, %d sharp, want at least %d: the packets do not pin them",
			blurred, len(flips), ms(proberSlack), sharp, n))
	}
	if len(errs) > 0 {
		t.Errorf("reported commits disagree with the packets:\n%s", strings.Join(errs, "\n"))
	}
}

// prober is a peer sending a datagram to the lab's pod every proberInterval, and
// the pod's receiver recording which arrived.
type prober struct {
	rx, tx   *net.UDPConn
	stopped  atomic.Bool
	once     sync.Once
	txDone   chan struct{}
	rxDone   chan struct{}
	sends    []probe
	txErrors int
	arrivals []arrival
	fates    []probe
}

// arrival is one datagram the pod read: its sequence number and send time, as
// carried, and when it was read.
type arrival struct {
	seq        uint64
	sent, read time.Time
}

// startProber starts sending from the lab's peer to its pod's UDP proberPort; the
// sender is stopped at cleanup if stop was not called.
func startProber(t *testing.T, l *nodeLab) *prober {
	t.Helper()
	rx, err := netlab.In(l.pod, func() (*net.UDPConn, error) {
		return net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP(l.podIP), Port: proberPort})
	})
	if err != nil {
		t.Fatalf("listen in the pod: %v", err)
	}
	// Room for seconds of datagrams, past net.core.rmem_max (SO_RCVBUFFORCE, as
	// root): a receiver delayed by the machine's load must not drop any, or the
	// allowed runs would show holes the policy did not make.
	if raw, err := rx.SyscallConn(); err != nil {
		t.Fatal(err)
	} else if err := raw.Control(func(fd uintptr) {
		if err := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 16<<20); err != nil {
			t.Errorf("SO_RCVBUFFORCE: %v", err)
		}
	}); err != nil {
		t.Fatal(err)
	}
	tx, err := netlab.In(l.peer, func() (*net.UDPConn, error) {
		return net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.ParseIP(l.podIP), Port: proberPort})
	})
	if err != nil {
		rx.Close()
		t.Fatalf("dial from the peer: %v", err)
	}
	p := &prober{rx: rx, tx: tx, txDone: make(chan struct{}), rxDone: make(chan struct{})}
	go p.receive()
	txPolicy := make(chan error, 1)
	go p.send(txPolicy)
	if err := <-txPolicy; err != nil {
		t.Logf("the sender runs without SCHED_FIFO (%v): its gaps may be wider", err)
	}
	t.Cleanup(func() { p.stop(t) })
	return p
}

func (p *prober) receive() {
	defer close(p.rxDone)
	buf := make([]byte, 64)
	for {
		n, err := p.rx.Read(buf)
		now := time.Now()
		if err != nil {
			return
		}
		if n == 16 {
			p.arrivals = append(p.arrivals, arrival{binary.BigEndian.Uint64(buf), time.Unix(0, int64(binary.BigEndian.Uint64(buf[8:]))), now})
		}
	}
}

func (p *prober) send(policy chan<- error) {
	defer close(p.txDone)
	// A thread of its own, sleeping with nanosleep (the runtime's timers wake
	// late and in bursts at sub-millisecond periods), real-time so the tests
	// and builds sharing the machine do not delay its wake-ups and sends. It
	// sleeps between sends, so it takes a few percent of one CPU. The thread
	// is discarded afterwards (the goroutine exits locked).
	runtime.LockOSThread()
	policy <- unix.SchedSetAttr(0, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_FIFO, Priority: 10}, 0)
	start := time.Now()
	buf := make([]byte, 16)
	for seq := uint64(0); !p.stopped.Load(); seq++ {
		if d := time.Until(start.Add(time.Duration(seq) * proberInterval)); d > 0 {
			ts := unix.NsecToTimespec(int64(d))
			_ = unix.Nanosleep(&ts, nil)
		}
		sent := time.Now()
		binary.BigEndian.PutUint64(buf, seq)
		binary.BigEndian.PutUint64(buf[8:], uint64(sent.UnixNano()))
		if _, err := p.tx.Write(buf); err != nil {
			p.txErrors++
		}
		p.sends = append(p.sends, probe{sent: sent, written: time.Now()})
	}
}

// stop stops the sender, lets the last datagrams arrive, and returns every
// datagram's fate, checked against what it carried.
func (p *prober) stop(t *testing.T) []probe {
	t.Helper()
	p.once.Do(func() {
		p.stopped.Store(true)
		<-p.txDone
		time.Sleep(50 * time.Millisecond) // the last datagrams' way to the pod
		p.rx.Close()
		<-p.rxDone
		p.tx.Close()
		ps := p.sends
		for _, a := range p.arrivals {
			if a.seq >= uint64(len(ps)) || !a.sent.Equal(ps[a.seq].sent) || !ps[a.seq].arrived.IsZero() {
				t.Fatalf("datagram %d arrived with send time %v: not one the peer sent once (sent %d)", a.seq, a.sent, len(ps))
			}
			ps[a.seq].arrived = a.read
		}
		if p.txErrors > 0 {
			t.Errorf("%d of %d sends failed", p.txErrors, len(ps))
		}
		p.fates = ps
	})
	return p.fates
}

// firstAt is the index of the first datagram sent at or after at.
func firstAt(ps []probe, at time.Time) int {
	i, _ := slices.BinarySearchFunc(ps, at, func(p probe, at time.Time) int { return p.sent.Compare(at) })
	return i
}

// TestProberFlipWindow checks the step finder on made-up fates: a clean step each
// way, and the ways a run can fail to show one.
func TestProberFlipWindow(t *testing.T) {
	fates := func(s string) []probe {
		ps := make([]probe, len(s))
		base := time.Unix(1000, 0)
		for i, c := range s {
			ps[i].sent = base.Add(time.Duration(i) * proberInterval)
			if c == '1' {
				ps[i].arrived = ps[i].sent.Add(time.Microsecond)
			}
		}
		return ps
	}
	for _, c := range []struct {
		fates   string
		a, b    int
		toAllow bool
		lo, hi  int
		err     string
	}{
		{fates: "11111000", a: 2, b: 8, lo: 4, hi: 5},
		{fates: "00001111", a: 2, b: 8, toAllow: true, lo: 3, hi: 4},
		{fates: "11000000", a: 2, b: 8, lo: 1, hi: 2}, // the first datagram after the trigger is denied
		{fates: "11111111", a: 2, b: 8, err: "no datagram"},
		{fates: "10000000", a: 2, b: 8, err: "already shows the new policy"},
		{fates: "11110100", a: 2, b: 8, err: "one step"},
		{fates: "00011011", a: 2, b: 8, toAllow: true, err: "one step"},
		{fates: "01111111", a: 2, b: 8, toAllow: true, err: "already shows"},
		{fates: "1111", a: 0, b: 4, err: "did not send"},
	} {
		lo, hi, err := flipWindow(fates(c.fates), c.a, c.b, c.toAllow)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s [%d,%d) toAllow=%v: err %v, want one saying %q", c.fates, c.a, c.b, c.toAllow, err, c.err)
		case c.err == "" && (err != nil || lo != c.lo || hi != c.hi):
			t.Errorf("%s [%d,%d) toAllow=%v: %d, %d, %v; want %d, %d", c.fates, c.a, c.b, c.toAllow, lo, hi, err, c.lo, c.hi)
		}
	}
}
