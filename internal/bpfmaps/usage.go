package bpfmaps

import (
	"errors"
	"fmt"
)

// MapUse is one map's use: entries held, and its capacity.
type MapUse struct{ Used, Max int }

// Usage is the dataplane's map use, for gauges: how close each shared map is to
// its capacity (a commit that does not fit fails with ErrCapacity).
type Usage struct {
	// Entries are the policy tries, [Ingress, Egress][IPv4, IPv6], shared by every
	// pod: entries held (each entry group once; both its sets while they are level; and
	// entries whose deletion is pending) against the trie's capacity (Limits).
	Entries [2][2]MapUse
	// Pods are the pods holding state, against Limits.Pods.
	Pods MapUse
	// Conntrack is the connection tables (EBPF only; zero for Memory): live entries
	// (not timed out) in all pods' tables, against their total capacity
	// (ConntrackEntries per pod with a table).
	Conntrack MapUse
}

// UsageReporter reports a dataplane's map use; part of Dataplane.
type UsageReporter interface {
	// Usage returns the current use. Safe for concurrent use with commits.
	Usage() (Usage, error)
}

var (
	_ UsageReporter = (*EBPF)(nil)
	_ UsageReporter = (*Memory)(nil)
)

// usage is the use the core accounts for: tries and pods.
func (c *core) usage() Usage {
	c.mu.Lock()
	defer c.mu.Unlock()
	var u Usage
	for d := range u.Entries {
		u.Entries[d][0] = MapUse{Used: c.used[d][0], Max: c.limits.EntriesV4}
		u.Entries[d][1] = MapUse{Used: c.used[d][1], Max: c.limits.EntriesV6}
	}
	u.Pods = MapUse{Used: len(c.pods), Max: c.limits.Pods}
	return u
}

// Usage implements UsageReporter with the in-memory backend's own tables: the tries
// and pods it accounts for; Conntrack is zero (it keeps no connection tables).
func (m *Memory) Usage() (Usage, error) { return m.usage(), nil }

// Usage implements UsageReporter. The connection tables are counted at the call
// (conntrackUse: each pod's table read in batches; a few milliseconds per 64k
// entries), since the datapath inserts and the LRU evicts without counting.
func (e *EBPF) Usage() (Usage, error) {
	if e.closed.Load() {
		return Usage{}, errors.New("ebpf dataplane: closed")
	}
	u := e.usage()
	ct, err := e.conntrackUse()
	if err != nil {
		return u, fmt.Errorf("count connection table entries: %w", err)
	}
	u.Conntrack = ct
	return u, nil
}

// EntryCounter tells, without committing, how many trie entries a pod policy
// compiles to: what a commit of it would hold. Part of Dataplane.
type EntryCounter interface {
	// Entries returns the entries p compiles to, [Ingress, Egress][IPv4, IPv6]: one
	// copy (a pod holds a second while a delta commit keeps two sets level). Content
	// some pod has committed, or a single precompiled rule set, is counted without a
	// compile; other content is validated and compiled (outside the commit lock). An
	// invalid p returns an error wrapping ErrInvalidPolicy.
	Entries(p PodPolicy) ([2][2]int, error)
	// Limits returns the capacities, defaults applied.
	Limits() Limits
}

var (
	_ EntryCounter = (*EBPF)(nil)
	_ EntryCounter = (*Memory)(nil)
)

// Limits implements EntryCounter.
func (c *core) Limits() Limits { return c.limits }

// Entries implements EntryCounter.
func (c *core) Entries(p PodPolicy) (n [2][2]int, err error) {
	for d, pol := range [2]*DirectionPolicy{&p.Ingress, &p.Egress} {
		_, hash := directionHash(pol)
		c.mu.Lock()
		s := c.shared[hash]
		if s != nil {
			n[d] = [2]int{len(s.comp.Entries.k4), len(s.comp.Entries.k6)}
		}
		c.mu.Unlock()
		if s != nil {
			continue
		}
		if pre := precompiled(pol); pre != nil {
			n[d] = [2]int{len(pre.comp.Entries.k4), len(pre.comp.Entries.k6)}
			continue
		}
		ns, admin, baseline, err := validateDirection(Direction(d), pol)
		if err != nil {
			return n, fmt.Errorf("count entries: %w", err)
		}
		comp, err := compileDirection(ns, admin, baseline, pol.Isolated)
		if err != nil {
			return n, fmt.Errorf("count entries: %w", err)
		}
		n[d] = [2]int{len(comp.Entries.k4), len(comp.Entries.k6)}
	}
	return n, nil
}
