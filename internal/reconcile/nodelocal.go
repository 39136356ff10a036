package reconcile

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
// compiles again), but needs none of its rules until then. So the pod table keeps such
// a version without its converted rules (nodeLocal): identity, policy, isolation and
// tier only, plus a reference to the informer's cached object it was compiled from —
// memory the informer cache holds anyway. That holds while the cache keeps that
// object: an in-place relist re-delivers an unchanged object as the one cached
// (listWatch.diff). A relist the reflector makes itself (rare: the ListWatch absorbs
// watch ends and 410s) caches new decodes; the versions kept here then hold the old
// objects, and the list they came from, until their objects' next write.
//
// Bad input in an object with no local pods is still rejected here, as on every node:
// the worker compiles every version in full (validation is the conversion) and drops
// the rules after, so an invalid object is counted, logged and kept out of force alike
// on every node, and its last valid version stays. That costs the conversion's CPU on
// each write, not memory; a relist of unchanged objects compiles nothing.
//
// Only PolicyEndpoints are kept so. ClusterPolicyEndpoints are few (a cluster's admin
// and baseline policies) and their Deny rules must never go missing: kept compiled,
// none can.
//
// One case needs the rules of an object with no local pods: a chunk of a policy whose
// other chunk selects a pod here (the pod merges every chunk of its policy). The
// worker's own compile serves the commit it makes (settle then drops it unless a merge
// read it); a later merge that needs them (a sibling chunk gains a pod here) compiles
// the version again from its cached object, once, under the pod table's lock. Once read
// by a merge, the rules are kept for as long as the version is.

// deferredRules stands for the rules nodeLocal dropped from a version.
type deferredRules struct {
	mu      sync.Mutex
	compile func() (*compiledObject, error) // the same compile, of the same cached object
	full    *compiledObject                 // the rules, when compiled and kept
	used    bool                            // a merge read full: keep it
}

// nodeLocal returns c as the pod table keeps it: unchanged when it selects a local
// pod or is a ClusterPolicyEndpoint; otherwise a copy whose rules are c's until settle
// and then compiled from src (the version c was compiled from) again when a merge
// needs them. src must not change: a cached informer object, or one read from disk.
func (o CompileOptions) nodeLocal(c *compiledObject, src any, nodeIP netip.Addr) *compiledObject {
	if c == nil || len(c.pods) > 0 || c.key.kind != report.KindPolicyEndpoint {
		return c
	}
	light := *c
	light.allow, light.tierRules, light.sets = [2][]bpfmaps.Rule{}, [2][]bpfmaps.TierRule{}, [2]*bpfmaps.RuleSet{}
	light.deferred = &deferredRules{full: c, compile: func() (*compiledObject, error) { return o.compileObject(src, nodeIP) }}
	return &light
}

// settle drops the rules nodeLocal handed over from the worker's compile unless a
// merge read them: the version keeps no rules of its own from then on.
func (c *compiledObject) settle() {
	if d := c.deferred; d != nil {
		d.mu.Lock()
		if !d.used {
			d.full = nil
		}
		d.mu.Unlock()
	}
}

// compileObject compiles a PolicyEndpoint or ClusterPolicyEndpoint.
func (o CompileOptions) compileObject(obj any, nodeIP netip.Addr) (*compiledObject, error) {
	switch obj := obj.(type) {
	case *v1alpha1.PolicyEndpoint:
		return o.policyEndpoint(obj, nodeIP)
	case *v1alpha1.ClusterPolicyEndpoint:
		return o.clusterPolicyEndpoint(obj, nodeIP)
	}
	return nil, fmt.Errorf("unexpected %T", obj)
}

// rules returns c with its rules: c itself, or, for a version nodeLocal kept without
// them, the full compile of the same version (made on first use and then kept). The
// compile is a pure function of the object and the options and succeeded once; should
// it fail now (the cached object was changed in place, a bug), the rules are left
// out, which for a PolicyEndpoint (the only kind kept so) only narrows what the policy
// allows.
func (c *compiledObject) rules() *compiledObject {
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
