package bpfmaps

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"
)

// The map keys and values are the types bpf2go generates from policy.c (see the
// structs there for their meaning): policyLpmKey4 and policyLpmKey6 (trie keys:
// Prefixlen counts the 64 bits of Ifindex and Tag plus the prefix bits, so lookups
// never cross pods or entry sets), policyRuleValue and policyPortRule (trie values),
// and policyPodState, a pod's slot in the state array: per direction one word (see
// dirWord) the datapath reads with a single load and a commit switches with one
// atomic store, and a content hash only user space reads (it lets a restarted agent
// skip unchanged commits).

// flagBits is how many low bits of a state word hold the direction's flags.
const flagBits = 4

// tagSets marks the tags of entry sets (TAG_SETS in policy.c): tags written by builds
// that wrote a fresh generation per commit (gen << 2 | tier, below 1 << 30) lack it.
const tagSets uint32 = 1 << 31

// dirWord is a direction's state word: the owner's ifindex in the high 32 bits (the
// datapath ignores a word another pod owns), gen<<flagBits | flags in the low 32. gen
// is seq<<1 | set: set is the entry set lookups use, seq changes with every switch so
// that no two switches in a row store the same word (the datapath's re-check relies
// on it, policy.c).
func dirWord(owner, gen, flags uint32) uint64 {
	return uint64(owner)<<32 | uint64(gen<<flagBits|flags)
}
func wordOwner(w uint64) uint32 { return uint32(w >> 32) }
func wordGen(w uint64) uint32   { return uint32(w) >> flagBits }
func wordSet(w uint64) uint32   { return wordGen(w) & 1 }
func wordFlags(w uint64) uint32 { return uint32(w) & (1<<flagBits - 1) }

// entryTag is the tag of a tier's entries in an entry set (0 or 1).
func entryTag(set uint32, t tier) uint32 { return tagSets | set<<2 | uint32(t) }
func tagSet(tag uint32) uint32           { return tag >> 2 & 1 }
func tagTier(tag uint32) tier            { return tier(tag & 3) }

// nextGen returns the gen of the switch after gen: the other set, the next sequence
// number (never 0, so a first commit's word differs from an empty one).
func nextGen(gen uint32) uint32 {
	seq := (gen>>1)%(maxGeneration>>1) + 1
	return seq<<1 | (gen&1 ^ 1)
}

// Limits are the dataplane's capacities. Zero fields take the defaults.
type Limits struct {
	// Pods is how many pods can hold state. Default 4096.
	Pods int
	// EntriesV4 is the capacity of each direction's IPv4 trie, shared by all pods.
	// A pod's entries count twice while it keeps two entry sets level (after a delta
	// commit); a commit for which that does not fit deletes the second set instead.
	// Default 65536.
	EntriesV4 int
	// EntriesV6 is the same for the IPv6 tries. Default 16384.
	EntriesV6 int
}

func (l Limits) withDefaults() Limits {
	if l.Pods <= 0 {
		l.Pods = DefaultPods
	}
	if l.EntriesV4 <= 0 {
		l.EntriesV4 = DefaultEntriesV4
	}
	if l.EntriesV6 <= 0 {
		l.EntriesV6 = DefaultEntriesV6
	}
	return l
}

// store is what a backend does to its maps. Implementations: the kernel maps (EBPF)
// and Go maps (Memory). The core decides what to write and in which order.
type store interface {
	// writeEntries inserts or replaces entries. On error the entries it inserted are
	// deleted again; entries it replaced may be gone too (the core then drops the
	// whole entry set).
	writeEntries(d Direction, k4 []policyLpmKey4, v4 []policyRuleValue, k6 []policyLpmKey6, v6 []policyRuleValue) error
	// deleteEntries deletes the keys; keys already gone are skipped.
	deleteEntries(d Direction, k4 []policyLpmKey4, k6 []policyLpmKey6) error
	putPod(ifindex uint32, st *policyPodState) error
	deletePod(ifindex uint32) error
	// putAddrs inserts pods' address keys (anti-spoofing); deleteAddrs deletes them,
	// skipping keys already gone.
	putAddrs(keys []policyAddrKey) error
	deleteAddrs(keys []policyAddrKey) error
}

