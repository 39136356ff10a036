package bpfmaps

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"
)

// Flow events: the programs put one record per denied packet (audit mode's would-be
// denials too) and, in FlowEventsAll, one per connection entry an allowed packet
// makes (a newly tracked flow) into a ring buffer, after a per-pod rate limit in the
// program. Records are raw facts (FlowEvent); the rule id and the judging word's
// generation resolve, as the verdict counters' do, through the commits this process
// made (AttributeFlow). Nothing here waits on the packet path: an event the rate
// limit or a full ring buffer refuses is counted (FlowEventsSuppressed).

// DefaultFlowEventBuffer is the flow events ring buffer's default size in bytes
// (EBPFOptions.FlowEventBuffer): 16,384 events of 72 bytes.
const DefaultFlowEventBuffer = 1 << 20

// flowEventSize is one event's record in the ring buffer (struct flow_event).
const flowEventSize = 64

// FlowEventMode is which events the programs report.
type FlowEventMode uint32

// Modes (EVENTS_* in policy.c).
const (
	FlowEventsOff  FlowEventMode = 0
	FlowEventsDeny FlowEventMode = 1 // denials, and audit mode's would-be denials
	FlowEventsAll  FlowEventMode = 2 // denials and newly tracked allowed flows
)

func (m FlowEventMode) String() string {
	switch m {
	case FlowEventsOff:
		return "off"
	case FlowEventsDeny:
		return "deny"
	case FlowEventsAll:
		return "all"
	}
	return fmt.Sprintf("mode(%d)", uint32(m))
}

// ParseFlowEventMode reads "off", "deny" or "all".
func ParseFlowEventMode(s string) (FlowEventMode, error) {
	for _, m := range []FlowEventMode{FlowEventsOff, FlowEventsDeny, FlowEventsAll} {
		if s == m.String() {
			return m, nil
		}
	}
	return FlowEventsOff, fmt.Errorf("flow events %q: want off, deny or all", s)
}

// FlowEventConfig is what the programs report and how fast, per pod.
type FlowEventConfig struct {
	Mode FlowEventMode
	// Rate is how many events per second one pod may produce on average; 0: no
	// limit. Burst is how many it may produce at once (at least 1).
	Rate  float64
	Burst int
}

// FlowEventKind is what an event reports.
type FlowEventKind uint8

// Kinds (EVENT_* in policy.c).
const (
	FlowDenied FlowEventKind = 1 // a denied packet (Audited: one that passed in audit mode)
	FlowNew    FlowEventKind = 2 // an allowed packet that made a connection entry
)

func (k FlowEventKind) String() string {
	if k == FlowNew {
		return "new_flow"
	}
	return "deny"
}

// FlowEvent is one event as the program reported it.
type FlowEvent struct {
	// Time is when the program judged the packet (its monotonic clock, carried to
	// the wall clock when read).
	Time      time.Time
	Ifindex   int
	Direction Direction
	Kind      FlowEventKind
	Reason    VerdictReason
	Audited   bool // a policy denial that passed (EBPFOptions.Audit)
	// Src and Dst are the packet's addresses; invalid for a packet that is not IP
	// (ReasonNotIP, ARP).
	Src, Dst netip.Addr
	// Protocol is the IP protocol number. SrcPort and DstPort are 0 for protocols
	// without ports (ICMP: see ICMPID).
	Protocol         uint8
	SrcPort, DstPort uint16
	// ICMPID is an ICMP or ICMPv6 echo's identifier, 0 otherwise.
	ICMPID uint16
	Length uint32 // the packet's length, its link-layer header included
	// gen and rule are the judging word's low 32 bits and the deciding rule's id:
	// AttributeFlow's key.
	gen  uint32
	rule uint16
}

// FlowAttribution is what decided an event's packet, as the verdict counters
// credit it (VerdictCount).
type FlowAttribution struct {
	Rule       Origin   // the admin or baseline rule; zero otherwise
	Sources    []Origin // the direction's namespaced objects, for ReasonAllow and ReasonDefaultDeny
	Attributed bool     // false when the commit that judged the packet is no longer known
}

// FlowSuppressed counts events the programs did not report, since the dataplane
// was opened.
type FlowSuppressed struct {
	RateLimited uint64 // refused by the pod's rate limit
	BufferFull  uint64 // the ring buffer was full: user space fell behind
}

