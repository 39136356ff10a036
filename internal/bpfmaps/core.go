package bpfmaps

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"time"
)

// The map keys and values are the types bpf2go generates from policy.c (see the
// structs there for their meaning): policyLpmKey4 and policyLpmKey6 (trie keys:
// Prefixlen counts the 64 bits of Ifindex and Tag plus the prefix bits, so lookups
// never cross pods or generations), policyRuleValue and policyPortRule (trie values),
// and policyPodState, a pod's slot in the state array: per direction one word (see
// dirWord) the datapath reads with a single load and a commit switches with one
// atomic store, and a content hash only user space reads (it lets a restarted agent
// skip unchanged commits).

// flagBits is how many low bits of a state word hold the direction's flags.
const flagBits = 4

// dirWord is a direction's state word: the owner's ifindex in the high 32 bits (the
// datapath ignores a word another pod owns), generation<<flagBits | flags in the low 32.
func dirWord(owner, gen, flags uint32) uint64 {
	return uint64(owner)<<32 | uint64(gen<<flagBits|flags)
}
func wordOwner(w uint64) uint32 { return uint32(w >> 32) }
func wordGen(w uint64) uint32   { return uint32(w) >> flagBits }
func wordFlags(w uint64) uint32 { return uint32(w) & (1<<flagBits - 1) }
func entryTag(gen uint32, t tier) uint32 {
	return gen<<2 | uint32(t)
}
func tagGen(tag uint32) uint32 { return tag >> 2 }

// nextGeneration never returns 0, so a direction that never had entries (generation
// 0) never collides with a live one.
func nextGeneration(g uint32) uint32 { return g%maxGeneration + 1 }

// Limits are the dataplane's capacities. Zero fields take the defaults.
type Limits struct {
	// Pods is how many pods can hold state. Default 4096.
	Pods int
	// EntriesV4 is the capacity of each direction's IPv4 trie, shared by all pods and
	// by the two generations a commit briefly holds. Default 65536.
	EntriesV4 int
	// EntriesV6 is the same for the IPv6 tries. Default 16384.
	EntriesV6 int
}

func (l Limits) withDefaults() Limits {
	if l.Pods <= 0 {
		l.Pods = 4096
	}
	if l.EntriesV4 <= 0 {
		l.EntriesV4 = 65536
	}
	if l.EntriesV6 <= 0 {
		l.EntriesV6 = 16384
	}
	return l
}

// store is what a backend does to its maps. Implementations: the kernel maps (EBPF)
// and Go maps (Memory). The core decides what to write and in which order.
type store interface {
	// writeEntries inserts entries of a generation nothing refers to yet; all or
	// nothing: on error the store holds none of them.
	writeEntries(d Direction, k4 []policyLpmKey4, v4 []policyRuleValue, k6 []policyLpmKey6, v6 []policyRuleValue) error
	// deleteEntries deletes in the order given.
	deleteEntries(d Direction, k4 []policyLpmKey4, k6 []policyLpmKey6) error
	putPod(ifindex uint32, st *policyPodState) error
	deletePod(ifindex uint32) error
}

// podRecord is what the core remembers of a pod with committed state.
type podRecord struct {
	state policyPodState
	keys  [2]dirKeys // entries of each direction's active generation
}

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
	used    [2][2]int  // entries in the tries, [direction][0 IPv4, 1 IPv6]
	garbage [2]dirKeys // entries whose deletion failed; retried on the next commit
}

func newCore(l Limits, s store) *core {
	return &core{limits: l.withDefaults(), store: s, pods: map[uint32]*podRecord{}}
}

// attachFunc readies a pod's interface before state is written (a no-op returning a
// nil undo when it is ready already); undo reverses it if the commit then fails for a
// pod without state. nil for the in-memory backend.
type attachFunc func(ifindex int) (undo func(), err error)

