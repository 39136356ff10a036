package translate

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/report"
)

// FieldError rejects an object for bad input in one field. Path names the exact element
// ("spec.ingress[2].except[0]"); Field is the same path without indexes
// ("spec.ingress.except"), bounded in cardinality, for the invalid-object counter.
type FieldError struct {
	Path  string
	Field string
	Value string
	Msg   string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("%s %q: %s", e.Path, e.Value, e.Msg)
}

// fieldPath builds a FieldError's two paths together, so they never disagree.
type fieldPath struct{ path, field string }

func root(name string) fieldPath { return fieldPath{name, name} }

func (p fieldPath) child(name string) fieldPath {
	return fieldPath{p.path + "." + name, p.field + "." + name}
}

func (p fieldPath) index(i int) fieldPath {
	return fieldPath{p.path + "[" + strconv.Itoa(i) + "]", p.field}
}

func (p fieldPath) errorf(value, format string, args ...any) *FieldError {
	return &FieldError{Path: p.path, Field: p.field, Value: value, Msg: fmt.Sprintf(format, args...)}
}

// Compiled is one valid PolicyEndpoint or ClusterPolicyEndpoint version turned into
// dataplane rules, plus the local pods it selects. It is immutable once built (but
// for BuildSets, before it is shared): callers share it between merges (a version
// kept without its rules, see NodeLocal, fills them in once, behind its own lock).
type Compiled struct {
	Key             Key
	UID             types.UID
	ResourceVersion string
	Pods            []netip.Addr // local pods (hostIP == node IP), sorted, no duplicates
	// PodNames names the local pods as the object's endpoints do, for telemetry
	// (the verdict counters' k8s.pod.name).
	PodNames map[netip.Addr]PodName
	// Policy is the policy the object is a chunk of (spec.policyRef): the controller
	// splits one policy into several objects, and a pod any of them selects gets the
	// rules of all of them. Zero when policyRef has no name: the object stands alone.
	Policy PolicyKey

	// PolicyEndpoint: the directions it isolates and its allow rules for them.
	Isolated [2]bool
	Allow    [2][]bpfmaps.Rule
	// sets are allow as dataplane rule sets (BuildSets), validated and hashed before
	// the table's lock is taken; nil: merged as plain rules.
	Sets [2]*bpfmaps.RuleSet

	// ClusterPolicyEndpoint: its tier and rules, in spec order, priority applied.
	Tier      v1alpha1.ClusterPolicyTier
	TierRules [2][]bpfmaps.TierRule

	// DomainRulesDropped counts the domainName rules left out under
	// Options.DropDomainAllowRules, for the caller to log and count.
	DomainRulesDropped int

	// deferred is set on a version kept without its rules (no local pods, see
	// NodeLocal); merges read them through Rules.
	deferred *deferredRules
}

// PolicyKey names the policy an object is a chunk of: a NetworkPolicy (namespaced, for
// PolicyEndpoints: a PolicyEndpoint serves a policy of its own namespace) or a cluster
// policy.
type PolicyKey struct {
	Kind            report.Kind
	Namespace, Name string
}

// PolicyOf is the PolicyKey of an object's policyRef; zero when the name is empty.
func PolicyOf(kind report.Kind, namespace, name string) PolicyKey {
	if name == "" {
		return PolicyKey{}
	}
	return PolicyKey{Kind: kind, Namespace: namespace, Name: name}
}

// Options changes how objects compile. The zero value is the default: strict.
//
// A rule with a domainName (an FQDN peer; the controller writes it with no cidr) cannot
// be enforced from the object alone: the addresses behind the name are not in it. By
// default such a rule rejects its object like any invalid input (a FieldError at
// spec.<direction>.domainName, counted by field), so a policy is never programmed with
// part of it silently missing.
type Options struct {
	// DropDomainAllowRules leaves out, instead of rejecting the object, the domainName
	// rules whose absence can only narrow what the policy allows: PolicyEndpoint rules
	// (they only allow) and ClusterPolicyEndpoint Accept rules. Traffic to those names
	// is then decided by the object's other rules and the rest of the policy — denied
	// where the direction is isolated. domainName rules with Deny or Pass still reject
	// the object: leaving them out would widen it. Default false.
	DropDomainAllowRules bool
	// MaxEntriesPerObject bounds the map entries one object may need: its CIDRs and
	// except blocks, both directions (each local pod it selects holds them once). An
	// object above it is rejected as bad input, as a FieldError naming the count: it
	// would take the shared tries from every other pod, and one above half a trie
	// could never be updated (a commit holds two entry sets). Default
	// DefaultMaxEntriesPerObject.
	MaxEntriesPerObject int
	// MapEntriesV4 and MapEntriesV6 are the dataplane's tries per direction
	// (--max-entries-ipv4/-ipv6; 0: bpfmaps' defaults). Whatever the budget, an
	// object may need at most half of one, in one direction and family: a commit
	// holds the old and the new entry set at once, so more could never be updated.
	MapEntriesV4, MapEntriesV6 int
}