// FlowEventReader reads the flow events the programs report. Read blocks; Close
// (safe from another goroutine) makes it return ErrFlowEventsClosed.
type FlowEventReader struct {
	rd   *ringbuf.Reader
	rec  ringbuf.Record
	boot time.Time // wall clock at monotonic 0, as of opening
}

// ErrFlowEventsClosed is Read's error once the reader is closed.
var ErrFlowEventsClosed = errors.New("flow events: reader closed")

// ErrFlowEventsUnsupported is OpenFlowEvents' error for a backend without a
// datapath (Memory).
var ErrFlowEventsUnsupported = errors.New("flow events: not supported by this dataplane backend")

// FlowEventSource is a dataplane that reports flow events.
type FlowEventSource interface {
	// OpenFlowEvents sets what the programs report (cfg) and returns a reader of
	// their events; one reader at a time.
	OpenFlowEvents(cfg FlowEventConfig) (*FlowEventReader, error)
	// FlowEventsSuppressed reads the suppressed events' counters.
	FlowEventsSuppressed() (FlowSuppressed, error)
	// AttributeFlow names what decided an event's packet.
	AttributeFlow(ev *FlowEvent) FlowAttribution
}

var _ FlowEventSource = (*EBPF)(nil)

// eventConfig turns cfg into the program's element.
func eventConfig(cfg FlowEventConfig) (policyEventConfig, error) {
	c := policyEventConfig{Mode: uint32(cfg.Mode)}
	if cfg.Mode > FlowEventsAll {
		return c, fmt.Errorf("flow events: unknown mode %d", cfg.Mode)
	}
	if cfg.Rate < 0 || math.IsNaN(cfg.Rate) || cfg.Burst < 0 {
		return c, fmt.Errorf("flow events: rate %v and burst %d must not be negative", cfg.Rate, cfg.Burst)
	}
	if cfg.Rate > 0 {
		c.IntervalNs = uint64(math.Max(1, float64(time.Second)/cfg.Rate))
		c.BurstNs = uint64(max(cfg.Burst, 1)-1) * c.IntervalNs
	}
	return c, nil
}

// SetFlowEvents changes what the programs report, at once (one map element).
func (e *EBPF) SetFlowEvents(cfg FlowEventConfig) error {
	c, err := eventConfig(cfg)
	if err != nil {
		return err
	}
	if err := e.objs.NpaEventConfig.Put(uint32(0), &c); err != nil {
		return fmt.Errorf("set flow events: %w", err)
	}
	return nil
}

// OpenFlowEvents implements FlowEventSource.
func (e *EBPF) OpenFlowEvents(cfg FlowEventConfig) (*FlowEventReader, error) {
	if e.closed.Load() {
		return nil, errors.New("open flow events: dataplane closed")
	}
	rd, err := ringbuf.NewReader(e.objs.NpaEvents)
	if err != nil {
		return nil, fmt.Errorf("open flow events: %w", err)
	}
	if err := e.SetFlowEvents(cfg); err != nil {
		_ = rd.Close()
		return nil, err
	}
	return &FlowEventReader{rd: rd, boot: monotonicBoot()}, nil
}

// monotonicBoot is the wall-clock time of CLOCK_MONOTONIC's zero (bpf_ktime_get_ns).
func monotonicBoot() time.Time {
	var ts unix.Timespec
	now := time.Now()
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return now
	}
	return now.Add(-time.Duration(ts.Nano()))
}

// Read waits for the next event and decodes it into ev.
func (r *FlowEventReader) Read(ev *FlowEvent) error {
	for {
		if err := r.rd.ReadInto(&r.rec); err != nil {
			if errors.Is(err, ringbuf.ErrClosed) {
				return ErrFlowEventsClosed
			}
			return fmt.Errorf("read flow event: %w", err)
		}
		if len(r.rec.RawSample) >= flowEventSize {
			decodeFlowEvent(r.rec.RawSample, r.boot, ev)
			return nil
		}
	}
}

// Close stops the reader; a blocked Read returns ErrFlowEventsClosed.
func (r *FlowEventReader) Close() error { return r.rd.Close() }

