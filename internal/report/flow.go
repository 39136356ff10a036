package report

import (
	"net/netip"
	"strconv"
	"time"
)

// FlowEvent is one flow event of the dataplane (a denied packet, or a newly
// tracked allowed flow), named by the reconcile loop: the pod, the object and rule
// that decided, and the version of that object in force. Telemetry turns it into
// an OpenTelemetry log record and, optionally, a JSON line.
type FlowEvent struct {
	Time      time.Time // when the datapath judged the packet
	Node      string    // this node's name
	Kind      string    // "deny" or "new_flow"
	Verdict   string    // "deny", "would_deny" (audit mode: it passed) or "allow"
	Direction string    // "ingress" or "egress", the pod's
	Reason    string    // what decided, as the verdict counters name it

	Namespace, Pod string     // the pod's, empty when unknown
	PodIP          netip.Addr // invalid when unknown

	// The packet: addresses (invalid for a packet that is not IP), ports (0 for
	// protocols without ports), IP protocol number, ICMP echo identifier, length.
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
	Protocol         uint8
	ICMPID           uint16
	Length           uint32

	// What decided: the deciding object (several isolating objects in the
	// namespaced tier: the first, with Policies naming them all), its tier
	// ("namespaced", "admin" or "baseline"), the rule's index in the object (-1
	// when no single rule decided), and the object's version in force when the
	// event was named (its resourceVersion and trigger time). Empty when nothing
	// is known (no policy, or a commit this process no longer knows: Attributed
	// false).
	PolicyKind, PolicyNamespace, PolicyName, PolicyUID string
	Policies                                           []string // every deciding object's name (the policy's when a chunk), sorted
	Tier                                               string
	RuleIndex                                          int
	ResourceVersion                                    string
	TriggerTime                                        time.Time
	Attributed                                         bool
}

// FlowSink receives named flow events, one at a time, from one goroutine. It must
// not block: a sink that cannot keep up drops and counts.
type FlowSink interface {
	Flow(ev *FlowEvent)
}

// FlowCounts are the flow events' counters, as their owners keep them.
type FlowCounts struct {
	Emitted     uint64 // named and handed to the sinks
	RateLimited uint64 // suppressed in the datapath by a pod's rate limit
	BufferFull  uint64 // suppressed in the datapath: the ring buffer was full
	QueueFull   uint64 // read from the ring buffer, dropped: the naming queue was full
}

// ProtocolName names an IP protocol number as network.transport does (tcp, udp),
// the others by their common lower-case names, or by the number.
func ProtocolName(p uint8) string {
	switch p {
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 132:
		return "sctp"
	case 1:
		return "icmp"
	case 58:
		return "icmpv6"
	}
	return strconv.Itoa(int(p))
}