// DefaultMaxEntriesPerObject is Options.MaxEntriesPerObject's default: a
// quarter of a default IPv4 trie (65,536 entries per direction, shared by all pods).
const DefaultMaxEntriesPerObject = 16384

// checkEntries rejects c when it needs more map entries than the budget.
func (o Options) checkEntries(c *Compiled) error {
	limit := o.MaxEntriesPerObject
	if limit <= 0 {
		limit = DefaultMaxEntriesPerObject
	}
	n := 0
	for d := range c.Allow {
		for i := range c.Allow[d] {
			n += 1 + len(c.Allow[d][i].Except)
		}
		for i := range c.TierRules[d] {
			n += 1 + len(c.TierRules[d][i].Rule.Except)
		}
	}
	if n > limit {
		return root("spec").errorf(strconv.Itoa(n), "needs %d map entries (CIDRs and except blocks), more than the %d an object may need (--max-entries-per-object)", n, limit)
	}
	tries := [2]struct {
		size int
		name string
	}{{cmp.Or(o.MapEntriesV4, bpfmaps.DefaultEntriesV4), "ipv4"}, {cmp.Or(o.MapEntriesV6, bpfmaps.DefaultEntriesV6), "ipv6"}}
	for d := range c.Allow {
		var perFamily [2]int // ipv4, ipv6
		count := func(r *bpfmaps.Rule) {
			f := 0
			if r.CIDR.Addr().Is6() {
				f = 1
			}
			perFamily[f] += 1 + len(r.Except)
		}
		for i := range c.Allow[d] {
			count(&c.Allow[d][i])
		}
		for i := range c.TierRules[d] {
			count(&c.TierRules[d][i].Rule)
		}
		for f, tr := range tries {
			if half := tr.size / 2; perFamily[f] > half {
				p := root("spec").child(directionField[d])
				return p.errorf(strconv.Itoa(perFamily[f]), "needs %d %s map entries in one direction, more than half the %s trie (%d of %d, --max-entries-%s): a commit holds two entry sets, so it could never be updated",
					perFamily[f], tr.name, tr.name, half, tr.size, tr.name)
			}
		}
	}
	return nil
}

// PolicyEndpoint validates pe and converts it. Defaults follow NetworkPolicy: a port
// without protocol is TCP, a rule without ports allows every port, and an empty
// podIsolation means Ingress (plus Egress when there are egress rules), which is what
// policyTypes defaults to.
//
// The controller writes pod peers as bare addresses (a /32 or /128) and "allow all" as
// the two rules 0.0.0.0/0 and ::/0. It splits a large policy into several objects:
// one with rules and no podSelectorEndpoints compiles to an object with no local pods,
// which by itself programs nothing.
func (o Options) PolicyEndpoint(pe *v1alpha1.PolicyEndpoint, nodeIP netip.Addr) (*Compiled, error) {
	spec := root("spec")
	c := &Compiled{
		Key:             Key{Kind: report.KindPolicyEndpoint, Namespace: pe.Namespace, Name: pe.Name},
		UID:             pe.UID,
		ResourceVersion: pe.ResourceVersion,
		Policy:          PolicyOf(report.KindPolicyEndpoint, pe.Namespace, pe.Spec.PolicyRef.Name),
	}
	var err error
	if c.Pods, c.PodNames, err = localPods(pe.Spec.PodSelectorEndpoints, nodeIP, spec.child("podSelectorEndpoints")); err != nil {
		return nil, err
	}
	// A namespaced policy selects pods of its own namespace only: an endpoint of
	// another would let whoever writes PolicyEndpoints in one namespace isolate (or,
	// with a later delete, open) pods of another.
	for i := range pe.Spec.PodSelectorEndpoints {
		if ns := pe.Spec.PodSelectorEndpoints[i].Namespace; ns != pe.Namespace {
			return nil, spec.child("podSelectorEndpoints").index(i).child("namespace").errorf(ns, "not the object's namespace %q", pe.Namespace)
		}
	}
	if len(pe.Spec.PodIsolation) == 0 {
		c.Isolated[bpfmaps.Ingress] = true
		c.Isolated[bpfmaps.Egress] = len(pe.Spec.Egress) > 0
	}
	for i, t := range pe.Spec.PodIsolation {
		switch t {
		case networkingv1.PolicyTypeIngress:
			c.Isolated[bpfmaps.Ingress] = true
		case networkingv1.PolicyTypeEgress:
			c.Isolated[bpfmaps.Egress] = true
		default:
			return nil, spec.child("podIsolation").index(i).errorf(string(t), "want Ingress or Egress")
		}
	}
	for d, rules := range [2][]v1alpha1.EndpointInfo{pe.Spec.Ingress, pe.Spec.Egress} {
		p := spec.child(directionField[d])
		for i := range rules {
			if rules[i].DomainName != "" {
				if err := o.domainRule(rules[i].CIDR, rules[i].DomainName, true, p.index(i)); err != nil {
					return nil, err
				}
				c.DomainRulesDropped++
				continue
			}
			r, err := convertRule(rules[i].CIDR, rules[i].Except, rules[i].Ports, p.index(i))
			if err != nil {
				return nil, err
			}
			// Rules of a direction the object does not isolate are not part of the policy,
			// as NetworkPolicy ignores egress rules without the Egress policy type.
			if c.Isolated[d] {
				c.Allow[d] = append(c.Allow[d], r)
			}
		}
	}
	if err := o.checkEntries(c); err != nil {
		return nil, err
	}
	return c, nil
}