func (c *core) commit(ifindex int, p PodPolicy, attach attachFunc) (CommitResult, error) {
	var res CommitResult
	start := time.Now()
	if ifindex <= 0 || ifindex > 1<<31-1 {
		return res, fmt.Errorf("commit pod %d: ifindex: out of range: %w", ifindex, ErrInvalidPolicy)
	}
	pols := [2]*DirectionPolicy{&p.Ingress, &p.Egress}
	// Hash first: content equal to the committed content was validated when it was
	// committed, so an unchanged re-commit (a relist) costs the hash alone. Invalid
	// values hash differently from every valid one (they are encoded raw).
	hashes := [2]uint64{hashDirection(pols[0]), hashDirection(pols[1])}

	c.mu.Lock()
	defer c.mu.Unlock()
	c.collectGarbage()
	idx := uint32(ifindex)
	rec := c.pods[idx]
	var changed [2]bool
	for d := range changed {
		changed[d] = rec == nil || rec.state.Hash[d] != hashes[d]
	}
	if !changed[0] && !changed[1] {
		res.Skipped = true
		res.Compile = time.Since(start)
		return res, nil
	}
	var srcs [2][3][]sourceRule
	for d := range pols {
		if !changed[d] {
			continue
		}
		ns, admin, baseline, err := validateDirection(Direction(d), pols[d])
		if err != nil {
			return res, fmt.Errorf("commit pod %d: %w", ifindex, err)
		}
		srcs[d] = [3][]sourceRule{ns, admin, baseline}
	}
	if rec == nil && len(c.pods) >= c.limits.Pods {
		return res, fmt.Errorf("commit pod %d: pod map holds %d pods, its capacity: %w", ifindex, len(c.pods), ErrCapacity)
	}

	newState := policyPodState{Hash: hashes}
	if rec != nil {
		newState.Dir = rec.state.Dir
	}
	var newKeys [2]dirKeys
	var newVals [2][2][]policyRuleValue
	for d := range changed {
		if !changed[d] {
			continue
		}
		comp, err := compileDirection(srcs[d][0], srcs[d][1], srcs[d][2], pols[d].Isolated)
		if err != nil {
			return res, fmt.Errorf("commit pod %d: %w", ifindex, err)
		}
		gen := nextGeneration(wordGen(newState.Dir[d]))
		newState.Dir[d] = dirWord(idx, gen, comp.Flags)
		n4 := 0
		for i := range comp.Entries {
			if comp.Entries[i].Prefix.Addr().Is4() {
				n4++
			}
		}
		newKeys[d].k4 = make([]policyLpmKey4, 0, n4)
		newVals[d][0] = make([]policyRuleValue, 0, n4)
		newKeys[d].k6 = make([]policyLpmKey6, 0, len(comp.Entries)-n4)
		newVals[d][1] = make([]policyRuleValue, 0, len(comp.Entries)-n4)
		for i := range comp.Entries {
			e := &comp.Entries[i]
			tag := entryTag(gen, e.Tier)
			if e.Prefix.Addr().Is4() {
				newKeys[d].k4 = append(newKeys[d].k4, policyLpmKey4{Prefixlen: 64 + uint32(e.Prefix.Bits()), Ifindex: idx, Tag: tag, Addr: e.Prefix.Addr().As4()})
				newVals[d][0] = append(newVals[d][0], e.Value)
			} else {
				newKeys[d].k6 = append(newKeys[d].k6, policyLpmKey6{Prefixlen: 64 + uint32(e.Prefix.Bits()), Ifindex: idx, Tag: tag, Addr: e.Prefix.Addr().As16()})
				newVals[d][1] = append(newVals[d][1], e.Value)
			}
		}
		for fam, n := range [2]int{len(newKeys[d].k4), len(newKeys[d].k6)} {
			limit, name := c.limits.EntriesV4, "IPv4"
			if fam == 1 {
				limit, name = c.limits.EntriesV6, "IPv6"
			}
			if c.used[d][fam]+n > limit {
				return res, fmt.Errorf("commit pod %d: %s %s trie: %d entries in use + %d new exceed its capacity %d: %w",
					ifindex, Direction(d), name, c.used[d][fam], n, limit, ErrCapacity)
			}
		}
	}
	res.Compile = time.Since(start)

	if attach != nil {
		t := time.Now()
		undo, err := attach(ifindex)
		if err != nil {
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
	var written [2]bool
	rollback := func() {
		for d := range written {
			if written[d] {
				_ = c.store.deleteEntries(Direction(d), newKeys[d].k4, newKeys[d].k6)
			}
		}
	}
	for d := range changed {
		if !changed[d] {
			continue
		}
		if err := c.store.writeEntries(Direction(d), newKeys[d].k4, newVals[d][0], newKeys[d].k6, newVals[d][1]); err != nil {
			rollback()
			return res, fmt.Errorf("commit pod %d: write %s entries: %w", ifindex, Direction(d), err)
		}
		written[d] = true
		res.EntriesWritten += newKeys[d].len()
	}
	res.Write = time.Since(t)

	t = time.Now()
	if err := c.store.putPod(idx, &newState); err != nil {
		rollback()
		res.EntriesWritten = 0
		return res, fmt.Errorf("commit pod %d: switch generation: %w", ifindex, err)
	}
	res.Switch = time.Since(t)

	t = time.Now()
	if rec == nil {
		rec = &podRecord{}
		c.pods[idx] = rec
	}
	rec.state = newState
	for d := range changed {
		if !changed[d] {
			continue
		}
		old := rec.keys[d]
		rec.keys[d] = newKeys[d]
		c.used[d][0] += len(newKeys[d].k4)
		c.used[d][1] += len(newKeys[d].k6)
		res.EntriesDeleted += c.deleteGeneration(Direction(d), old)
	}
	res.Cleanup = time.Since(t)
	return res, nil
}

// deleteGeneration deletes a generation that is no longer active, shortest prefixes
// first. That order is what keeps a packet that read the old generation just before
// the switch correct: while its entries disappear, a lookup returns the true longest
// match or nothing (every shorter match is gone before a longer one), and the datapath
// re-reads the pod's state on a miss and retries with the new generation.
// Entries whose deletion fails are kept as garbage and retried; the commit stands.
func (c *core) deleteGeneration(d Direction, k dirKeys) int {
	if k.len() == 0 {
		return 0
	}
	k4, k6 := deletionOrder(k)
	if err := c.store.deleteEntries(d, k4, k6); err != nil {
		c.garbage[d].k4 = append(c.garbage[d].k4, k4...)
		c.garbage[d].k6 = append(c.garbage[d].k6, k6...)
		return 0
	}
	c.used[d][0] -= len(k4)
	c.used[d][1] -= len(k6)
	return len(k4) + len(k6)
}

// deletionOrder returns the keys shortest prefix first (see deleteGeneration).
func deletionOrder(k dirKeys) ([]policyLpmKey4, []policyLpmKey6) {
	k4 := slices.Clone(k.k4)
	slices.SortStableFunc(k4, func(a, b policyLpmKey4) int { return cmp.Compare(a.Prefixlen, b.Prefixlen) })
	k6 := slices.Clone(k.k6)
	slices.SortStableFunc(k6, func(a, b policyLpmKey6) int { return cmp.Compare(a.Prefixlen, b.Prefixlen) })
	return k4, k6
}

func (c *core) collectGarbage() {
	for d := range c.garbage {
		g := c.garbage[d]
		if g.len() == 0 {
			continue
		}
		c.garbage[d] = dirKeys{}
		c.deleteGeneration(Direction(d), g)
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
	res.Switch = time.Since(t)
	delete(c.pods, idx)
	t = time.Now()
	for d := range rec.keys {
		res.EntriesDeleted += c.deleteGeneration(Direction(d), rec.keys[d])
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
// does one longest-prefix lookup in the tier's entries of the active generation.
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
