package reconcile

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/translate"
)

// Flow events: the dataplane's raw events (bpfmaps.FlowEvent), read from its ring
// buffer by one goroutine into a bounded queue (full: dropped and counted, so a
// slow sink never holds the ring buffer's reader), named by another (the pod, the
// deciding object and rule, the object's version in force and its trigger time)
// and handed to the sinks (telemetry's log records, the JSON file).

// DefaultFlowQueue is FlowOptions.QueueSize's default.
const DefaultFlowQueue = 4096

// FlowOptions configures StartFlows.
type FlowOptions struct {
	Events bpfmaps.FlowEventConfig // what the datapath reports, and its per-pod rate limit
	Node   string                  // this node's name, on every event
	// QueueSize bounds the events read and not yet named. Default DefaultFlowQueue.
	QueueSize int
	Sinks     []report.FlowSink
}

// Flows is a running flow event pipeline.
type Flows struct {
	c     *Controller
	src   bpfmaps.FlowEventSource
	rd    *bpfmaps.FlowEventReader
	opts  FlowOptions
	queue chan bpfmaps.FlowEvent
	wg    sync.WaitGroup

	emitted, queueFull atomic.Uint64

	// pods caches VerdictPods, refreshed on a miss (at most every
	// podRefreshMiss) and every podRefresh: events name pods at their rate, not
	// at the pod table's lock.
	pods     map[int]VerdictPod
	podsRead time.Time
}

const (
	podRefresh     = 10 * time.Second
	podRefreshMiss = 200 * time.Millisecond
)

// StartFlows sets what the datapath reports and starts reading its events, until
// ctx is done (Wait returns then). Its counters are Counts.
func (c *Controller) StartFlows(ctx context.Context, src bpfmaps.FlowEventSource, opts FlowOptions) (*Flows, error) {
	if opts.QueueSize <= 0 {
		opts.QueueSize = DefaultFlowQueue
	}
	rd, err := src.OpenFlowEvents(opts.Events)
	if err != nil {
		return nil, err
	}
	// The read model first: explain pod shows a pod's recent denials.
	opts.Sinks = append([]report.FlowSink{&c.recentFlows}, opts.Sinks...)
	f := &Flows{c: c, src: src, rd: rd, opts: opts, queue: make(chan bpfmaps.FlowEvent, opts.QueueSize)}
	f.wg.Add(3)
	go func() {
		defer f.wg.Done()
		<-ctx.Done()
		_ = rd.Close()
	}()
	go func() {
		defer f.wg.Done()
		defer close(f.queue)
		f.read()
	}()
	go func() {
		defer f.wg.Done()
		var out report.FlowEvent
		for ev := range f.queue {
			f.name(&ev, &out)
			for _, s := range f.opts.Sinks {
				s.Flow(&out)
			}
			f.emitted.Add(1)
		}
	}()
	return f, nil
}

// read moves events from the ring buffer into the queue, dropping (and counting)
// those that find it full.
func (f *Flows) read() {
	var ev bpfmaps.FlowEvent
	for {
		if err := f.rd.Read(&ev); err != nil {
			if !errors.Is(err, bpfmaps.ErrFlowEventsClosed) {
				f.c.log.Error("flow events: read failed; no more flow events until the agent restarts", "err", err)
			}
			return
		}
		select {
		case f.queue <- ev:
		default:
			f.queueFull.Add(1)
		}
	}
}

// Wait waits until the pipeline stopped (its context done) and the events queued
// were handed to the sinks.
func (f *Flows) Wait() { f.wg.Wait() }

// Counts copies the pipeline's counters and the datapath's suppressed events.
func (f *Flows) Counts(dst *report.FlowCounts) {
	dst.Emitted = f.emitted.Load()
	dst.QueueFull = f.queueFull.Load()
	if s, err := f.src.FlowEventsSuppressed(); err == nil {
		dst.RateLimited, dst.BufferFull = s.RateLimited, s.BufferFull
	}
}

// pod names the pod on an interface, from the cache.
func (f *Flows) pod(ifindex int) (VerdictPod, bool) {
	age := time.Since(f.podsRead)
	p, ok := f.pods[ifindex]
	if age > podRefresh || (!ok && age > podRefreshMiss) {
		f.pods, f.podsRead = f.c.VerdictPods(), time.Now()
		p, ok = f.pods[ifindex]
	}
	return p, ok
}

