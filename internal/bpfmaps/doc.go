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
//     retries on the new generation). One plain hash update switches both directions;
//     no per-pod maps are created (see BENCHMARKS.md for the map-in-map comparison).
//   - Cheap no-ops: a commit whose content hash equals the committed one writes
//     nothing (CommitResult.Skipped).
//   - All or nothing: a commit rejected for invalid content (ErrInvalidPolicy, naming
//     the direction, rule and field) or capacity (ErrCapacity) leaves nothing visible.
//   - Survives restarts: maps and tcx links are pinned under bpffs; OpenEBPF adopts
//     what a previous process pinned, so enforcement never lapses.
//   - Return traffic: an LRU connection table lets replies of an allowed connection
//     through the other direction; a connection the policy denies cannot be opened
//     from the other side.
//
// Nothing of Kubernetes is imported here; the reconcile loop translates objects into
// PodPolicy values.
package bpfmaps
