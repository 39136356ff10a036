package reconcile

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/translate"
)

// DefaultNamespaceEntryShare is Config.NamespaceEntryShare's default: half of each
// trie. One namespace can then never take more than half of a trie from the others,
// while a namespace alone on the node (or with small neighbours) can still grow to
// half, the most one object could ever use anyway (a commit holds two entry sets).
const DefaultNamespaceEntryShare = 0.5

// namespaceShare bounds the trie entries the local pods of one namespace hold
// (Config.NamespaceEntryShare), so that one tenant's policies cannot fill a trie and
// leave other tenants' new pods uncommittable (isolated) and their policies
// untightenable.
//
// A namespace is charged, per trie (direction and family), the namespaced entries of
// each distinct rule set its local pods hold: what the union of the PolicyEndpoints
// selecting a pod compiles to, once however many pods merge the same versions
// (replicas share one copy of their entries in the dataplane's entry groups). Admin
// and baseline entries (ClusterPolicyEndpoints) are exempt: they are the cluster
// admin's, not the tenant's, and a tenant cannot be refused for them; they still
// count against the tries' capacity, whose commit error is the bound for them.
// Guarded by podTable.mu.
type namespaceShare struct {
	counter bpfmaps.EntryCounter // nil: shares not enforced
	max     [2][2]int            // entries a namespace may hold, [direction][family]
	limits  [2][2]int            // the tries' capacities, for messages
	share   float64
	used    map[string]*namespaceUse
}

// namespaceUse is what one namespace's local pods hold (their last accepted
// versions, committed or still to be).
type namespaceUse struct {
	pods     map[netip.Addr]shareCount
	contents map[string]int // pods holding each rule set
	total    [2][2]int      // entries of each rule set the pods hold, once
}

// shareCount is what one pod is charged: its rule set's identity (the versions it
// merges) and that set's namespaced entries.
type shareCount struct {
	content string
	n       [2][2]int
}

// charge moves pod from the count it had to c in a namespace's total, given how many
// pods hold each rule set (refs, changed in place): a rule set is added when its first
// pod comes and removed when its last goes.
func charge(total *[2][2]int, refs func(content string, delta int) int, old, c shareCount, had bool) {
	add := func(n [2][2]int, sign int) {
		for d := range total {
			for f := range total[d] {
				total[d][f] += sign * n[d][f]
			}
		}
	}
	if had && refs(old.content, -1) == 0 {
		add(old.n, -1)
	}
	if c.n != ([2][2]int{}) && refs(c.content, +1) == 1 {
		add(c.n, +1)
	}
}

// newNamespaceShare returns the shares of dp's tries; share outside (0, 1) disables them.
func newNamespaceShare(dp bpfmaps.Dataplane, share float64) namespaceShare {
	counter := bpfmaps.EntryCounter(dp)
	if share <= 0 || share >= 1 {
		return namespaceShare{}
	}
	l := counter.Limits()
	s := namespaceShare{counter: counter, share: share, used: map[string]*namespaceUse{}}
	for d := range s.max {
		s.limits[d] = [2]int{l.EntriesV4, l.EntriesV6}
		for f := range s.max[d] {
			s.max[d][f] = int(share * float64(s.limits[d][f]))
		}
	}
	return s
}

// namespacedPolicy is the part of a pod's merged policy its namespace is charged for:
// the namespaced allow rules of the directions they isolate.
func namespacedPolicy(p *bpfmaps.PodPolicy) bpfmaps.PodPolicy {
	keep := func(d *bpfmaps.DirectionPolicy) bpfmaps.DirectionPolicy {
		if !d.Isolated {
			return bpfmaps.DirectionPolicy{} // its namespaced rules are not compiled
		}
		return bpfmaps.DirectionPolicy{Isolated: true, Allow: d.Allow, AllowSets: d.AllowSets}
	}
	return bpfmaps.PodPolicy{Ingress: keep(&p.Ingress), Egress: keep(&p.Egress)}
}

