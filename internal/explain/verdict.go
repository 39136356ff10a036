package explain

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// `npagent explain verdict`: would a packet from one end to the other be allowed,
// and what decides it. The agent resolves each end to an address and, for a pod on
// this node, to its interface (the read model); the answer itself is read from the
// dataplane's maps (cmd/npagent asks the dataplane), not recomputed from objects.

// VerdictSource is a Source that also judges packets (GET /v1/verdict); a Source
// without it answers that path 400.
type VerdictSource interface {
	ExplainVerdict(q VerdictQuery) (VerdictExplain, error)
}

// VerdictQuery is the packet to judge: the first packet of a new flow from From to
// To with Protocol and destination Port.
type VerdictQuery struct {
	From, To PodQuery
	// Protocol is "tcp", "udp", "sctp" or "icmp" (ICMPv6 for IPv6 ends); Port is
	// the destination port, 0 for icmp.
	Protocol string
	Port     uint16
}

// ParseEnd parses an end of a verdict query: pod/<namespace>/<name> or an IP.
func ParseEnd(s string) (PodQuery, error) {
	if ns, name, ok := strings.Cut(strings.TrimPrefix(s, "pod/"), "/"); ok && strings.HasPrefix(s, "pod/") && ns != "" && name != "" && !strings.Contains(name, "/") {
		return PodQuery{Namespace: ns, Name: name}, nil
	}
	if ip, err := netip.ParseAddr(s); err == nil {
		return PodQuery{IP: ip.Unmap()}, nil
	}
	return PodQuery{}, fmt.Errorf("%q: want pod/<namespace>/<name> or an IP address", s)
}

// endString is ParseEnd's inverse.
func endString(q PodQuery) string {
	if q.IP.IsValid() {
		return q.IP.String()
	}
	return "pod/" + q.Namespace + "/" + q.Name
}

// ParsePort parses <port>/<protocol> (8080/tcp, 53/udp, 9/sctp) or icmp.
func ParsePort(s string) (proto string, port uint16, err error) {
	if strings.EqualFold(s, "icmp") || strings.EqualFold(s, "icmpv6") {
		return "icmp", 0, nil
	}
	n, p, ok := strings.Cut(s, "/")
	p = strings.ToLower(p)
	v, perr := strconv.ParseUint(n, 10, 16)
	if !ok || perr != nil || v == 0 || (p != "tcp" && p != "udp" && p != "sctp") {
		return "", 0, fmt.Errorf("%q: want <port>/<tcp|udp|sctp> (port 1-65535) or icmp", s)
	}
	return p, uint16(v), nil
}

// Path is the query's debug API path.
func (q VerdictQuery) Path() string {
	port := q.Protocol
	if q.Protocol != "icmp" {
		port = strconv.Itoa(int(q.Port)) + "/" + q.Protocol
	}
	v := url.Values{"from": {endString(q.From)}, "to": {endString(q.To)}, "port": {port}}
	return "/v1/verdict?" + v.Encode()
}

// parseVerdictQuery is Path's inverse.
func parseVerdictQuery(v url.Values) (VerdictQuery, error) {
	var q VerdictQuery
	var errs []error
	var err error
	if q.From, err = ParseEnd(v.Get("from")); err != nil {
		errs = append(errs, fmt.Errorf("from: %w", err))
	}
	if q.To, err = ParseEnd(v.Get("to")); err != nil {
		errs = append(errs, fmt.Errorf("to: %w", err))
	}
	if q.Protocol, q.Port, err = ParsePort(v.Get("port")); err != nil {
		errs = append(errs, fmt.Errorf("port: %w", err))
	}
	return q, errors.Join(errs...)
}

// Verdicts of a VerdictExplain and its checks.
const (
	VerdictAllow     = "allow"
	VerdictDeny      = "deny"
	VerdictWouldDeny = "would_deny" // denied by the policy, passes in audit mode
	// VerdictNotJudged: neither end is a pod whose programs run on this node.
	VerdictNotJudged = "not_judged_here"
)

// VerdictExplain is the answer to a VerdictQuery.
type VerdictExplain struct {
	Node     string     `json:"node"`
	At       time.Time  `json:"at"`
	From     VerdictEnd `json:"from"`
	To       VerdictEnd `json:"to"`
	Protocol string     `json:"protocol"` // TCP, UDP, SCTP, ICMP, ICMPv6
	Port     uint16     `json:"port,omitempty"`
	// Verdict is the packet's fate on this node: deny if a check drops it,
	// would_deny if a check would (audit mode), allow if every check passes it,
	// not_judged_here without checks.
	Verdict string `json:"verdict"`
	// Checks are this node's programs on the packet's path, in order: the
	// sender's egress, then the receiver's ingress.
	Checks []VerdictCheck `json:"checks"`
	// Notes say what is not judged here (an end on another node, outside the
	// cluster) and what the answer assumes.
	Notes []string `json:"notes,omitempty"`
}

// VerdictEnd is one end of the packet as the agent resolved it.
type VerdictEnd struct {
	Query     string `json:"query"`
	IP        string `json:"ip"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name,omitempty"`
	// Pod: the read model knows a pod with this address (an object lists it, or
	// strict mode holds it); HostIP is the node the objects place it on; Local:
	// on this node.
	Pod    bool   `json:"pod"`
	HostIP string `json:"hostIP,omitempty"`
	Local  bool   `json:"local"`
	// Ifindex is the interface holding its committed state here; 0 if none.
	Ifindex int `json:"ifindex,omitempty"`
}

// VerdictCheck is what one program on the path decides, read from the maps.
type VerdictCheck struct {
	Direction string `json:"direction"` // egress (the sender's), ingress (the receiver's)
	Pod       string `json:"pod"`       // namespace/name, or the IP
	Ifindex   int    `json:"ifindex"`
	// Managed: the interface holds state (else its packets pass unjudged).
	Managed bool   `json:"managed"`
	Verdict string `json:"verdict"` // allow, deny, would_deny
	// Reason is the verdict counter's reason the packet would move (see
	// npagent.policy.verdicts); PolicyReason what the policy alone decided when
	// the packet passes for another reason (node traffic).
	Reason       string `json:"reason"`
	PolicyReason string `json:"policyReason,omitempty"`
	// The direction's state word: its generation (the commit in force) and flags.
	Generation uint32 `json:"generation,omitempty"`
	Isolated   bool   `json:"isolated,omitempty"`
	Admin      bool   `json:"admin,omitempty"`
	Baseline   bool   `json:"baseline,omitempty"`
	// Objects decided: the admin or baseline rule's object (Rule its index), or
	// the namespaced objects that isolate the direction (Rule -1: their allow
	// rules are merged into the entries, so the entry names no single rule).
	Objects []VerdictObject `json:"objects,omitempty"`
	// Match is the port rule of the entry that decided ("TCP 8000-8080", "any").
	Match string `json:"match,omitempty"`
	// Attributed is false when the commit in force is not known to this agent
	// process (adopted at start, not committed since): Objects are unknown.
	Attributed bool `json:"attributed"`
	// Why says it in one sentence.
	Why string `json:"why"`
}

// VerdictObject is an object that decided, and its rule.
type VerdictObject struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	UID       string `json:"uid,omitempty"`
	Policy    string `json:"policy,omitempty"` // the policy it is a chunk of
	Rule      int    `json:"rule"`             // the rule's index in its direction; -1 none
}