// podRecord is what the core remembers of a pod with committed state.
type podRecord struct {
	state policyPodState
	dirs  [2]dirRecord
	addrs []netip.Addr // the pod's own addresses (PodPolicy.Addrs), normalized
	// gens are what the direction's last commits credit verdict counts to, oldest
	// first (verdicts.go).
	gens [2][]genRecord
}

// dirRecord is a direction's committed state: the group set its word names, which
// holds its entries.
type dirRecord struct {
	ref    groupRef
	shared *sharedDirection // where the entries came from; nil if adopted
}

// entries are the direction's committed entries.
func (r *dirRecord) entries() *dirEntries { return entriesOf(r.ref) }

// sharedDirection is a compiled direction policy, shared by every pod and direction
// committed with the same content (hash): pods a policy selects compile it once and
// hold its entries once.
type sharedDirection struct {
	hash uint64
	comp compiledDirection
	refs int       // directions of pods holding it
	inc  *incState // nil: never compiled from incrementally
	// borrowed: comp's arrays are a RuleSet's too (RuleSet.pre), never reused.
	borrowed bool
	// from is the compile this one was derived from (deriveDirection), fromDelta the
	// difference of their entries: a set holding from takes it instead of comparing
	// all entries. Cleared once this one is derived from in turn, so that a chain
	// of derived compiles holds one predecessor, not all.
	from      *sharedDirection
	fromDelta *entryDelta
}

// dirKeys are tagged keys of one direction (garbage to delete).
type dirKeys struct {
	k4 []policyLpmKey4
	k6 []policyLpmKey6
}

func (k *dirKeys) len() int { return len(k.k4) + len(k.k6) }

// core is the validation, compilation, hashing, capacity accounting and commit
// protocol both backends share. Methods are safe for concurrent use.
type core struct {
	mu      sync.Mutex
	limits  Limits
	store   store
	pods    map[uint32]*podRecord
	groups  [2]groups  // entry groups per direction
	used    [2][2]int  // entries in the tries, [direction][0 IPv4, 1 IPv6]
	garbage [2]dirKeys // entries whose deletion failed; retried on the next commit
	scratch scratch
	shared  map[uint64]*sharedDirection // by content hash
	// afterWrite, if set, is called after each change of the maps in a commit (tests
	// evaluate packets at every step).
	afterWrite func()
}

func (c *core) wrote() {
	if c.afterWrite != nil {
		c.afterWrite()
	}
}

func newCore(l Limits, s store) *core {
	return &core{limits: l.withDefaults(), store: s, pods: map[uint32]*podRecord{},
		groups: [2]groups{newGroups(), newGroups()}, shared: map[uint64]*sharedDirection{}}
}

// attachFunc readies a pod's interface before state is written (a no-op returning a
// nil undo when it is ready already); undo reverses it if the commit then fails for a
// pod without state. nil for the in-memory backend.
type attachFunc func(ifindex int) (undo func(), err error)

// dirPlan is what a commit does to one direction.
type dirPlan struct {
	changed bool
	shared  *sharedDirection // the new content
	target  groupRef         // the set the switched word names
	fresh   bool             // target's group is new
	write   bool             // pre is written into target before the switch
	pre     entryDelta       // turns what target holds into the new content
}