// measureShare counts, for the PolicyEndpoint version just indexed under key, the
// namespaced entries each of pods (the commit's affected pods, all of key's
// namespace) will hold, and checks the namespace's total against its share. It
// returns the counts, to record once the version is accepted, and a FieldError when
// the version takes a trie over the share and holds more of it than before (a
// version that does not grow an over-share trie is accepted: it changes nothing for
// the others). Called with mu held.
func (t *podTable) measureShare(key translate.Key, pods []netip.Addr, reject bool) (map[netip.Addr]shareCount, *translate.FieldError) {
	s := &t.share
	if s.counter == nil || key.Kind != report.KindPolicyEndpoint {
		return nil, nil
	}
	use := s.used[key.Namespace]
	var before [2][2]int
	if use != nil {
		before = use.total
	}
	after := before
	counts := make(map[netip.Addr]shareCount, len(pods))
	// Pods merging the same versions (replicas) hold the same entries: count once.
	seen := map[string][2][2]int{}
	moved := map[string]int{} // change of each rule set's pods, over use.contents
	refs := func(content string, delta int) int {
		moved[content] += delta
		if use == nil {
			return moved[content]
		}
		return use.contents[content] + moved[content]
	}
	var objs []*translate.Compiled
	for _, pod := range pods {
		var c shareCount
		if objs = t.objectsFor(pod, objs[:0]); len(objs) > 0 {
			slices.SortFunc(objs, func(a, b *translate.Compiled) int { return a.Key.Compare(b.Key) })
			var id strings.Builder
			for _, o := range objs {
				fmt.Fprintf(&id, "%p,", o)
			}
			c.content = id.String()
			var ok bool
			if c.n, ok = seen[c.content]; !ok {
				merged := translate.MergePodPolicy(objs)
				var err error
				if c.n, err = s.counter.Entries(namespacedPolicy(&merged)); err != nil {
					// Not a policy the dataplane can take: the commit says so.
					return nil, nil
				}
				seen[c.content] = c.n
			}
		}
		counts[pod] = c
		var old shareCount
		had := false
		if use != nil {
			old, had = use.pods[pod]
		}
		charge(&after, refs, old, c, had)
	}
	if !reject {
		return counts, nil
	}
	for d := range after {
		for f, fam := range [2]string{"IPv4", "IPv6"} {
			if after[d][f] > s.max[d][f] && after[d][f] > before[d][f] {
				return nil, &translate.FieldError{Path: "spec", Field: "spec.namespaceShare", Value: key.String(),
					Msg: fmt.Sprintf("namespace %s would hold %d of the %s %s trie's %d entries, its share is %d (--namespace-entry-share %g): rejected so that it cannot crowd out other namespaces' pods",
						key.Namespace, after[d][f], fam, bpfmaps.Direction(d), s.limits[d][f], s.max[d][f], s.share)}
			}
		}
	}
	return counts, nil
}

// recordShare records the counts measureShare returned for an accepted version of
// an object of namespace ns. Called with mu held.
func (t *podTable) recordShare(ns string, counts map[netip.Addr]shareCount) {
	if counts == nil {
		return
	}
	use := t.share.used[ns]
	if use == nil {
		use = &namespaceUse{pods: map[netip.Addr]shareCount{}, contents: map[string]int{}}
		t.share.used[ns] = use
	}
	refs := func(content string, delta int) int {
		n := use.contents[content] + delta
		if n == 0 {
			delete(use.contents, content)
		} else {
			use.contents[content] = n
		}
		return n
	}
	for pod, c := range counts {
		old, had := use.pods[pod]
		charge(&use.total, refs, old, c, had)
		if c.n == ([2][2]int{}) {
			delete(use.pods, pod)
		} else {
			use.pods[pod] = c
		}
	}
	if len(use.pods) == 0 {
		delete(t.share.used, ns)
	}
}