var directionField = [2]string{bpfmaps.Ingress: "ingress", bpfmaps.Egress: "egress"}

// ClusterPolicyEndpoint validates cpe and converts it: every rule becomes a TierRule
// with the object's priority, in spec order. The subject is not read: the controller
// resolves it into podSelectorEndpoints, and those decide the local pods.
func (o Options) ClusterPolicyEndpoint(cpe *v1alpha1.ClusterPolicyEndpoint, nodeIP netip.Addr) (*Compiled, error) {
	spec := root("spec")
	c := &Compiled{
		Key:             Key{Kind: report.KindClusterPolicyEndpoint, Name: cpe.Name},
		UID:             cpe.UID,
		ResourceVersion: cpe.ResourceVersion,
		Policy:          PolicyOf(report.KindClusterPolicyEndpoint, "", cpe.Spec.PolicyRef.Name),
		Tier:            cpe.Spec.Tier,
	}
	if c.Tier != v1alpha1.TierAdmin && c.Tier != v1alpha1.TierBaseline {
		return nil, spec.child("tier").errorf(string(c.Tier), "want Admin or Baseline")
	}
	var err error
	if c.Pods, c.PodNames, err = localPods(cpe.Spec.PodSelectorEndpoints, nodeIP, spec.child("podSelectorEndpoints")); err != nil {
		return nil, err
	}
	for d, rules := range [2][]v1alpha1.ClusterEndpointInfo{cpe.Spec.Ingress, cpe.Spec.Egress} {
		p := spec.child(directionField[d])
		for i := range rules {
			action, ok := actions[rules[i].Action]
			if !ok {
				return nil, p.index(i).child("action").errorf(string(rules[i].Action), "want Accept, Deny or Pass")
			}
			if rules[i].DomainName != "" {
				if err := o.domainRule(rules[i].CIDR, rules[i].DomainName, action == bpfmaps.ActionAccept, p.index(i)); err != nil {
					return nil, err
				}
				c.DomainRulesDropped++
				continue
			}
			r, err := convertRule(rules[i].CIDR, nil, rules[i].Ports, p.index(i))
			if err != nil {
				return nil, err
			}
			c.TierRules[d] = append(c.TierRules[d], bpfmaps.TierRule{Priority: cpe.Spec.Priority, Action: action, Rule: r, Origin: c.origin(i)})
		}
	}
	if err := o.checkEntries(c); err != nil {
		return nil, err
	}
	return c, nil
}

var actions = map[v1alpha1.ClusterRuleAction]bpfmaps.Action{
	v1alpha1.ClusterRuleActionAccept: bpfmaps.ActionAccept,
	v1alpha1.ClusterRuleActionDeny:   bpfmaps.ActionDeny,
	v1alpha1.ClusterRuleActionPass:   bpfmaps.ActionPass,
}

