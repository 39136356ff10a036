package bpfmaps

// Entry groups: the tries hold each direction content once, however many pods hold it.
//
// A trie entry is keyed by its group (policyLpmKey4.Group), not by a pod. A group has
// two entry sets (the tag's set bit); a pod's direction names one of them through its
// state (policyPodState.Group, the slot its word's set bit picks). Pods whose direction
// has the same content hash name the same set, so ten replicas of a 10k-peer policy
// hold 10k entries, not 100k, and a commit that finds its content already held writes
// no entry: it only switches the pod's word.
//
// A set is written only while no pod names it (policy.c says why that keeps a packet's
// lookups consistent): a pod whose content changes writes the difference into its
// group's other set when no pod names that one (the per-pod delta commit of a pod that
// shares nothing), else into a new group. A set no pod names any more is brought level
// with its group's other set when that is cheap, so the next change is again a
// difference, and deleted otherwise; a group no pod names is deleted and its id freed.

// maxGroupID bounds group ids: a pod's group slot holds id << 1 | set in 32 bits.
const maxGroupID = 1<<31 - 1

// entryGroup is one group of entries of a direction's tries.
type entryGroup struct {
	id   uint32
	sets [2]groupSet
}

// groupSet is what one entry set of a group holds, and how many pods name it.
type groupSet struct {
	entries dirEntries       // what the set holds: a complete content, or nothing
	hash    uint64           // the content's hash; unknownHash when empty or unknown
	shared  *sharedDirection // the compile it holds; nil if adopted or empty
	refs    int              // pod directions whose word names the set
}

// groupRef names an entry set of a group; the zero groupRef names no entries (a
// direction whose content has none: lookups under group 0 find nothing).
type groupRef struct {
	g   *entryGroup
	set uint32
}

// slot is the value of a pod's group slot that names r (policy.c: GROUP_ID, GROUP_SET).
func (r groupRef) slot() uint32 {
	if r.g == nil {
		return 0
	}
	return r.g.id<<1 | r.set
}

func (r groupRef) id() uint32 {
	if r.g == nil {
		return 0
	}
	return r.g.id
}

// held is the set r names; nil for the zero groupRef.
func (r groupRef) held() *groupSet {
	if r.g == nil {
		return nil
	}
	return &r.g.sets[r.set]
}

// other is the group's other set.
func (r groupRef) other() groupRef { return groupRef{r.g, r.set ^ 1} }

// noEntries is what the zero groupRef holds.
var noEntries dirEntries

// entriesOf is what r names.
func entriesOf(r groupRef) *dirEntries {
	if s := r.held(); s != nil {
		return &s.entries
	}
	return &noEntries
}

// groups is one direction's entry groups; guarded by core.mu.
type groups struct {
	byID   map[uint32]*entryGroup
	byHash map[uint64]groupRef // a set holding each content some pod names
	last   uint32              // the id given out last
}

func newGroups() groups {
	return groups{byID: map[uint32]*entryGroup{}, byHash: map[uint64]groupRef{}}
}

// holding returns a set that holds content hash h, if any.
func (gs *groups) holding(h uint64) (groupRef, bool) {
	r, ok := gs.byHash[h]
	return r, ok && r.held().hash == h
}

// filled records that r now holds s's content in full.
func (gs *groups) filled(r groupRef, s *sharedDirection) {
	set := r.held()
	set.entries, set.hash, set.shared = s.comp.Entries, s.hash, s
	gs.byHash[s.hash] = r
}

// changing records that r is being written: it holds no content a commit may find,
// while its entries still say what it held (the difference is taken from them).
func (gs *groups) changing(r groupRef) {
	set := r.held()
	if cur, ok := gs.byHash[set.hash]; ok && cur == r {
		delete(gs.byHash, set.hash)
		if o := r.other().held(); o.hash == set.hash && o.hash != unknownHash {
			gs.byHash[o.hash] = r.other()
		}
	}
	set.hash, set.shared = unknownHash, nil
}

// emptied records that r holds nothing (any more, or in a known state).
func (gs *groups) emptied(r groupRef) {
	gs.changing(r)
	r.held().entries = dirEntries{}
}
