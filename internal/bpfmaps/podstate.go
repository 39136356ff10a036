package bpfmaps

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// podStateSize is the size of struct pod_state; slotStride is the distance between
// slots in the mapped array, whose values the kernel lays out on 8-byte boundaries.
var (
	podStateSize = binary.Size(policyPodState{})
	slotStride   = (podStateSize + 7) / 8 * 8
)

// podStates is the kernel's pod state: npa_pod_slot (ifindex → slot) and npa_slot_state
// (the slots), the latter mapped into this process's memory so that a direction's word
// is switched with one atomic store (policy.c says why). Not safe for concurrent use:
// the core's mutex guards it.
type podStates struct {
	slotMap *ebpf.Map
	mem     []byte            // npa_slot_state, shared with the kernel
	slots   map[uint32]uint32 // ifindex → slot, as in slotMap
	free    []uint32          // slots no pod holds
}

// openPodStates maps the state array and loads the slot map: a mapping is kept if its
// slot is in range, held by no other pod and owned by its ifindex in both words;
// others are deleted. Slots no kept mapping holds are cleared: they hold what a first
// commit or a removal left when the process died half-way.
func openPodStates(slotMap, stateMap *ebpf.Map) (*podStates, error) {
	n := stateMap.MaxEntries()
	size := (int(n)*slotStride + os.Getpagesize() - 1) / os.Getpagesize() * os.Getpagesize()
	mem, err := unix.Mmap(stateMap.FD(), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map pod-state array into memory: %w", err)
	}
	p := &podStates{slotMap: slotMap, mem: mem, slots: map[uint32]uint32{}}
	var ifindex, slot uint32
	var drop []uint32
	held := make([]bool, n)
	it := slotMap.Iterate()
	for it.Next(&ifindex, &slot) {
		if slot >= n || held[slot] || wordOwner(p.word(slot, 0).Load()) != ifindex || wordOwner(p.word(slot, 1).Load()) != ifindex {
			drop = append(drop, ifindex)
			continue
		}
		held[slot] = true
		p.slots[ifindex] = slot
	}
	if err := it.Err(); err != nil {
		p.close()
		return nil, fmt.Errorf("iterate pod slot map: %w", err)
	}
	for _, ifindex := range drop {
		if err := slotMap.Delete(ifindex); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			p.close()
			return nil, fmt.Errorf("delete inconsistent slot of interface %d: %w", ifindex, err)
		}
	}
	for s := n; s > 0; s-- { // free holds the lowest slots last: they are taken first
		if !held[s-1] {
			p.clear(s - 1)
			p.free = append(p.free, s-1)
		}
	}
	return p, nil
}

func (p *podStates) close() {
	if p.mem != nil {
		_ = unix.Munmap(p.mem)
		p.mem = nil
	}
}

// word is direction d's state word of a slot, in the shared memory.
func (p *podStates) word(slot uint32, d int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&p.mem[int(slot)*slotStride+8*d]))
}

// hash is direction d's content hash of a slot; only user space reads it.
func (p *podStates) hash(slot uint32, d int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&p.mem[int(slot)*slotStride+16+8*d]))
}

// group is direction d's group slot for the word's set bit set.
func (p *podStates) group(slot uint32, d int, set uint32) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&p.mem[int(slot)*slotStride+32+8*d+4*int(set)]))
}

func (p *podStates) read(slot uint32) policyPodState {
	var st policyPodState
	for d := range 2 {
		st.Dir[d] = p.word(slot, d).Load()
		st.Hash[d] = p.hash(slot, d).Load()
		for set := range 2 {
			st.Group[d][set] = p.group(slot, d, uint32(set)).Load()
		}
	}
	return st
}

// unknownHash stands for "content unknown": it matches no policy's hash (but with
// probability 2^-64), so the next commit rewrites the direction.
const unknownHash = 0

// write switches a slot's state. Per direction, the word is stored with one atomic
// store, so a program reads the old word or the new one. The word and its hash cannot
// change together, so the hash is first set to unknownHash and set to the new hash
// after the word: a process that dies in between leaves a hash that matches no
// content, never one that does not describe the word (a restarted agent would skip
// a commit on it). The stores are sequentially consistent, so they reach the shared
// memory in this order, and the word's store is a release: a program that reads the
// new word (with an acquire, policy.c's load_word) finds the entries the commit wrote
// before it. The word is stored with a swap so that the writes to the old entry set
// that follow the switch cannot become visible before it (policy.c says why that
// matters): XCHG on amd64 is a full barrier; on arm64 SWPAL is acquire and release,
// and without LSE the LDAXR/STLXR loop's store-release is ordered before the
// acquire with which the kernel's trie update takes its lock.
func (p *podStates) write(slot uint32, st *policyPodState) {
	for d := range 2 {
		if p.word(slot, d).Load() == st.Dir[d] && p.hash(slot, d).Load() == st.Hash[d] {
			continue
		}
		p.hash(slot, d).Store(unknownHash)
		// The group slot the new word names, before the word (the current word
		// names the other slot: every switch changes the set).
		set := wordSet(st.Dir[d])
		p.group(slot, d, set).Store(st.Group[d][set])
		p.word(slot, d).Swap(st.Dir[d])
		p.hash(slot, d).Store(st.Hash[d])
	}
}

func (p *podStates) clear(slot uint32) { p.write(slot, &policyPodState{}) }

// put switches an existing pod's state in place. A new pod gets a free slot, filled
// before the mapping is inserted, so a program that finds the mapping finds the state.
func (p *podStates) put(ifindex uint32, st *policyPodState) error {
	if slot, ok := p.slots[ifindex]; ok {
		p.write(slot, st)
		return nil
	}
	if len(p.free) == 0 {
		return fmt.Errorf("pod-state array: all %d slots held: %w", len(p.slots), ErrCapacity)
	}
	slot := p.free[len(p.free)-1]
	p.write(slot, st)
	if err := p.slotMap.Update(ifindex, slot, ebpf.UpdateNoExist); err != nil {
		p.clear(slot)
		return capacityErr(fmt.Errorf("insert slot of interface %d: %w", ifindex, err))
	}
	p.free = p.free[:len(p.free)-1]
	p.slots[ifindex] = slot
	return nil
}

// delete deletes the mapping first (programs stop finding the pod), then clears the
// slot (a program that read the mapping before sees the old words or words owned by
// nobody) and frees it.
func (p *podStates) delete(ifindex uint32) error {
	slot, ok := p.slots[ifindex]
	if !ok {
		return nil
	}
	if err := p.slotMap.Delete(ifindex); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete slot of interface %d: %w", ifindex, err)
	}
	p.clear(slot)
	delete(p.slots, ifindex)
	p.free = append(p.free, slot)
	return nil
}

// all returns every pod's state, by ifindex.
func (p *podStates) all() map[uint32]policyPodState {
	out := make(map[uint32]policyPodState, len(p.slots))
	for ifindex, slot := range p.slots {
		out[ifindex] = p.read(slot)
	}
	return out
}