// domainRule decides about a rule with a domainName: an error rejecting the object, or
// nil when the rule is to be left out (DropDomainAllowRules, and leaving it out can only
// narrow: allowOnly).
func (o Options) domainRule(cidr v1alpha1.NetworkAddress, name v1alpha1.DomainName, allowOnly bool, p fieldPath) error {
	switch {
	case cidr != "":
		return p.child("domainName").errorf(string(name), "set together with cidr %q: want one of them", cidr)
	case o.DropDomainAllowRules && allowOnly:
		return nil
	case o.DropDomainAllowRules:
		return p.child("domainName").errorf(string(name), "an FQDN rule that denies or passes cannot be enforced from the object alone, and leaving it out would widen the policy")
	}
	return p.child("domainName").errorf(string(name), "an FQDN rule cannot be enforced from the object alone (no addresses)")
}

// PodName is a pod's namespace and name as an object's endpoint gives them.
type PodName struct{ Namespace, Name string }

// localPods returns the IPs of the pods running on this node (hostIP == nodeIP), sorted
// and without duplicates, and their names (nil when none). Every endpoint is
// validated, local or not: the object is the same on every node, so every agent
// rejects it alike.
func localPods(eps []v1alpha1.PodEndpoint, nodeIP netip.Addr, p fieldPath) ([]netip.Addr, map[netip.Addr]PodName, error) {
	var pods []netip.Addr
	var names map[netip.Addr]PodName
	for i := range eps {
		host, err := netip.ParseAddr(string(eps[i].HostIP))
		if err != nil || host.Zone() != "" {
			return nil, nil, p.index(i).child("hostIP").errorf(string(eps[i].HostIP), "not an IP address")
		}
		pod, err := netip.ParseAddr(string(eps[i].PodIP))
		if err != nil || pod.Zone() != "" {
			return nil, nil, p.index(i).child("podIP").errorf(string(eps[i].PodIP), "not an IP address")
		}
		if host.Unmap() == nodeIP {
			pods = append(pods, pod.Unmap())
			if eps[i].Name != "" {
				if names == nil {
					names = map[netip.Addr]PodName{}
				}
				names[pod.Unmap()] = PodName{Namespace: eps[i].Namespace, Name: eps[i].Name}
			}
		}
	}
	slices.SortFunc(pods, netip.Addr.Compare)
	return slices.Compact(pods), names, nil
}

// Rejected is what can be read of a version that did not compile, for its pods: they
// keep the enforcement they had (internal/reconcile: podTable.commitVersion), and when
// the object has no valid version, those of a PolicyEndpoint are isolated.
type Rejected struct {
	// named are the local pods it names, read best-effort (endpoints whose
	// addresses do not parse are skipped).
	Named []netip.Addr
	// isolation is, for a PolicyEndpoint, the local pods of its own namespace it
	// names and the directions its podIsolation isolates; zero for a
	// ClusterPolicyEndpoint (the admin and baseline tiers isolate nothing).
	Isolation Isolation
	// unreadable counts the endpoints a PolicyEndpoint names whose hostIP or podIP
	// does not parse: a pod of this node among them cannot be found, nor isolated.
	Unreadable int
}

// Isolation is what a PolicyEndpoint with no valid version adds to its pods' policy:
// the directions it names isolated, and no allow rule (its rules could not be read).
type Isolation struct {
	Pods []netip.Addr // sorted, no duplicates
	Dirs [2]bool      // ingress, egress
}