// commit makes p the pod's policy, in four phases: plan (hash, validate, compile, pick
// each changed direction's target set: one holding the content already, else its
// group's other set when no pod names it, else a new group), write (the difference
// into the target sets), switch (the pod's addresses, then its words: one atomic store
// per direction) and level (the sets the pod no longer names: brought level or
// deleted when no pod names them).
func (c *core) commit(ifindex int, p PodPolicy, attach attachFunc) (CommitResult, error) {
	var res CommitResult
	start := time.Now()
	if ifindex <= 0 || ifindex > 1<<31-1 {
		return res, fmt.Errorf("commit pod %d: ifindex: out of range: %w", ifindex, ErrInvalidPolicy)
	}
	pols := [2]*DirectionPolicy{&p.Ingress, &p.Egress}
	// Hash first: content equal to the committed content was validated when it was
	// committed, so an unchanged re-commit (a relist) costs the hash alone. Invalid
	// values hash differently from every valid one (they are encoded raw). AllowSets
	// count by their hashes: their rules were validated and hashed when built.
	var hashes, rests [2]uint64
	for d := range pols {
		rests[d], hashes[d] = directionHash(pols[d])
	}
	// The pod's addresses are not part of the direction hashes: those name compiles
	// and entries that pods with the same rules share.
	addrs, err := normalizeAddrs(p.Addrs)
	if err != nil {
		return res, fmt.Errorf("commit pod %d: %w", ifindex, err)
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	c.collectGarbage()
	idx := uint32(ifindex)
	rec := c.pods[idx]
	var plans [2]dirPlan
	for d := range plans {
		plans[d].changed = rec == nil || rec.state.Hash[d] != hashes[d]
	}
	var oldAddrs []netip.Addr
	if rec != nil {
		oldAddrs = rec.addrs
	}
	if !plans[0].changed && !plans[1].changed {
		res, err := c.commitAddrs(idx, rec, oldAddrs, addrs, start)
		if err == nil {
			c.attribute(rec, pols)
		}
		return res, err
	}
	if rec == nil && len(c.pods) >= c.limits.Pods {
		return res, fmt.Errorf("commit pod %d: pod map holds %d pods, its capacity: %w", ifindex, len(c.pods), ErrCapacity)
	}
	if err := c.compileChanged(rec, pols, rests, hashes, &plans); err != nil {
		return res, fmt.Errorf("commit pod %d: %w", ifindex, err)
	}
	newState := policyPodState{Hash: hashes}
	if rec != nil {
		newState.Dir, newState.Group = rec.state.Dir, rec.state.Group
	}
	res.Delta, res.Incremental = true, true
	held, wrote := false, false
	for d := range plans {
		pl := &plans[d]
		if !pl.changed {
			continue
		}
		var cur groupRef
		var prev *sharedDirection
		if rec != nil {
			cur, prev = rec.dirs[d].ref, rec.dirs[d].shared
		}
		res.Incremental = res.Incremental && prev != nil && pl.shared.from == prev
		if err := c.place(Direction(d), cur, pl, &res); err != nil {
			c.unplace(plans[:d])
			return res, fmt.Errorf("commit pod %d: %w", ifindex, err)
		}
		gen := nextGen(wordGen(newState.Dir[d]))
		newState.Dir[d] = dirWord(idx, gen, pl.shared.comp.Flags)
		newState.Group[d][gen&1] = pl.target.slot()
		held, wrote = held || pl.target.g != nil, wrote || pl.write
	}
	res.Shared = held && !wrote
	res.Compile = time.Since(start)

	if attach != nil {
		t := time.Now()
		undo, err := attach(ifindex)
		if err != nil {
			c.unplace(plans[:])
			return res, fmt.Errorf("commit pod %d: %w", ifindex, err)
		}
		res.Attach = time.Since(t)
		defer func() {
			if c.pods[idx] == nil && undo != nil {
				undo()
			}
		}()
	}

	t := time.Now()
	for d := range plans {
		if err := c.writeTarget(Direction(d), &plans[d], &res); err != nil {
			c.rollback(plans[:d+1], &res)
			return res, fmt.Errorf("commit pod %d: write %s entries: %w", ifindex, Direction(d), err)
		}
	}
	res.Write = time.Since(t)

	t = time.Now()
	// The pod's new addresses before its word: a pod's first word finds them there.
	undoAddrs, err := c.writeAddrs(idx, oldAddrs, addrs)
	if err != nil {
		c.rollback(plans[:], &res)
		return res, fmt.Errorf("commit pod %d: %w", ifindex, err)
	}
	err = c.store.putPod(idx, &newState)
	c.wrote()
	if err != nil {
		undoAddrs()
		c.rollback(plans[:], &res)
		return res, fmt.Errorf("commit pod %d: switch entry set: %w", ifindex, err)
	}
	res.Switched = time.Now()
	res.Switch = res.Switched.Sub(t)

	t = time.Now()
	if rec == nil {
		rec = &podRecord{}
		c.pods[idx] = rec
	}
	rec.state = newState
	rec.addrs = c.keptAddrs(idx, oldAddrs, addrs)
	for d := range plans {
		pl := &plans[d]
		if !pl.changed {
			continue
		}
		old := rec.dirs[d]
		c.release(old.shared)
		rec.dirs[d] = dirRecord{ref: pl.target, shared: pl.shared}
		if s := pl.target.held(); s != nil {
			s.refs++
		}
		if pl.shared.refs++; pl.shared.refs == 1 {
			c.shared[pl.shared.hash] = pl.shared
			if f := pl.shared.from; f != nil {
				f.from, f.fromDelta = nil, nil
			}
		}
		c.unname(Direction(d), old.ref, &res)
	}
	c.attribute(rec, pols)
	res.Cleanup = time.Since(t)
	return res, nil
}

// commitAddrs is a commit whose directions are unchanged: the pod's addresses alone,
// if they changed.
func (c *core) commitAddrs(idx uint32, rec *podRecord, oldAddrs, addrs []netip.Addr, start time.Time) (CommitResult, error) {
	res := CommitResult{Compile: time.Since(start)}
	if slices.Equal(oldAddrs, addrs) {
		res.Skipped = true
		return res, nil
	}
	if _, err := c.writeAddrs(idx, oldAddrs, addrs); err != nil {
		return res, fmt.Errorf("commit pod %d: %w", idx, err)
	}
	c.wrote()
	rec.addrs = c.keptAddrs(idx, oldAddrs, addrs)
	res.Switched = time.Now()
	return res, nil
}

// compileChanged finds or makes the compile of each changed direction: content some
// pod has committed was validated and compiled then, so it is shared.
func (c *core) compileChanged(rec *podRecord, pols [2]*DirectionPolicy, rests, hashes [2]uint64, plans *[2]dirPlan) error {
	var srcs [2][3][]sourceRule
	for d := range pols {
		pl := &plans[d]
		if !pl.changed {
			continue
		}
		if pl.shared = c.shared[hashes[d]]; pl.shared != nil {
			continue
		}
		// Only host rules of its sets changed: compile just their entries.
		if rec != nil && rec.dirs[d].shared != nil {
			if pl.shared = deriveDirection(rec.dirs[d].shared, pols[d], rests[d], hashes[d]); pl.shared != nil {
				continue
			}
		}
		// One set alone, compiled when it was built, before the lock.
		if pre := precompiled(pols[d]); pre != nil {
			pl.shared = &sharedDirection{hash: hashes[d], comp: pre.comp, borrowed: true, inc: newIncStateOf(pols[d], rests[d], pre.broad)}
			continue
		}
		ns, admin, baseline, err := validateDirection(Direction(d), pols[d])
		if err != nil {
			return err
		}
		srcs[d] = [3][]sourceRule{ns, admin, baseline}
	}
	for d := range pols {
		pl := &plans[d]
		if !pl.changed || pl.shared != nil {
			continue
		}
		if d == 1 && plans[0].changed && hashes[1] == hashes[0] {
			pl.shared = plans[0].shared // both directions the same: one compile
			continue
		}
		comp, err := compileDirection(srcs[d][0], srcs[d][1], srcs[d][2], pols[d].Isolated)
		if err != nil {
			return err
		}
		pl.shared = &sharedDirection{hash: hashes[d], comp: comp}
		if len(pols[d].AllowSets) > 0 && pols[d].Isolated {
			// A broad rule's value over its size fails the compile above
			// already; if not, the state is just not kept.
			pl.shared.inc, _ = newIncState(pols[d], srcs[d][0][:len(pols[d].Allow)], rests[d])
		}
	}
	return nil
}

// place picks the set a changed direction's word will name, and what to write into
// it: a set that holds the content already (nothing), the current group's other set
// when no pod names it (the difference from what it holds), else a new group's set
// (every entry).
func (c *core) place(d Direction, cur groupRef, pl *dirPlan, res *CommitResult) error {
	next := &pl.shared.comp.Entries
	gs := &c.groups[d]
	if next.len() == 0 {
		return nil // the zero groupRef: no entries to look up
	}
	if r, ok := gs.holding(pl.shared.hash); ok {
		pl.target = r
		return nil
	}
	pl.write = true
	if cur.g != nil && cur.other().held().refs == 0 && !c.hasGarbage(d, cur.g.id, cur.set^1) {
		pl.target = cur.other()
		held := pl.target.held()
		switch {
		case held.shared != nil && held.shared == pl.shared.from:
			pl.pre = *pl.shared.fromDelta
		case held.entries.len() == 0:
			pl.pre = fullDelta(next)
			res.Delta = false
		default:
			pl.pre = diffEntries(&held.entries, next)
		}
	} else {
		id, err := c.newGroupID(d)
		if err != nil {
			return err
		}
		pl.target, pl.fresh = groupRef{g: &entryGroup{id: id}}, true
		pl.pre = fullDelta(next)
		res.Delta = false
	}
	for fam, name := range [2]string{"IPv4", "IPv6"} {
		limit := c.limits.EntriesV4
		if fam == 1 {
			limit = c.limits.EntriesV6
		}
		if grow := pl.pre.growth(fam); c.used[d][fam]+grow > limit {
			pl.write, pl.target, pl.fresh = false, groupRef{}, false
			return fmt.Errorf("%s %s trie: %d entries in use + %d new exceed its capacity %d: %w",
				d, name, c.used[d][fam], grow, limit, ErrCapacity)
		}
	}
	if pl.fresh {
		gs.byID[pl.target.g.id] = pl.target.g
	}
	return nil
}

// unplace forgets the new groups of plans that were placed but not written.
func (c *core) unplace(plans []dirPlan) {
	for d := range plans {
		if plans[d].fresh {
			delete(c.groups[d].byID, plans[d].target.g.id)
		}
	}
}

// newGroupID returns an id no group of d holds and no garbage key names.
func (c *core) newGroupID(d Direction) (uint32, error) {
	gs := &c.groups[d]
	for range len(gs.byID) + len(c.garbage[d].k4) + len(c.garbage[d].k6) + 1 {
		gs.last = gs.last%maxGroupID + 1
		if gs.byID[gs.last] == nil && !c.hasGarbage(d, gs.last, 0) && !c.hasGarbage(d, gs.last, 1) {
			return gs.last, nil
		}
	}
	return 0, fmt.Errorf("%s entry groups: no free id: %w", d, ErrCapacity)
}

// writeTarget writes a direction's planned difference into its target set, which no
// pod names.
func (c *core) writeTarget(d Direction, pl *dirPlan, res *CommitResult) error {
	if !pl.write {
		return nil
	}
	gs := &c.groups[d]
	// While written the set holds neither content: no commit may find it.
	gs.changing(pl.target)
	if err := c.apply(d, pl.target.g.id, pl.target.set, &pl.pre, res); err != nil {
		return err
	}
	gs.filled(pl.target, pl.shared)
	return nil
}

// rollback empties the target sets written so far: what they held before is unknown
// after a failed write, so they are dropped, not restored. New groups are forgotten.
func (c *core) rollback(plans []dirPlan, res *CommitResult) {
	for d := range plans {
		pl := &plans[d]
		if !pl.write {
			continue
		}
		held := pl.target.held()
		c.dropSet(Direction(d), pl.target.g.id, pl.target.set, [2]int{len(held.entries.k4), len(held.entries.k6)}, &held.entries, &pl.shared.comp.Entries)
		c.groups[d].emptied(pl.target)
		if pl.fresh {
			delete(c.groups[d].byID, pl.target.g.id)
		}
	}
	res.EntriesWritten, res.EntriesDeleted = 0, 0
}

// unname drops a pod direction's name of a group set. A set no pod names any more is
// brought level with its group's other set when some pod names that one and the
// difference is at most half their entries and fits; else it is deleted. A group whose
// sets no pod names is deleted and its id freed.
func (c *core) unname(d Direction, r groupRef, res *CommitResult) {
	set := r.held()
	if set == nil {
		return
	}
	if set.refs--; set.refs > 0 {
		return
	}
	gs := &c.groups[d]
	o := r.other().held()
	if o.refs > 0 {
		if set.hash == o.hash && set.hash != unknownHash {
			return // level already
		}
		if c.level(d, r, res) {
			return
		}
		res.Delta = false
	}
	res.EntriesDeleted += c.dropSet(d, r.g.id, r.set, [2]int{len(set.entries.k4), len(set.entries.k6)}, &set.entries)
	gs.emptied(r)
	if o.refs == 0 {
		res.EntriesDeleted += c.dropSet(d, r.g.id, r.set^1, [2]int{len(o.entries.k4), len(o.entries.k6)}, &o.entries)
		gs.emptied(r.other())
		delete(gs.byID, r.g.id)
	}
}

// level writes into r, which no pod names, the difference that makes it hold what its
// group's other set holds; it reports whether it did. On a failed write the set is
// left for unname to delete.
func (c *core) level(d Direction, r groupRef, res *CommitResult) bool {
	set, o := r.held(), r.other().held()
	var post entryDelta
	if o.shared != nil && set.shared != nil && o.shared.from == set.shared {
		post = *o.shared.fromDelta
	} else {
		post = diffEntries(&set.entries, &o.entries)
	}
	if post.size() > max(set.entries.len(), o.entries.len())/2 {
		return false
	}
	for fam := range 2 {
		limit := c.limits.EntriesV4
		if fam == 1 {
			limit = c.limits.EntriesV6
		}
		if c.used[d][fam]+post.growth(fam) > limit {
			return false // no room for a second set: drop it instead
		}
	}
	gs := &c.groups[d]
	usedMid := c.used[d]
	entries := set.entries
	gs.changing(r)
	if err := c.apply(d, r.g.id, r.set, &post, res); err != nil {
		// The set is in between: what it may hold is either content.
		c.used[d] = usedMid
		c.dropSet(d, r.g.id, r.set, [2]int{len(entries.k4), len(entries.k6)}, &entries, &o.entries)
		set.entries = dirEntries{}
		res.Delta = false
		return true // dropped already
	}
	set.entries, set.hash, set.shared = o.entries, o.hash, o.shared
	return true
}

// writeChunk is how many entries one store call writes or deletes: large commits
// reuse one buffer of that size instead of allocating keys and values for all.
const writeChunk = 2048

// scratch holds the buffers store calls are given; guarded by core.mu.
type scratch struct {
	k4 []policyLpmKey4
	k6 []policyLpmKey6
	v  []policyRuleValue
}

// apply writes a delta into an entry set of direction d: deletions first, so the
// set never holds more entries than before or after.
func (c *core) apply(d Direction, group, set uint32, dl *entryDelta, res *CommitResult) error {
	s := &c.scratch
	if err := c.deleteKeys(d, group, set, false, dl.old.k4, dl.del4, dl.old.k6, dl.del6); err != nil {
		return err
	}
	c.used[d][0] -= len(dl.del4)
	c.used[d][1] -= len(dl.del6)
	res.EntriesDeleted += len(dl.del4) + len(dl.del6)
	n := dl.next
	for start := 0; start < len(dl.put4); start += writeChunk {
		s.k4, s.v = s.k4[:0], s.v[:0]
		for _, j := range dl.put4[start:min(start+writeChunk, len(dl.put4))] {
			s.k4 = append(s.k4, tagKey4(n.k4[j], group, set))
			s.v = append(s.v, n.vals[n.i4[j]])
		}
		err := c.store.writeEntries(d, s.k4, s.v, nil, nil)
		c.wrote()
		if err != nil {
			return err
		}
	}
	for start := 0; start < len(dl.put6); start += writeChunk {
		s.k6, s.v = s.k6[:0], s.v[:0]
		for _, j := range dl.put6[start:min(start+writeChunk, len(dl.put6))] {
			s.k6 = append(s.k6, tagKey6(n.k6[j], group, set))
			s.v = append(s.v, n.vals[n.i6[j]])
		}
		err := c.store.writeEntries(d, nil, nil, s.k6, s.v)
		c.wrote()
		if err != nil {
			return err
		}
	}
	c.used[d][0] += dl.add4
	c.used[d][1] += dl.add6
	res.EntriesWritten += len(dl.put4) + len(dl.put6)
	return nil
}

// deleteKeys deletes keys of an entry set: those of k4 and k6 at the indices i4 and
// i6, or all of them if all is set.
func (c *core) deleteKeys(d Direction, group, set uint32, all bool, k4 []policyLpmKey4, i4 []int32, k6 []policyLpmKey6, i6 []int32) error {
	s := &c.scratch
	n4, n6 := len(k4), len(k6)
	if !all {
		n4, n6 = len(i4), len(i6)
	}
	for start := 0; start < n4; start += writeChunk {
		s.k4 = s.k4[:0]
		for x := start; x < min(start+writeChunk, n4); x++ {
			j := x
			if !all {
				j = int(i4[x])
			}
			s.k4 = append(s.k4, tagKey4(k4[j], group, set))
		}
		err := c.store.deleteEntries(d, s.k4, nil)
		c.wrote()
		if err != nil {
			return err
		}
	}
	for start := 0; start < n6; start += writeChunk {
		s.k6 = s.k6[:0]
		for x := start; x < min(start+writeChunk, n6); x++ {
			j := x
			if !all {
				j = int(i6[x])
			}
			s.k6 = append(s.k6, tagKey6(k6[j], group, set))
		}
		err := c.store.deleteEntries(d, nil, s.k6)
		c.wrote()
		if err != nil {
			return err
		}
	}
	return nil
}

// dropSet deletes every entry an entry set may hold, given as the keys of lists
// (duplicates allowed); held is how many it holds, per family, when known exactly.
// Keys whose deletion fails are kept as garbage and retried; the commit stands.
// It returns how many entries were deleted.
func (c *core) dropSet(d Direction, group, set uint32, held [2]int, lists ...*dirEntries) int {
	failed := false
	for _, l := range lists {
		if err := c.deleteKeys(d, group, set, true, l.k4, nil, l.k6, nil); err != nil {
			failed = true
		}
	}
	if failed {
		for _, l := range lists {
			c.garbage[d].k4 = append(c.garbage[d].k4, tagKeys4(l.k4, group, set)...)
			c.garbage[d].k6 = append(c.garbage[d].k6, tagKeys6(l.k6, group, set)...)
		}
		return 0
	}
	c.used[d][0] -= held[0]
	c.used[d][1] -= held[1]
	return held[0] + held[1]
}

// release drops a direction's hold on its shared compiled policy.
func (c *core) release(s *sharedDirection) {
	if s == nil {
		return
	}
	if s.refs--; s.refs == 0 && c.shared[s.hash] == s {
		delete(c.shared, s.hash)
	}
}

// hasGarbage reports whether garbage keys of a group's entry set are left.
func (c *core) hasGarbage(d Direction, group, set uint32) bool {
	for _, k := range c.garbage[d].k4 {
		if k.Group == group && k.Tag&tagSets != 0 && tagSet(k.Tag) == set {
			return true
		}
	}
	for _, k := range c.garbage[d].k6 {
		if k.Group == group && k.Tag&tagSets != 0 && tagSet(k.Tag) == set {
			return true
		}
	}
	return false
}

func (c *core) collectGarbage() {
	for d := range c.garbage {
		g := c.garbage[d]
		if g.len() == 0 {
			continue
		}
		if err := c.store.deleteEntries(Direction(d), g.k4, g.k6); err != nil {
			continue
		}
		c.garbage[d] = dirKeys{}
		c.used[d][0] = max(0, c.used[d][0]-len(g.k4))
		c.used[d][1] = max(0, c.used[d][1]-len(g.k6))
	}
}

func (c *core) remove(ifindex int, detach func(ifindex int) error) (CommitResult, error) {
	var res CommitResult
	c.mu.Lock()
	defer c.mu.Unlock()
	c.collectGarbage()
	idx := uint32(ifindex)
	rec := c.pods[idx]
	if rec == nil {
		res.Skipped = true
		if detach != nil {
			return res, detach(ifindex)
		}
		return res, nil
	}
	t := time.Now()
	if err := c.store.deletePod(idx); err != nil {
		return res, fmt.Errorf("remove pod %d: delete state: %w", ifindex, err)
	}
	res.Switched = time.Now()
	res.Switch = res.Switched.Sub(t)
	delete(c.pods, idx)
	// The marker too, whatever the record says: a later pod on this ifindex starts
	// unchecked until its commit names its addresses.
	_ = c.store.deleteAddrs(addrKeys(idx, rec.addrs, true))
	t = time.Now()
	for d := range rec.dirs {
		c.release(rec.dirs[d].shared)
		c.unname(Direction(d), rec.dirs[d].ref, &res)
	}
	res.Cleanup = time.Since(t)
	if detach != nil {
		if err := detach(ifindex); err != nil {
			return res, fmt.Errorf("remove pod %d: %w", ifindex, err)
		}
	}
	return res, nil
}

func (c *core) podList() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]int, 0, len(c.pods))
	for i := range c.pods {
		out = append(out, int(i))
	}
	slices.Sort(out)
	return out
}

