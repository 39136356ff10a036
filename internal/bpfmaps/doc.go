// Package bpfmaps is npagent's dataplane: it turns one pod's network policy into eBPF
// map entries, commits them atomically, and polices the pod's traffic with TC (tcx)
// programs on its host-side interface.
//
// What it promises:
//
//   - Semantics: DirectionPolicy.Verdict is the reference. Both backends — EBPF in the
//     kernel and the in-memory backend (Memory) — decide every packet as Verdict does;
//     property tests check the compiled entries and the kernel program against it.
//   - Atomic commits: per pod and direction, a packet is decided by the old policy or
//     the new one, never by a mix. Entries live in the shared tries in entry groups
//     (groups.go): pods whose direction has the same content name the same group, so
//     replicas hold one copy. A group keeps two entry sets (keys tagged with group and
//     set); a pod's direction state word names, through the pod's group slot, the set
//     it uses. A commit writes a set no pod names (its group's other set, or a new
//     group's; nothing when a set holds the content already: CommitResult.Shared),
//     switches the word to it with one atomic store, then brings the set it left level
//     with the same writes once no pod names that one. Both sets hold the committed
//     entries between commits, so a commit writes only the entries that changed
//     (CommitResult.Delta), twice: O(changed entries), not O(policy).
//     The difference is taken on the flattened entries (added keys, keys whose value
//     changed, removed keys) against the committed entries user space keeps (keys and
//     an index into the direction's few distinct values: 20 bytes per IPv4 entry, 32
//     per IPv6), one copy per distinct direction policy: pods committed with the same
//     content share one compile. Validating, hashing and flattening the whole policy
//     remain O(policy) in user space; only the map writes are O(changed entries). A
//     first commit, a change of more than half the entries, or one for which two sets
//     do not fit the trie writes the inactive set in full and deletes the other one
//     (the next commit fills it). The datapath reads the word
//     again after deciding and decides anew if it changed: the word carries a
//     sequence number that changes with every switch, and a set is only written while
//     no pod's word names it, so a packet that read the old word just before a switch never
//     keeps a verdict taken while its set was being rewritten. No per-pod maps are
//     created (see BENCHMARKS.md for the map-in-map comparison).
//   - The switch is safe under a reading program. A pod's state words live in a slot
//     of an array this process maps into its memory; a hash maps the pod's ifindex to
//     its slot for the pod's life. The store is a CPU atomic store and the program's
//     read one aligned 8-byte atomic read, so it sees the old word or the new one;
//     array memory is never reused for anything else. Ordering: the entries a word
//     names are written (syscalls) before the word's store, which is a release (Go's
//     atomic swap: XCHG on amd64, SWPAL on arm64; it also keeps the rewrite of the
//     old set after the switch); the program reads the word with an acquire, so its
//     lookups see those entries. On amd64 (TSO) that read is a plain
//     load. On arm64 it is an atomic fetch-add of 0, fully ordered (the JIT emits
//     LDADDAL, or LDXR/STLXR and DMB ISH), because a BPF load-acquire instruction needs
//     Linux 6.15 and clang 20; it costs an exclusive cache-line access per read. The
//     objects are generated for amd64 and arm64 only, and policy.c refuses to compile
//     for any other target rather than guess its ordering. A word names its owner's ifindex, so a
//     program that read the slot mapping of a pod being removed (hash elements are
//     reused at once) never decides a packet by another pod's word. Keeping the state
//     as a hash value would not be safe: a hash map hands a replaced element to the
//     next update at once, preallocated or not (BPF_F_NO_PREALLOC uses bpf_mem_alloc
//     since Linux 6.1, which reuses immediately), so a program could read another
//     pod's state; updating an array through the syscall is a memcpy, not one store. An LPM trie (replaced nodes freed after an RCU grace period) would be safe
//     but, with 4096 pods, up to twice the per-packet cost (BENCHMARKS.md).
//   - Cheap no-ops: a commit whose content hash equals the committed one writes
//     nothing (CommitResult.Skipped).
//   - All or nothing: a commit rejected for invalid content (ErrInvalidPolicy, naming
//     the direction, rule and field) or capacity (ErrCapacity) leaves nothing visible.
//   - Capacities (Limits, EBPFOptions.ConntrackEntries) are fixed when the maps are
//     created: OpenEBPF refuses pinned maps of another size with a
//     *PinnedCapacityError naming the pin directory, each map and both sizes, and
//     changes nothing. Usage reports each map's entries against its capacity;
//     Entries (EntryCounter) tells what a policy would hold before it is committed,
//     so that callers can divide the tries (reconcile's per-namespace share).
//   - One process per pin directory: OpenEBPF holds an exclusive flock on it until
//     Close (ErrPinDirLocked otherwise); the kernel drops it when the process exits.
//   - Attach order: the programs go at the head of each interface's tcx chain
//     (link.Head()), ahead of programs attached before them or later without a head
//     anchor (a CNI's): none of those can end the chain (TCX_PASS, a redirect) before
//     the policy judged the packet. npagent's verdicts are TCX_NEXT or TCX_DROP, so
//     the programs behind it see every packet it allows.
//   - Survives restarts: maps and tcx links are pinned under bpffs; OpenEBPF adopts
//     what a previous process pinned, so enforcement never lapses: a pod whose
//     interface is there but whose link was removed or detached while no agent ran
//     gets its programs attached again at open (EBPF.Adoption names it). An index
//     that names another interface now (the pod's veth deleted and its index given to
//     a new one) is not the pod's: each attached interface's name and hardware
//     address are recorded in a pinned map (npa_if_ident), and a pod whose links are
//     no longer live and whose index's interface differs from the record is removed
//     at open (Adoption.Replaced), so the new interface inherits neither its policy
//     nor its connection table. It repairs what a
//     process that died mid-commit left (an inactive entry set that is not level with
//     the active one — written before the switch or not yet levelled after it — is
//     deleted; a slot filled but not mapped; a mapping to a slot its pod does not
//     own). State in a layout no release wrote (entries without an entry-set mark,
//     from a development build with one generation per commit) is not migrated:
//     OpenEBPF stops with ErrIncompatiblePins naming the pin path to remove, and
//     changes nothing; so does a pinned map of another shape.
//   - Node traffic is exempt: traffic between a pod and its own node is always
//     allowed, in every tier (admin Deny included) and both directions (kubelet
//     probes; the NetworkPolicy rule and the AWS agent's) — toward the pod only what
//     the node itself sent (ingress_ifindex 0), never a packet forwarded from another
//     interface that claims a node address. The node set (the node's own
//     addresses and extra CIDRs, as cmd/npagent computes them, at most
//     MaxNodePrefixes per family; NodeExemption.SetNodeAddrs) is one LPM trie per
//     family, shared by all pods and pinned. The programs consult it only for a packet
//     the policy and the connection table deny: the verdict is "node or policy", so a
//     packet the policy allows pays nothing for it. A replace writes the new prefixes
//     before deleting the stale ones: an address in both sets is never missing.
//   - Return traffic: each pod's LRU connection table lets replies of an allowed
//     connection through the other direction, when that direction has a policy that
//     could deny them (no entry otherwise); a connection the policy denies cannot be
//     opened from the other side. TCP entries expire soon after a RST or a FIN from
//     each side, each only if within the receiver's window (a forged RST outside it
//     changes nothing, and any later packet but a RST lifts one inside it); entries
//     not answered yet (TCP: handshake not completed) live 30 s, not 5 minutes. A
//     pod's tables are its own, one per side that opened the connections plus one for
//     fragments: a pod opening many flows evicts only its own entries, and peers
//     flooding it (SYNs to an open port, fragments) never evict the flows it opened. ICMP echoes are tracked by their identifier: a pod's ping lets
//     back only echo replies with its identifier, not the peer's own echo requests;
//     other ICMP informational types make no entry. ICMP errors quoting a tracked
//     connection pass too (RELATED: path-MTU discovery works whichever router sends
//     them toward the pod), IPv6 extension headers in the quote included.
//   - Never misjudged: a packet whose headers cannot be fully parsed (truncated, or
//     more than 8 IPv6 extension headers) is dropped in a direction with any policy,
//     never judged as something it is not; later fragments follow their first
//     fragment's verdict. Any ethertype but IPv4, IPv6 and ARP (stacked VLAN tags
//     included, which the node may still route as IP) is dropped there too.
//   - Never widened by a forged packet: a pod's packets leave only with its own
//     addresses as source (PodPolicy.Addrs, kept in a pinned hash of pod, family and
//     address with a per-pod marker; a pod committed without addresses is not
//     checked), except IPv6 :: for NDP/MLD, IPv6 link-local toward link scope and
//     IPv4 0.0.0.0 for DHCP; a packet to the pod from its own address makes no
//     connection entry; RELATED ICMP errors pass only between the quoted flow's
//     endpoints; neighbour discovery passes without policy only on the pod's link
//     (hop limit 255, a link-scope peer or the node at the other end).
//     DirectionPolicy.Verdict's doc is the reference for these cases.
//   - Verdicts are counted (verdicts.go): every packet of a managed pod, per pod,
//     direction and what decided it (VerdictReason: a namespaced allow credited to
//     the direction's objects, an admin or baseline rule by its id in the entries, the
//     default deny credited to the isolating objects, or a non-policy outcome), in
//     per-CPU maps keyed by the state word that judged it, so user space credits each
//     count to the commit in force then (its origins kept per commit), never to a
//     later one. The common allowed path counts in an inlined per-CPU array, not a
//     hash. EBPF.Verdicts reads them at collection time; nothing is done per packet
//     in user space. The counters are not pinned: they start with the process.
//   - A packet can be judged from the maps (judge.go, Judger): Judge reads back the
//     state the kernel holds — the pod's word and entry group, the LPM tries' longest
//     match for the peer (the kernel matches on Lookup), the node set, the pod's
//     addresses, the programs' audit and node-egress modes — in enforce's order, and
//     credits the decision as the counter it would move is credited. The verdict
//     matrix checks it against what the programs did with every probe.
//   - Flow events (flowevents.go): one raw event per denied packet (and, in
//     FlowEventsAll, per connection entry an allowed packet makes) through a BPF ring
//     buffer, after a per-pod token bucket in the program, taken under a spin lock so
//     the pod's limit holds across every CPU its packets reach; what the bucket or a
//     full buffer refuses is counted per CPU (FlowEventsSuppressed), never waited for.
//     OpenFlowEvents sets the mode and rate and reads them; AttributeFlow credits an
//     event as the counters are credited.
//
// Nothing of Kubernetes is imported here; the reconcile loop translates objects into
// PodPolicy values.
package bpfmaps