// name turns a raw event into the hand-over's.
func (f *Flows) name(ev *bpfmaps.FlowEvent, out *report.FlowEvent) {
	*out = report.FlowEvent{
		Time: ev.Time, Node: f.opts.Node, Kind: ev.Kind.String(), Direction: ev.Direction.String(), Reason: ev.Reason.String(),
		Src: ev.Src, Dst: ev.Dst, SrcPort: ev.SrcPort, DstPort: ev.DstPort, Protocol: ev.Protocol, ICMPID: ev.ICMPID,
		Length: ev.Length, RuleIndex: -1,
	}
	switch {
	case ev.Kind == bpfmaps.FlowNew:
		out.Verdict = "allow"
	case ev.Audited:
		out.Verdict = "would_deny"
	default:
		out.Verdict = "deny"
	}
	if p, ok := f.pod(ev.Ifindex); ok {
		out.Namespace, out.Pod, out.PodIP = p.Namespace, p.Name, p.IP
	}
	a := f.src.AttributeFlow(ev)
	out.Attributed = a.Attributed
	var decided bpfmaps.Origin
	switch {
	case a.Rule != (bpfmaps.Origin{}):
		decided = a.Rule
		out.RuleIndex = a.Rule.Index
		out.Policies = []string{originName(a.Rule)}
		out.Tier = "admin"
		if ev.Reason == bpfmaps.ReasonBaselineAccept || ev.Reason == bpfmaps.ReasonBaselineDeny {
			out.Tier = "baseline"
		}
	case len(a.Sources) > 0:
		srcs := slices.SortedFunc(slices.Values(a.Sources), func(x, y bpfmaps.Origin) int {
			if n := cmp.Compare(originName(x), originName(y)); n != 0 {
				return n
			}
			return cmp.Compare(x.Name, y.Name)
		})
		decided = srcs[0]
		for _, s := range srcs {
			out.Policies = append(out.Policies, originName(s))
		}
		out.Policies = slices.Compact(out.Policies)
		out.Tier = "namespaced"
	default:
		return
	}
	out.PolicyKind, out.PolicyNamespace, out.PolicyName, out.PolicyUID = decided.Kind, decided.Namespace, originName(decided), decided.UID
	out.ResourceVersion, out.TriggerTime = f.c.inForce(decided)
}

// originName is the name an operator knows: the policy an object is a chunk of,
// else the object's own (as the verdict counters name it).
func originName(o bpfmaps.Origin) string {
	if o.Policy != "" {
		return o.Policy
	}
	return o.Name
}

// inForce is the resourceVersion of the object's version committed on this node
// (its last valid one), and that version's trigger time when the loop still holds
// it; empty when the object is gone or was recreated.
func (c *Controller) inForce(o bpfmaps.Origin) (string, time.Time) {
	kind, ok := parseKind(o.Kind)
	if !ok {
		return "", time.Time{}
	}
	uid := types.UID(o.UID)
	rv := c.pods.inForce(translate.Key{Kind: kind, Namespace: o.Namespace, Name: o.Name}, uid)
	if rv == "" {
		return "", time.Time{}
	}
	return rv, c.versions.triggerOf(uid, rv)
}

func parseKind(s string) (report.Kind, bool) {
	for k := range report.NumKinds {
		if report.Kind(k).String() == s {
			return report.Kind(k), true
		}
	}
	return 0, false
}

// inForce is the resourceVersion of the object's last valid version, "" when the
// key holds no valid version of uid.
func (t *podTable) inForce(key translate.Key, uid types.UID) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if st := t.objects[key]; st != nil && st.uid == uid && st.compiled != nil {
		return st.compiled.ResourceVersion
	}
	return ""
}

// triggerOf is the trigger time of the uid's version rv, zero when the table no
// longer holds that version (a newer one arrived) or it had none.
func (t *versionTable) triggerOf(uid types.UID, rv string) time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.byUID[uid]; e != nil && e.v.resourceVersion == rv {
		return e.v.trigger
	}
	return time.Time{}
}