// firstMatch returns the action of the first entry matching a packet, 0 if none.
// port must be 0 for port-less protocols. Mirrors first_match in policy.c.
func firstMatch(v *policyRuleValue, proto Protocol, port uint16) Action {
	for _, e := range v.entries() {
		if (e.Proto == uint8(ProtocolAny) || e.Proto == uint8(proto)) && port >= e.Port && port <= e.EndPort {
			return Action(e.Action)
		}
	}
	return 0
}

// evalDirection decides a packet from compiled state the way policy.c does; lookup
// does one longest-prefix lookup in the tier's entries of the active entry set.
func evalDirection(word uint64, lookup func(tier) (*policyRuleValue, bool), proto Protocol, port uint16) bool {
	if !proto.hasPorts() {
		port = 0
	}
	flags := wordFlags(word)
	if flags&flagAdmin != 0 {
		if v, ok := lookup(tierAdmin); ok {
			switch firstMatch(v, proto, port) {
			case ActionAccept:
				return true
			case ActionDeny:
				return false
			}
		}
	}
	if flags&flagIsolated != 0 {
		if flags&flagNamespaced == 0 {
			return false
		}
		v, ok := lookup(tierNamespaced)
		return ok && firstMatch(v, proto, port) != 0
	}
	if flags&flagBaseline != 0 {
		if v, ok := lookup(tierBaseline); ok && firstMatch(v, proto, port) == ActionDeny {
			return false
		}
	}
	return true
}