// decodeFlowEvent reads struct flow_event (little endian: the package builds for
// amd64 and arm64 only).
func decodeFlowEvent(b []byte, boot time.Time, ev *FlowEvent) {
	le := func(i, n int) uint64 {
		var v uint64
		for j := n - 1; j >= 0; j-- {
			v = v<<8 | uint64(b[i+j])
		}
		return v
	}
	reason := b[27]
	*ev = FlowEvent{
		Time:      boot.Add(time.Duration(le(0, 8))),
		Ifindex:   int(le(8, 4)),
		gen:       uint32(le(12, 4)),
		Length:    uint32(le(16, 4)),
		rule:      uint16(le(20, 2)),
		SrcPort:   uint16(le(22, 2)),
		DstPort:   uint16(le(24, 2)),
		Direction: Direction(b[26] & 1),
		Reason:    VerdictReason(reason &^ reasonAudited),
		Audited:   reason&reasonAudited != 0,
		Kind:      FlowEventKind(b[28]),
		Protocol:  b[30],
	}
	switch b[29] {
	case 4:
		ev.Src = netip.AddrFrom4([4]byte(b[32:36]))
		ev.Dst = netip.AddrFrom4([4]byte(b[48:52]))
	case 6:
		ev.Src = netip.AddrFrom16([16]byte(b[32:48]))
		ev.Dst = netip.AddrFrom16([16]byte(b[48:64]))
	}
	if !has16BitPorts(ev.Protocol) {
		// ICMP echo: the identifier sits in the request's sport, the reply's dport.
		if ev.Protocol == 1 || ev.Protocol == 58 {
			ev.ICMPID = ev.SrcPort | ev.DstPort
		}
		ev.SrcPort, ev.DstPort = 0, 0
	}
}

// has16BitPorts: the protocols whose ports the program reads (has_ports in policy.c).
func has16BitPorts(p uint8) bool {
	return p == uint8(unix.IPPROTO_TCP) || p == uint8(unix.IPPROTO_UDP) || p == uint8(unix.IPPROTO_SCTP)
}

// FlowEventsSuppressed implements FlowEventSource.
func (e *EBPF) FlowEventsSuppressed() (FlowSuppressed, error) {
	var out FlowSuppressed
	if e.closed.Load() {
		return out, errors.New("read suppressed flow events: dataplane closed")
	}
	var vals []uint64
	for i, dst := range []*uint64{&out.RateLimited, &out.BufferFull} {
		if err := e.objs.NpaEventsSuppressed.Lookup(uint32(i), &vals); err != nil {
			return out, fmt.Errorf("read suppressed flow events: %w", err)
		}
		for _, v := range vals {
			*dst += v
		}
	}
	return out, nil
}

// AttributeFlow implements FlowEventSource: the verdict counters' attribution for
// the commit that judged the packet.
func (e *EBPF) AttributeFlow(ev *FlowEvent) FlowAttribution {
	reason := uint8(ev.Reason)
	if ev.Audited {
		reason |= reasonAudited
	}
	k := policyVerdictKey{Ifindex: uint32(ev.Ifindex), Gen: ev.gen, Rule: ev.rule, Dir: uint8(ev.Direction), Reason: reason}
	e.mu.Lock()
	vc, _ := e.resolve(&k)
	e.mu.Unlock()
	return FlowAttribution{Rule: vc.Rule, Sources: vc.Sources, Attributed: vc.Attributed}
}

// flowEventMapSizes sizes the event maps: the buckets by pods, the ring buffer as
// asked (a power of two, at least a page). Only the programs touch a bucket (under
// its spin lock); one written from here would need ebpf.UpdateLock.
func flowEventMapSizes(spec *ebpf.CollectionSpec, pods, buffer int) error {
	if buffer <= 0 {
		buffer = DefaultFlowEventBuffer
	}
	page := unix.Getpagesize()
	if buffer < page || buffer&(buffer-1) != 0 {
		return fmt.Errorf("flow event buffer %d bytes: want a power of two of at least %d (the page size)", buffer, page)
	}
	spec.Maps[policyMapNpaEventBuckets].MaxEntries = uint32(pods)
	spec.Maps[policyMapNpaEvents].MaxEntries = uint32(buffer)
	return nil
}
