package translate

import (
	"fmt"
	"net/netip"
	"sync"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/report"
)

// Node-local memory. Most objects in a cluster select no pod on this node: the agent
// must notice when a later version of one does (its event brings that version, which
// compiles again), but needs none of its rules until then. So NodeLocal keeps such a
// version without its converted rules: identity, policy, isolation and tier only,
// plus a reference to the object it was compiled from.
//
// That reference is the one dependency on the caller: it saves memory only when src
// is an object the caller keeps anyway, and only while the caller keeps that same
// object. internal/reconcile passes the informer's cached object; its ListWatch
// (internal/kubewatch: listWatch.diff) re-delivers an unchanged object on an in-place
// relist as the object the cache already holds, not as the new decode, and copies a
// new or changed one out of its list, so a kept version never holds a list alive
// (TestListWatchDiffKeepsDeliveredObject). A relist the reflector makes itself (rare:
// the ListWatch absorbs watch ends and 410s) caches new decodes; the versions kept
// here then hold the old objects until their objects' next write. Correctness needs
// only that src never changes (TestNodeLocalCompilesFromSource).
//
// Bad input in an object it compiles with no local pods is still rejected: the caller
// compiles the version in full (validation is the conversion) and NodeLocal drops the
// rules after, so an invalid object is counted, logged and kept out of force, and its
// last valid version stays. (internal/reconcile compiles such a version only when a
// sibling chunk has a pod here; a policy with no work on the node at all is cached as
// a stub and not compiled there: see its stubs.go.)
//
// Only PolicyEndpoints are kept so. ClusterPolicyEndpoints are few (a cluster's admin
// and baseline policies) and their Deny rules must never go missing: kept compiled,
// none can.
//
// One case needs the rules of an object with no local pods: a chunk of a policy whose
// other chunk selects a pod here (the pod merges every chunk of its policy). The
// caller's own compile serves the commit it makes (Settle then drops it unless a merge
// read it); a later merge that needs them (a sibling chunk gains a pod here) compiles
// the version again from src, once (Rules). Once read by a merge, the rules are kept
// for as long as the version is.

// deferredRules stands for the rules NodeLocal dropped from a version.
type deferredRules struct {
	mu      sync.Mutex
	compile func() (*Compiled, error) // the same compile, of the same cached object
	full    *Compiled                 // the rules, when compiled and kept
	used    bool                      // a merge read full: keep it
}

// NodeLocal returns c as a caller keeps it: unchanged when it selects a local pod or
// is a ClusterPolicyEndpoint; otherwise a copy whose rules are c's until Settle and
// then compiled from src (the object c was compiled from) again when a merge needs
// them. The copy refers to src (see above): src must not change, and should be an
// object the caller keeps anyway (a cached informer object, or one read from disk).
func (o Options) NodeLocal(c *Compiled, src any, nodeIP netip.Addr) *Compiled {
	if c == nil || len(c.Pods) > 0 || c.Key.Kind != report.KindPolicyEndpoint {
		return c
	}
	light := *c
	light.Allow, light.TierRules, light.Sets = [2][]bpfmaps.Rule{}, [2][]bpfmaps.TierRule{}, [2]*bpfmaps.RuleSet{}
	light.deferred = &deferredRules{full: c, compile: func() (*Compiled, error) { return o.Compile(src, nodeIP) }}
	return &light
}

// Settle drops the rules NodeLocal handed over from the caller's compile unless a
// merge read them: the version keeps no rules of its own from then on.
func (c *Compiled) Settle() {
	if d := c.deferred; d != nil {
		d.mu.Lock()
		if !d.used {
			d.full = nil
		}
		d.mu.Unlock()
	}
}

// Compile compiles a PolicyEndpoint or ClusterPolicyEndpoint.
func (o Options) Compile(obj any, nodeIP netip.Addr) (*Compiled, error) {
	switch obj := obj.(type) {
	case *v1alpha1.PolicyEndpoint:
		return o.PolicyEndpoint(obj, nodeIP)
	case *v1alpha1.ClusterPolicyEndpoint:
		return o.ClusterPolicyEndpoint(obj, nodeIP)
	}
	return nil, fmt.Errorf("unexpected %T", obj)
}

// Rules returns c with its rules: c itself, or, for a version NodeLocal kept without
// them, the full compile of the same version (made on first use and then kept). The
// compile is a pure function of the object and the options and succeeded once; should
// it fail now (the cached object was changed in place, a bug), the rules are left
// out, which for a PolicyEndpoint (the only kind kept so) only narrows what the policy
// allows.
func (c *Compiled) Rules() *Compiled {
	d := c.deferred
	if d == nil {
		return c
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.full == nil && !d.used {
		d.full, _ = d.compile()
	}
	d.used = true
	if d.full == nil {
		return c
	}
	return d.full
}

// HeldRules is how many rules c holds in memory: its own, plus, for a version
// NodeLocal kept without them, those of the full compile while it is held (until
// Settle, or for good once a merge read them). Memory tests read it.
func (c *Compiled) HeldRules() int {
	n := 0
	for d := range c.Allow {
		n += len(c.Allow[d]) + len(c.TierRules[d])
	}
	if d := c.deferred; d != nil {
		d.mu.Lock()
		if d.full != nil {
			for dir := range d.full.Allow {
				n += len(d.full.Allow[dir])
			}
		}
		d.mu.Unlock()
	}
	return n
}