// ReadRejected reads what it can of a version that did not compile: the local pods it
// names and, for a PolicyEndpoint, the directions it isolates. A PolicyEndpoint's
// pods of another namespace are named (their pinned state is kept) but never isolated:
// that would let a namespace isolate another's pods with an invalid object. Its
// directions follow podIsolation as PolicyEndpoint reads it; a value that is neither
// Ingress nor Egress isolates both (what it meant cannot be known).
func ReadRejected(obj any, nodeIP netip.Addr) Rejected {
	var (
		r         Rejected
		eps       []v1alpha1.PodEndpoint
		namespace string
		pe        *v1alpha1.PolicyEndpoint
	)
	switch o := obj.(type) {
	case *v1alpha1.PolicyEndpoint:
		pe, eps, namespace = o, o.Spec.PodSelectorEndpoints, o.Namespace
	case *v1alpha1.ClusterPolicyEndpoint:
		eps = o.Spec.PodSelectorEndpoints
	}
	for i := range eps {
		host, err := netip.ParseAddr(string(eps[i].HostIP))
		if err != nil {
			r.Unreadable++
			continue
		}
		if host.Unmap() != nodeIP {
			continue
		}
		pod, err := netip.ParseAddr(string(eps[i].PodIP))
		if err != nil || pod.Zone() != "" {
			r.Unreadable++
			continue
		}
		r.Named = append(r.Named, pod.Unmap())
		if pe != nil && eps[i].Namespace == namespace {
			r.Isolation.Pods = append(r.Isolation.Pods, pod.Unmap())
		}
	}
	slices.SortFunc(r.Named, netip.Addr.Compare)
	r.Named = slices.Compact(r.Named)
	if pe == nil {
		r.Unreadable = 0 // nothing would be isolated anyway
		return r
	}
	slices.SortFunc(r.Isolation.Pods, netip.Addr.Compare)
	r.Isolation.Pods = slices.Compact(r.Isolation.Pods)
	if len(pe.Spec.PodIsolation) == 0 {
		r.Isolation.Dirs = [2]bool{bpfmaps.Ingress: true, bpfmaps.Egress: len(pe.Spec.Egress) > 0}
	}
	for _, t := range pe.Spec.PodIsolation {
		switch t {
		case networkingv1.PolicyTypeIngress:
			r.Isolation.Dirs[bpfmaps.Ingress] = true
		case networkingv1.PolicyTypeEgress:
			r.Isolation.Dirs[bpfmaps.Egress] = true
		default:
			r.Isolation.Dirs = [2]bool{true, true}
		}
	}
	return r
}

// convertRule converts one peer rule. The CIDR may be a bare address (a /32 or /128),
// as the controller writes pod peers; host bits are cleared. Each except must be a
// block inside the CIDR, of its family.
func convertRule(cidr v1alpha1.NetworkAddress, except []v1alpha1.NetworkAddress, ports []v1alpha1.Port, p fieldPath) (bpfmaps.Rule, error) {
	var r bpfmaps.Rule
	var err error
	if r.CIDR, err = parsePrefix(cidr); err != nil {
		return r, p.child("cidr").errorf(string(cidr), "%v", err)
	}
	for i, e := range except {
		ep := p.child("except").index(i)
		block, err := parsePrefix(e)
		if err != nil {
			return r, ep.errorf(string(e), "%v", err)
		}
		if block.Addr().Is4() != r.CIDR.Addr().Is4() || block.Bits() < r.CIDR.Bits() || !r.CIDR.Contains(block.Addr()) {
			return r, ep.errorf(string(e), "not inside cidr %s", r.CIDR)
		}
		r.Except = append(r.Except, block)
	}
	for i := range ports {
		pr, err := convertPort(&ports[i], p.child("ports").index(i))
		if err != nil {
			return r, err
		}
		r.Ports = append(r.Ports, pr)
	}
	return r, nil
}

func parsePrefix(s v1alpha1.NetworkAddress) (netip.Prefix, error) {
	if pfx, err := netip.ParsePrefix(string(s)); err == nil {
		if pfx.Addr().Zone() != "" || pfx.Addr().Is4In6() {
			return netip.Prefix{}, fmt.Errorf("not a CIDR")
		}
		return pfx.Masked(), nil
	}
	addr, err := netip.ParseAddr(string(s))
	if err != nil || addr.Zone() != "" || addr.Is4In6() {
		return netip.Prefix{}, fmt.Errorf("not a CIDR or IP address")
	}
	return netip.PrefixFrom(addr, addr.BitLen()), nil
}

// convertPort applies NetworkPolicy's defaults (protocol TCP; no port: every port of
// the protocol) and checks ranges: port 1..65535, endPort only with port and ≥ port.
func convertPort(port *v1alpha1.Port, p fieldPath) (bpfmaps.PortRule, error) {
	pr := bpfmaps.PortRule{Protocol: bpfmaps.ProtocolTCP}
	if port.Protocol != nil {
		switch *port.Protocol {
		case corev1.ProtocolTCP:
		case corev1.ProtocolUDP:
			pr.Protocol = bpfmaps.ProtocolUDP
		case corev1.ProtocolSCTP:
			pr.Protocol = bpfmaps.ProtocolSCTP
		default:
			return pr, p.child("protocol").errorf(string(*port.Protocol), "want TCP, UDP or SCTP")
		}
	}
	if port.Port != nil {
		if *port.Port < 1 || *port.Port > 65535 {
			return pr, p.child("port").errorf(strconv.Itoa(int(*port.Port)), "out of range 1..65535")
		}
		pr.Port = *port.Port
	}
	if port.EndPort != nil {
		switch {
		case port.Port == nil:
			return pr, p.child("endPort").errorf(strconv.Itoa(int(*port.EndPort)), "set without port")
		case *port.EndPort < *port.Port || *port.EndPort > 65535:
			return pr, p.child("endPort").errorf(strconv.Itoa(int(*port.EndPort)), "want %d..65535", *port.Port)
		case *port.EndPort > *port.Port:
			pr.EndPort = *port.EndPort
		}
	}
	return pr, nil
}

