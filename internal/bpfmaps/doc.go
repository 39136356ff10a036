// Package bpfmaps is npagent's dataplane: it turns one pod's network policy into eBPF
// map entries, commits them atomically, and polices the pod's traffic with TC (tcx)
// programs on its host-side interface.
//
// What it promises:
//
//   - Semantics: DirectionPolicy.Verdict is the reference. Both backends — EBPF in the
//     kernel and the in-memory backend (Memory) — decide every packet as Verdict does;
//     property tests check the compiled entries and the kernel program against it.
//   - Atomic commits: per pod, a packet is decided by the old policy or the new one,
//     never by a mix. New entries are written under a fresh generation, one update of
//     the pod's state switches to it, then the old generation is deleted (shortest
//     prefixes first, so an in-flight lookup finds the old answer or nothing, and
//     retries on the new generation). One update of the pod's state switches both
//     directions; no per-pod maps are created (see BENCHMARKS.md for the map-in-map
//     comparison).
//   - The switch is safe under a reading program: the pod-state map is an LPM trie
//     used as an exact-match map, because a trie update publishes a new node and frees
//     the replaced one only after an RCU grace period, so a program (which runs under
//     rcu_read_lock) reads the pod's old state or its new one, never memory already
//     reused. A hash map would not do: it hands a replaced element to the next update
//     at once, preallocated or not (BPF_F_NO_PREALLOC uses bpf_mem_alloc since Linux
//     6.1, which also reuses immediately), and an array is updated with memcpy, not one
//     atomic store. The cost is a trie walk instead of a hash lookup per state read.
//   - Cheap no-ops: a commit whose content hash equals the committed one writes
//     nothing (CommitResult.Skipped).
//   - All or nothing: a commit rejected for invalid content (ErrInvalidPolicy, naming
//     the direction, rule and field) or capacity (ErrCapacity) leaves nothing visible.
//   - Survives restarts: maps and tcx links are pinned under bpffs; OpenEBPF adopts
//     what a previous process pinned, so enforcement never lapses. Pod states an older
//     build pinned in its hash map (npa_pods) are moved into the trie before the links
//     switch to the new programs, and the move is logged; a pinned map this build
//     cannot adopt or migrate stops OpenEBPF with an error naming it.
//   - Return traffic: an LRU connection table lets replies of an allowed connection
//     through the other direction; a connection the policy denies cannot be opened
//     from the other side.
//
// Nothing of Kubernetes is imported here; the reconcile loop translates objects into
// PodPolicy values.
package bpfmaps