// BuildSets builds c's allow rules into rule sets, each from prev's set of the same
// direction (the key's version before, nil if none): a commit then validates and
// hashes nothing of them under the caller's lock and, when only pod peers changed,
// compiles only those. Called once, before c is shared.
func (c *Compiled) BuildSets(prev *Compiled) error {
	if len(c.Pods) == 0 {
		// No pod here: the version is kept without its rules (NodeLocal), and a merge
		// that still needs them (a sibling chunk's pod) takes them as plain rules.
		return nil
	}
	for d := range c.Allow {
		if !c.Isolated[d] {
			continue // its rules are not part of the policy
		}
		var from *bpfmaps.RuleSet
		if prev != nil {
			from = prev.Sets[d]
		}
		s, err := bpfmaps.NewRuleSet(c.Key.String(), bpfmaps.Direction(d), c.Allow[d], from)
		if err != nil {
			return root("spec").child(directionField[d]).errorf("", "%v", err)
		}
		c.Sets[d] = s
	}
	return nil
}

// origin names the object, or its rule index (-1: the object as a whole), for the
// dataplane's verdict counters; Policy is its policyRef's name when it has one.
func (c *Compiled) origin(index int) bpfmaps.Origin {
	return bpfmaps.Origin{UID: string(c.UID), Kind: c.Key.Kind.String(), Namespace: c.Key.Namespace, Name: c.Key.Name,
		Policy: c.Policy.Name, Index: index}
}

// MergePodPolicy is the policy of one pod: every object selecting it, merged.
// Namespaced policy: a direction is isolated if any object isolates it, and its allow
// rules are the union of theirs. Cluster policy: each object's rules go to its tier,
// ordered by priority, then by object key, then by spec order — a total order, so the
// same objects always give the same policy (and the dataplane's content hash skips an
// unchanged re-commit).
func MergePodPolicy(objs []*Compiled) bpfmaps.PodPolicy {
	objs = slices.Clone(objs)
	slices.SortFunc(objs, func(a, b *Compiled) int { return a.Key.Compare(b.Key) })
	var dirs [2]bpfmaps.DirectionPolicy
	for _, o := range objs {
		o = o.Rules()
		for d := range dirs {
			switch o.Key.Kind {
			case report.KindPolicyEndpoint:
				switch {
				case !o.Isolated[d]:
				case o.Sets[d] != nil:
					dirs[d].Isolated = true
					dirs[d].Sources = append(dirs[d].Sources, o.origin(-1))
					dirs[d].AllowSets = append(dirs[d].AllowSets, o.Sets[d])
				default:
					dirs[d].Isolated = true
					dirs[d].Sources = append(dirs[d].Sources, o.origin(-1))
					dirs[d].Allow = append(dirs[d].Allow, o.Allow[d]...)
				}
			case report.KindClusterPolicyEndpoint:
				if o.Tier == v1alpha1.TierAdmin {
					dirs[d].Admin = append(dirs[d].Admin, o.TierRules[d]...)
				} else {
					dirs[d].Baseline = append(dirs[d].Baseline, o.TierRules[d]...)
				}
			}
		}
	}
	for d := range dirs {
		// Stable: ties keep object-key order and, within an object, spec order.
		slices.SortStableFunc(dirs[d].Admin, func(a, b bpfmaps.TierRule) int { return cmp.Compare(a.Priority, b.Priority) })
		slices.SortStableFunc(dirs[d].Baseline, func(a, b bpfmaps.TierRule) int { return cmp.Compare(a.Priority, b.Priority) })
	}
	return bpfmaps.PodPolicy{Ingress: dirs[bpfmaps.Ingress], Egress: dirs[bpfmaps.Egress]}
}
