//go:build ignore

// npagent's per-pod network policy datapath. Two TC programs attached with tcx to a
// pod's host-side interface: from_pod on its ingress hook (packets the pod sends: the
// pod's EGRESS policy, peer = destination) and to_pod on its egress hook (packets the
// pod receives: its INGRESS policy, peer = source).
//
// Go uses the types bpf2go generates from these structs (policyLpmKey4, ...) as they are.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

char __license[] SEC("license") = "Dual BSD/GPL";

#define DIR_INGRESS 0
#define DIR_EGRESS 1

#define TIER_NAMESPACED 0
#define TIER_ADMIN 1
#define TIER_BASELINE 2

#define FLAG_ISOLATED (1u << 0)
#define FLAG_ADMIN (1u << 1)
#define FLAG_BASELINE (1u << 2)
#define FLAG_NAMESPACED (1u << 3)

#define ACTION_ACCEPT 1
#define ACTION_DENY 2
#define ACTION_PASS 3

#define MAX_PORT_RULES 24
#define MAX_ATTEMPTS 4

// tcx verdicts (TCX_NEXT lets later programs and the stack see the packet).
#define VERDICT_NEXT -1
#define VERDICT_DROP 2

#define IPPROTO_ICMPV6_ 58
#define NEXTHDR_HOP 0
#define NEXTHDR_ROUTING 43
#define NEXTHDR_FRAGMENT 44
#define NEXTHDR_DEST 60

struct lpm_key4 {
	__u32 prefixlen; // 64 + prefix bits: group and tag always match in full
	__u32 group; // the entry group: pods whose direction has the same rules share one
	__u32 tag; // TAG_SETS | the group's entry set << 2 | tier
	__u8 addr[4];
};

struct lpm_key6 {
	__u32 prefixlen;
	__u32 group;
	__u32 tag;
	__u8 addr[16];
};

struct port_rule {
	__u16 port; // all ports: [0, 65535]; port-less packets are matched with port 0
	__u16 end_port;
	__u8 proto; // 0 = any
	__u8 action;
	// The rule that put it here, for verdict counters: in the admin and baseline
	// tiers the rule's position in its tier by priority, plus one; 0 in the namespaced
	// tier (its values are unions of every allowing rule's ports, credited to the
	// direction's objects). Part of the content: entry groups share it.
	__u16 rule;
};

struct rule_value {
	__u32 count; // 0: a deny entry (an except no other rule covers)
	__u32 pad;
	struct port_rule rules[MAX_PORT_RULES];
};

// A direction's state word: the owner's ifindex in the high 32 bits, then a sequence
// number (27 bits, changed by every switch), the active set (1 bit) and FLAG_* (4
// bits). The set picks one of the pod's two group slots (pod_state.group), which names
// the entries lookups use. Entry tags carry TAG_SETS, which tags written by builds with one generation per
// commit never have (their tags stay below 1 << 30).
#define WORD_OWNER(w) ((__u32)((w) >> 32))
#define WORD_SET(w) (((__u32)(w) >> 4) & 1)
#define WORD_FLAGS(w) ((__u32)(w) & 0xf)
#define TAG_SETS (1u << 31)

// A pod's direction names its entries through the word's set bit: group[dir][set] is
// the entry group and the group's entry set (GROUP_ID, GROUP_SET) the lookups use.
// Pods whose direction has the same rules name the same group, so a policy selecting
// many pods on the node is held once (one tenant's replicas cannot fill the tries).
// User space writes the slot the word does not name, then switches the word.
struct pod_state {
	__u64 dir[2]; // state word per direction
	__u64 hash[2]; // content hashes, for user space only
	__u32 group[2][2]; // [direction][the word's set]: group id << 1 | the group's entry set
};

#define GROUP_ID(g) ((g) >> 1)
#define GROUP_SET(g) ((g) & 1)

struct ct_key {
	__u32 ifindex;
	__u8 dir; // the direction whose policy allowed the connection; | CT_FRAGMENT for a datagram's fragments
	__u8 proto;
	__u16 family;
	__u16 sport;
	__u16 dport;
	__u8 saddr[16];
	__u8 daddr[16];
};

struct ct_value {
	__u64 last_seen_ns;
	__u32 state; // CT_*: which timeout applies
	// TCP, per side ([0] the opener, [1] its peer): the acknowledgement number and the
	// window (as sent: unscaled) of the side's last packet with ACK set (CT_ACK_*), so
	// an RST or FIN from the other side can be checked against what this side will
	// accept (tcp_state).
	__u32 ack[2];
	__u16 win[2];
};

// ct_value.state. TCP: a FIN seen from each side, a RST from either (each only within
// the receiver's window, tcp_state); a new SYN clears everything (the ports were
// reused). CT_FRAGMENT marks a fragmented datagram's entry (key dir | CT_FRAGMENT, the
// IP ID in sport and dport), whose later fragments pass. CT_REPLIED: the peer has
// answered; CT_SYN: the connection was opened by a SYN whose handshake has not
// completed (the opener has not acknowledged the peer's answer); either way short of
// an answered, established connection the entry has the unreplied timeout.
#define CT_FIN_FWD (1u << 0)
#define CT_FIN_REV (1u << 1)
#define CT_RST (1u << 2)
#define CT_FRAGMENT (1u << 3)
#define CT_REPLIED (1u << 4)
#define CT_SYN (1u << 5)
#define CT_ACK_FWD (1u << 6) // ack[0] and win[0] are the opener's
#define CT_ACK_REV (1u << 7) // ack[1] and win[1] are the peer's

#define TCP_FIN 0x01
#define TCP_SYN 0x02
#define TCP_RST 0x04
#define TCP_ACK 0x10

// Capacities are set by the loader; these are placeholders.

// A pod's state lives in a slot of npa_slot_state, an array user space maps into its
// memory; npa_pod_slot maps the pod's ifindex to its slot, which stays the same for the
// pod's life. A commit's switch is one atomic 8-byte store of the direction's word
// through that mapping, and a program reads the word with one aligned 8-byte load, so
// it sees the old word or the new one. Array memory is never freed or reused for
// anything but this slot.
//
// Why not keep the state in a hash map: a program holds the pointer
// bpf_map_lookup_elem returned until it loads the word, and a hash map hands a
// replaced or deleted element to a later update at once — a preallocated one makes it
// the CPU's spare for the next replace, a BPF_F_NO_PREALLOC one (bpf_mem_alloc, Linux
// >= 6.1) frees it with bpf_mem_cache_free to a per-CPU list the next allocation takes
// from — so another pod's state could be memcpy'd into memory a program is reading.
// Nor an array updated with the update syscall: it copies the value with memcpy, not one
// store. An LPM trie would be safe (replaced nodes are freed after an RCU grace period)
// but costs a helper call and a trie walk per state read where a hash lookup is inlined:
// with 4096 pods, up to twice the per-packet cost (BENCHMARKS.md).
//
// npa_pod_slot is a hash too, but only ever inserted into and deleted from, never
// updated: its element can be reused only after the pod's removal. The owner in the
// word covers that case. A program that read a stale slot number finds a word of the
// removed pod (its last policy decides, as for a packet just before the removal), a
// word of another pod or none (the packet is unmanaged, as after the removal).
//
// Ordering: user space writes an entry set (syscalls) before the word that names it,
// and the program looks entries up after reading the word. The lookups must not be
// satisfied from memory older than the word: the trie walk's loads do not depend on
// the word's value (only the key does), so nothing but an acquire (or stronger) load
// of the word orders them after it. The writer's side is a release: the Go swap
// (atomic.Uint64.Swap: XCHG on amd64, SWPAL on arm64) follows the syscalls that wrote
// the entries in the same goroutine. The reader's side is load_word below, per target.
//
// After a switch user space may rewrite the entry set the word named before (to bring
// it level with the new one, or for another pod once no pod names it), so a packet
// that read the old word may see that set change under its lookups. enforce therefore
// reads the word again after deciding and decides anew when it changed: the word's
// sequence number changes with every switch, a pod's group slot is only written while
// its word does not name it, and a group's entry set only while no pod's word names
// it, so an unchanged word means the entries the lookups used did not change
// meanwhile. That needs the lookups' loads ordered before the
// second read (x86: loads are not reordered with later loads; arm64: load_word's
// fetch-add is a release too) and the writer's switch ordered before its writes to
// the old set (the swap is a full barrier on both targets).
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);   // ifindex
	__type(value, __u32); // slot in npa_slot_state
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} npa_pod_slot SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct pod_state);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} npa_slot_state SEC(".maps");

#define TRIE(name, keytype)                                                            \
	struct {                                                                       \
		__uint(type, BPF_MAP_TYPE_LPM_TRIE);                                    \
		__type(key, struct keytype);                                           \
		__type(value, struct rule_value);                                      \
		__uint(max_entries, 1);                                                \
		__uint(map_flags, BPF_F_NO_PREALLOC);                                  \
		__uint(pinning, LIBBPF_PIN_BY_NAME);                                   \
	} name SEC(".maps")

TRIE(npa_in_v4, lpm_key4);
TRIE(npa_in_v6, lpm_key6);
TRIE(npa_eg_v4, lpm_key4);
TRIE(npa_eg_v6, lpm_key6);

// Connection tracking: three LRU tables per pod (the inner maps of npa_ct_tables,
// keyed by the pod's ifindex and the table's kind; user space creates a pod's tables
// before its programs are attached, and sizes them): the connections its egress policy
// allowed (the pod opened them), those its ingress policy allowed (a peer opened them),
// and fragmented datagrams' entries. So a pod opening many flows evicts only its own
// entries, never another pod's; peers opening connections to the pod (a SYN flood to
// an allowed port) or sending fragments evict only entries of their kind, never the
// connections the pod opened. A pod without a table (none yet, or removed) tracks
// nothing in it.
#define CT_TABLE_FRAGMENTS 2 // ct_table_key.kind; connection tables: DIR_INGRESS, DIR_EGRESS

struct ct_table_key {
	__u32 ifindex;
	__u32 kind; // the direction whose policy allowed the connections, or CT_TABLE_FRAGMENTS
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__type(key, struct ct_table_key);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, struct {
		__uint(type, BPF_MAP_TYPE_LRU_HASH);
		// Sizes, not types: clang 14 emits the types of an inner map's key and value
		// as forward declarations, which loaders cannot size.
		__uint(key_size, sizeof(struct ct_key));
		__uint(value_size, sizeof(struct ct_value));
		__uint(max_entries, 1);
	});
} npa_ct_tables SEC(".maps");

// The node's own addresses (every address of the node's interfaces, and configured
// CIDRs), one LPM trie per family keyed by prefix. Traffic between a pod and its node
// is always allowed, in every tier and both directions (kubelet probes; a node-local
// DNS cache): a packet whose peer is in the trie passes whatever the pod's policy
// says (from the pod, only without node_egress_policy). User space replaces the set
// by writing the new entries before deleting stale ones, so a node address present
// before and after is never missing in between.
struct node_key4 {
	__u32 prefixlen;
	__u8 addr[4];
};

struct node_key6 {
	__u32 prefixlen;
	__u8 addr[16];
};

#define NODE_TRIE(name, keytype)                                                       \
	struct {                                                                       \
		__uint(type, BPF_MAP_TYPE_LPM_TRIE);                                    \
		__type(key, struct keytype);                                           \
		__type(value, __u8);                                                   \
		__uint(max_entries, 1024);                                             \
		__uint(map_flags, BPF_F_NO_PREALLOC);                                  \
		__uint(pinning, LIBBPF_PIN_BY_NAME);                                   \
	} name SEC(".maps")

NODE_TRIE(npa_node_v4, node_key4);
NODE_TRIE(npa_node_v6, node_key6);

// A pod's own addresses (anti-spoofing): the addresses whose host route names the
// pod's interface, written by each commit (PodPolicy.Addrs). from_pod drops a packet
// whose source is none of them (own_source), and ARP whose sender is none
// (arp_own_sender); to_pod makes no connection entry for a
// packet whose source is one of them (a hairpin: the pod talking to itself through
// the node can never create state that later passes its own egress). A key with
// family 0 and a zero address marks a pod whose addresses are known: a pod without
// it (committed without addresses) is not checked. Sized by the loader: pods times
// (MaxPodAddrs + 1).
struct addr_key {
	__u32 ifindex;
	__u32 family; // 4 or 6; 0 for the pod's marker
	__u8 addr[16]; // IPv4: the first 4 bytes, the rest zero
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct addr_key);
	__type(value, __u8);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} npa_pod_addrs SEC(".maps");

// Verdict counters: per CPU, keyed by what decided a packet (REASON_*, the deciding
// port rule's id) and the state word that judged it (its low 32 bits: sequence
// number, set and flags), so user space attributes each count to the commit in force
// when the packet was judged, never to a later one. Not pinned: counts start with the
// process that loaded the programs, as its own telemetry does. A key that finds the
// map full is counted in npa_verdicts_lost instead. Sized by the loader.
struct verdict_key {
	__u32 ifindex;
	__u32 gen; // the judging state word's low 32 bits; 0: no policy was ever committed
	__u16 rule; // port_rule.rule of the deciding entry, 0 if none
	__u8 dir;
	__u8 reason; // REASON_*
};

struct verdict_value {
	__u64 packets;
	__u64 bytes;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__type(key, struct verdict_key);
	__type(value, struct verdict_value);
	__uint(max_entries, 1);
} npa_verdicts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 1);
} npa_verdicts_lost SEC(".maps");

// What decided a packet (VerdictReason in Go). Below REASON_DENIED it passed.
#define REASON_NO_POLICY 1 // the direction has no policy
#define REASON_ALLOW 2 // a namespaced allow entry
#define REASON_ADMIN_ACCEPT 3 // an admin Accept rule
#define REASON_BASELINE_ACCEPT 4 // a baseline Accept rule
#define REASON_DEFAULT_ALLOW 5 // not isolated, and no admin or baseline rule decided
#define REASON_CT_REPLY 6 // a reply of a connection the other direction allowed
#define REASON_NODE 7 // traffic between the pod and its node
#define REASON_ICMP_RELATED 8 // an ICMP error quoting a tracked connection
#define REASON_NDP 9 // neighbour discovery on the link
#define REASON_FRAGMENT 10 // a later fragment of a datagram whose first passed
#define REASON_ARP 11
#define REASON_DENIED 32
#define REASON_DEFAULT_DENY 32 // isolated, and no rule allowed it
#define REASON_ADMIN_DENY 33 // an admin Deny rule
#define REASON_BASELINE_DENY 34 // a baseline Deny rule
#define REASON_UNPARSEABLE 35 // headers that cannot be fully parsed
#define REASON_SPOOFED 36 // a source (or ARP sender) that is not the pod's
#define REASON_NOT_IP 37 // an ethertype other than IPv4, IPv6 and ARP
#define REASON_FRAGMENT_DENIED 38 // a later fragment whose first did not pass
#define REASON_UNSETTLED 39 // the state word kept changing while deciding
// REASON_AUDITED marks a policy denial that passed in audit mode (would deny).
#define REASON_AUDITED 64

// audit_mode (set by the loader, EBPFOptions.Audit): 1, a packet the policy denies
// (default deny, an admin or baseline Deny rule) passes and is counted with
// REASON_AUDITED; the datapath's own drops (anti-spoofing, unparseable headers, other
// ethertypes, fragments whose first was dropped) still drop. A load-time constant: off,
// the verifier prunes it; every agent start loads the programs anew and switches the
// pods' links, so a restart without it enforces again at once.
volatile const __u32 audit_mode = 0;

// count adds packets (bytes) to a verdict counter; what is dir | reason << 8 | rule
// << 16. Per CPU: no atomic needed. Global, so the verifier checks it once, not at
// each of enforce's outcomes (each would add its branches to enforce's).
__attribute__((noinline)) int count(__u32 ifindex, __u32 gen, __u32 what, __u64 packets, __u64 bytes)
{
	struct verdict_key k = {.ifindex = ifindex, .gen = gen, .rule = what >> 16, .dir = what & 1, .reason = what >> 8};
	struct verdict_value *v = bpf_map_lookup_elem(&npa_verdicts, &k);
	if (!v) {
		struct verdict_value z = {};
		bpf_map_update_elem(&npa_verdicts, &k, &z, BPF_NOEXIST);
		v = bpf_map_lookup_elem(&npa_verdicts, &k);
		if (!v) {
			__u32 zero = 0;
			__u64 *lost = bpf_map_lookup_elem(&npa_verdicts_lost, &zero);
			if (lost)
				*lost += packets;
			return 0;
		}
	}
	v->packets += packets;
	v->bytes += bytes;
	return 0;
}

// The common path's counter: a packet allowed by its direction's own state with no
// rule to name (REASON_NO_POLICY, REASON_ALLOW or REASON_DEFAULT_ALLOW: which one
// follows from the word's flags) is counted in a per-CPU array slot per pod slot and
// direction (key slot * 2 + dir), which the verifier inlines: no hash on the allowed
// path. The slot names the word it counts for; a packet judged by another word (a
// commit switched it, or another pod holds the slot now) first moves the slot's
// counts into npa_verdicts under the old word, then counts anew. Only this CPU's
// programs write its slot; user space reads npa_verdicts before these, so a move
// between the two reads is missed once (counted at the next read), never counted
// twice. Sized by the loader: pods * 2.
struct allowed_count {
	__u64 word; // the whole state word (owner included) the counts were judged by
	__u64 packets;
	__u64 bytes;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct allowed_count);
	__uint(max_entries, 1);
} npa_allowed SEC(".maps");

// allowed_reason is the reason of a rule-less allow by a word's own state.
static __always_inline __u32 allowed_reason(__u64 word)
{
	__u32 f = WORD_FLAGS(word);
	if (!f)
		return REASON_NO_POLICY;
	return f & FLAG_ISOLATED ? REASON_ALLOW : REASON_DEFAULT_ALLOW;
}

static __always_inline void count_allowed(__u32 key, const int dir, __u64 word, __u32 len)
{
	struct allowed_count *a = bpf_map_lookup_elem(&npa_allowed, &key);
	if (!a)
		return;
	if (__builtin_expect(a->word != word, 0)) {
		if (a->packets)
			count(WORD_OWNER(a->word), (__u32)a->word, dir | allowed_reason(a->word) << 8, a->packets, a->bytes);
		a->packets = 0;
		a->bytes = 0;
		a->word = word;
	}
	a->packets++;
	a->bytes += len;
}

// Never read: they put the connection table's key and value types into BTF for
// bpf2go (the inner map is declared by sizes).
const volatile struct ct_key ct_key_type;
const volatile struct ct_value ct_value_type;

// How long an entry lives without traffic (set by the loader; EBPFOptions documents
// the defaults): an answered (TCP: established) connection, UDP, ICMP echo and other
// protocols; one not answered yet, or a TCP connection whose handshake has not
// completed (never longer than the first); a TCP connection after a FIN from each
// side; after a RST; a fragmented datagram's entry.
volatile const __u64 ct_timeout_ns = 300ull * 1000 * 1000 * 1000;
volatile const __u64 ct_unreplied_timeout_ns = 30ull * 1000 * 1000 * 1000;
volatile const __u64 ct_closing_timeout_ns = 10ull * 1000 * 1000 * 1000;
volatile const __u64 ct_reset_timeout_ns = 2ull * 1000 * 1000 * 1000;
volatile const __u64 ct_fragment_timeout_ns = 10ull * 1000 * 1000 * 1000;

static __always_inline __u64 ct_timeout(__u32 state)
{
	if (state & CT_RST)
		return ct_reset_timeout_ns;
	if ((state & (CT_FIN_FWD | CT_FIN_REV)) == (CT_FIN_FWD | CT_FIN_REV))
		return ct_closing_timeout_ns;
	if (state & CT_FRAGMENT)
		return ct_fragment_timeout_ns;
	if (!(state & CT_REPLIED) || state & CT_SYN)
		return ct_unreplied_timeout_ns;
	return ct_timeout_ns;
}

// ct_live reports whether an entry has not timed out at now. Signed: another CPU may
// refresh the entry after this one read now, so last_seen_ns can be later than now —
// the entry is live, not 2^64 ns old.
static __always_inline int ct_live(const struct ct_value *v, __u64 now)
{
	return v && (__s64)(now - v->last_seen_ns) < (__s64)ct_timeout(v->state);
}

struct packet {
	__u16 family; // 4 or 6
	__u8 proto;
	__u8 ndp; // ICMPv6 neighbour discovery (NDP_ND) or multicast listener (NDP_MLD) message
	__u16 sport;
	__u16 dport; // 0 for port-less protocols
	__u8 saddr[16];
	__u8 daddr[16];
	__u8 tcp_flags;
	__u16 tcp_win; // TCP: the window field (unscaled), and the sequence and
	__u32 tcp_seq; // acknowledgement numbers (host order), for the connection table
	__u32 tcp_ack;
	__u8 frag; // FRAG_FIRST, FRAG_LATER or 0 (not a fragment)
	__u8 frag_proto; // the protocol after the fragment header (IPv6), or the protocol
	__u8 icmp; // ICMP_ECHO_REQUEST, ICMP_ECHO_REPLY, ICMP_UNTRACKED; 0 for other protocols
	__u32 frag_id; // the IP ID of a fragment (IPv4: 16 bits)
	// An ICMP or ICMPv6 error (destination unreachable, including IPv4 frag-needed;
	// ICMPv6 packet too big; time exceeded; parameter problem): the offset of the
	// packet it quotes. 0 otherwise.
	__u32 quoted;
	__u8 hop_limit; // IPv6 only
};

// Flow events: one record per denied packet (audit mode's would-be denials too) and,
// when user space asks for them, one per connection entry the allowed path makes (a
// newly tracked flow), carried to user space in a ring buffer. Raw facts only: user
// space names the pod, and resolves the rule id and the judging word's generation
// with the same per-commit table the verdict counters use. Every event passes a
// per-pod rate limit first (npa_event_buckets), so a flood from one pod cannot
// starve another's events nor the agent; an event the limit or a full ring buffer
// suppresses is counted (npa_events_suppressed). Never waits: reserve or count.
struct flow_event {
	__u64 ktime; // bpf_ktime_get_ns at the verdict
	__u32 ifindex;
	__u32 gen; // the judging state word's low 32 bits (verdict_key.gen)
	__u32 len; // skb->len
	__u16 rule; // port_rule.rule of the deciding entry, 0 if none
	__u16 sport; // 0 for port-less protocols; ICMP echo: the identifier (packet.icmp)
	__u16 dport;
	__u8 dir;
	__u8 reason; // REASON_*, | REASON_AUDITED
	__u8 kind; // EVENT_*
	__u8 family; // 4 or 6; 0: not IP (no addresses)
	__u8 proto;
	__u8 pad;
	__u8 saddr[16]; // IPv4: the first 4 bytes
	__u8 daddr[16];
};

// Never read: it puts the event's type into BTF for bpf2go.
const volatile struct flow_event flow_event_type;

#define EVENT_DENY 1 // a packet denied (or, audited, that would have been)
#define EVENT_NEW_FLOW 2 // an allowed packet that made a connection entry

// event_config.mode.
#define EVENTS_OFF 0
#define EVENTS_DENY 1 // denials only
#define EVENTS_ALL 2 // denials and newly tracked allowed flows

// The one element user space writes (SetFlowEvents): what to report and the per-pod
// rate limit, as a generic cell rate: an event is admitted while the pod's
// theoretical arrival time is at most burst_ns ahead of now, and each admitted
// event moves it interval_ns on. interval_ns 0: no limit.
struct event_config {
	__u64 interval_ns; // 1s / rate
	__u64 burst_ns; // (burst - 1) * interval_ns
	__u32 mode; // EVENTS_*
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct event_config);
	__uint(max_entries, 1);
} npa_event_config SEC(".maps");

// A pod's rate-limit state, by its slot (npa_pod_slot). Read, checked and moved
// under its spin lock, so the limit holds for the pod across every CPU its packets
// reach: without it, CPUs racing on one pod lose each other's updates and each
// admits at up to the full rate. A slot a removed pod held starts its next pod at
// most burst_ns behind. User space never reads nor writes it.
struct event_bucket {
	struct bpf_spin_lock lock;
	__u64 tat; // theoretical arrival time of the next event
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct event_bucket);
	__uint(max_entries, 1); // sized by the loader: pods
} npa_event_buckets SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 18); // sized by the loader (EBPFOptions.FlowEventBuffer)
} npa_events SEC(".maps");

// Suppressed events, per CPU, by SUPPRESSED_*.
#define SUPPRESSED_RATE 0 // the pod's rate limit
#define SUPPRESSED_FULL 1 // the ring buffer was full (user space behind)

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 2);
} npa_events_suppressed SEC(".maps");

static __always_inline void suppressed(__u32 why)
{
	__u64 *n = bpf_map_lookup_elem(&npa_events_suppressed, &why);
	if (n)
		*n += 1;
}

// emit_event reports a verdict as an event, if the mode asks for its kind and the
// pod's rate limit admits it. pod: slot << 32 | ifindex; genlen: the judging word's
// low 32 bits << 32 | the packet's length; what: dir | reason << 8 | rule << 16, as
// count takes it; a reason of REASON_DENIED or above (audited included) is a denial,
// any other a new flow. Global, so the verifier checks it once, not at each of
// enforce's denials; only denials and new connection entries call it.
__attribute__((noinline)) int emit_event(__u64 pod, __u64 genlen, __u32 what, const struct packet *p)
{
	if (!p)
		return 0;
	__u32 zero = 0;
	struct event_config *c = bpf_map_lookup_elem(&npa_event_config, &zero);
	if (!c)
		return 0;
	__u8 reason = what >> 8;
	__u32 kind = reason >= REASON_DENIED ? EVENT_DENY : EVENT_NEW_FLOW;
	__u32 mode = c->mode;
	if (mode == EVENTS_OFF || (kind == EVENT_NEW_FLOW && mode != EVENTS_ALL))
		return 0;
	__u32 slot = pod >> 32;
	struct event_bucket *b = bpf_map_lookup_elem(&npa_event_buckets, &slot);
	if (!b)
		return 0;
	// Read before the lock (no helper call while it is held): a CPU that waited for
	// the lock judges as of its read, moments earlier, which moves the limit by that
	// wait at most. The event carries the same time.
	__u64 now = bpf_ktime_get_ns();
	__u64 interval = c->interval_ns;
	if (interval) {
		__u64 burst = c->burst_ns;
		int admit;
		bpf_spin_lock(&b->lock);
		__u64 tat = b->tat;
		if ((__s64)(tat - now) < 0)
			tat = now;
		admit = tat - now <= burst;
		if (admit)
			b->tat = tat + interval;
		bpf_spin_unlock(&b->lock);
		if (!admit) {
			suppressed(SUPPRESSED_RATE);
			return 0;
		}
	}
	struct flow_event *e = bpf_ringbuf_reserve(&npa_events, sizeof(*e), 0);
	if (!e) {
		suppressed(SUPPRESSED_FULL);
		return 0;
	}
	e->ktime = now;
	e->ifindex = (__u32)pod;
	e->gen = genlen >> 32;
	e->len = (__u32)genlen;
	e->rule = what >> 16;
	e->sport = p->sport;
	e->dport = p->dport;
	e->dir = what & 1;
	e->reason = reason;
	e->kind = kind;
	e->family = p->family;
	e->proto = p->proto;
	e->pad = 0;
	__builtin_memcpy(e->saddr, p->saddr, 16);
	__builtin_memcpy(e->daddr, p->daddr, 16);
	bpf_ringbuf_submit(e, 0);
	return 0;
}

// packet.ndp. Neighbour discovery (router and neighbour solicitation and
// advertisement, redirect: ICMPv6 133..137) passes without policy only at link scope
// (link_ndp); multicast listener discovery (130..132, 143) is judged by the policy.
// Both may come from the unspecified address (duplicate address detection), the
// only packets a pod may send from it (own_source).
#define NDP_ND 1
#define NDP_MLD 2

// packet.icmp. An ICMP or ICMPv6 echo is tracked by its identifier: a request carries
// it as sport (dport 0), a reply as dport (sport 0), so the entry a request makes is
// found by the reverse lookup of a reply with the same identifier and the addresses
// swapped, and by nothing else. A request only makes an entry (never passes as a
// reply: a peer's echo request is not the reply of the pod's); a reply only looks one
// up (makes none). Every other ICMP type (errors, which pass as RELATED via the header
// they quote, and other informational types) makes no entry and is judged by the
// policy alone. The policy judges ICMP without ports (port 0): the identifier is the
// connection table's only.
#define ICMP_ECHO_REQUEST 1
#define ICMP_ECHO_REPLY 2
#define ICMP_UNTRACKED 3

// PARSE_OK: addresses, protocol and ports (0 for a non-first fragment and port-less
// protocols) are known. PARSE_NOT_IP: not IPv4 or IPv6. PARSE_BAD: an IP packet
// whose IP header cannot be read (no addresses). PARSE_INCOMPLETE: the addresses are
// known, but not the protocol or ports: the L4 header is truncated, or an IPv6
// extension-header chain is truncated or longer than MAX_EXT_HEADERS.
enum parse_result { PARSE_OK, PARSE_NOT_IP, PARSE_BAD, PARSE_INCOMPLETE };

#define FRAG_FIRST 1
#define FRAG_LATER 2

// IPv6 extension headers walked before the protocol: a longer chain is not judged
// (PARSE_INCOMPLETE) rather than judged as "protocol 60, port 0", which a Deny rule
// naming a protocol or ports would not match.
#define MAX_EXT_HEADERS 8
#define NEXTHDR_AUTH 51
#define NEXTHDR_HIP 139
#define NEXTHDR_SHIM6 140

static __always_inline int has_ports(__u8 proto)
{
	return proto == IPPROTO_TCP || proto == IPPROTO_UDP || proto == IPPROTO_SCTP;
}

// parse_echo sets p->icmp for an ICMP or ICMPv6 message at off and, for an echo
// request or reply, its identifier (bytes 4-5) as sport or dport (packet.icmp).
static __always_inline int parse_echo(struct __sk_buff *skb, __u32 off, struct packet *p, int request, int reply)
{
	p->icmp = ICMP_UNTRACKED;
	if (!request && !reply)
		return PARSE_OK;
	__u16 id;
	if (bpf_skb_load_bytes(skb, off + 4, &id, sizeof(id)) < 0)
		return PARSE_INCOMPLETE;
	if (request) {
		p->icmp = ICMP_ECHO_REQUEST;
		p->sport = bpf_ntohs(id);
	} else {
		p->icmp = ICMP_ECHO_REPLY;
		p->dport = bpf_ntohs(id);
	}
	return PARSE_OK;
}

static __always_inline int parse_l4(struct __sk_buff *skb, __u32 off, struct packet *p)
{
	if (p->proto == IPPROTO_TCP) {
		// Ports, sequence and acknowledgement numbers, flags (byte 13) and window in
		// one load. A first fragment may end before the flags: its ports still count,
		// its flags are taken as none.
		__u8 h[16];
		if (bpf_skb_load_bytes(skb, off, h, sizeof(h)) == 0) {
			p->tcp_flags = h[13];
			p->tcp_seq = (__u32)h[4] << 24 | (__u32)h[5] << 16 | (__u32)h[6] << 8 | h[7];
			p->tcp_ack = (__u32)h[8] << 24 | (__u32)h[9] << 16 | (__u32)h[10] << 8 | h[11];
			p->tcp_win = h[14] << 8 | h[15];
		} else if (bpf_skb_load_bytes(skb, off, h, 4) < 0) {
			return PARSE_INCOMPLETE;
		}
		p->sport = h[0] << 8 | h[1];
		p->dport = h[2] << 8 | h[3];
	} else if (has_ports(p->proto)) {
		__u16 ports[2];
		if (bpf_skb_load_bytes(skb, off, ports, sizeof(ports)) < 0)
			return PARSE_INCOMPLETE;
		p->sport = bpf_ntohs(ports[0]);
		p->dport = bpf_ntohs(ports[1]);
	} else if (p->proto == IPPROTO_ICMPV6_) {
		__u8 type;
		if (bpf_skb_load_bytes(skb, off, &type, 1) < 0)
			return PARSE_INCOMPLETE;
		// Router/neighbour solicitation/advertisement and redirect (133..137):
		// without them a pod's IPv6 stops working whatever its policy says (link_ndp).
		if (type >= 133 && type <= 137)
			p->ndp = NDP_ND;
		else if ((type >= 130 && type <= 132) || type == 143)
			p->ndp = NDP_MLD;
		// Destination unreachable, packet too big, time exceeded, parameter problem.
		if (type >= 1 && type <= 4)
			p->quoted = off + 8;
		return parse_echo(skb, off, p, type == 128, type == 129);
	} else if (p->proto == IPPROTO_ICMP) {
		__u8 type;
		if (bpf_skb_load_bytes(skb, off, &type, 1) < 0)
			return PARSE_INCOMPLETE;
		// Destination unreachable (frag-needed is code 4), time exceeded, parameter
		// problem.
		if (type == 3 || type == 11 || type == 12)
			p->quoted = off + 8;
		return parse_echo(skb, off, p, type == 8, type == 0);
	}
	return PARSE_OK;
}

static __always_inline int is_ext(__u8 next)
{
	return next == NEXTHDR_HOP || next == NEXTHDR_ROUTING || next == NEXTHDR_FRAGMENT || next == NEXTHDR_DEST ||
	       next == NEXTHDR_AUTH || next == NEXTHDR_HIP || next == NEXTHDR_SHIM6;
}

// Where a walk of an IPv6 extension-header chain is: the header at off is of type next.
struct ext_walk {
	__u32 off;
	__u8 next;
	__u8 frag; // FRAG_FIRST or FRAG_LATER once a fragment header was passed
	__u8 frag_next; // the fragment header's next header
	__u8 pad;
	__u32 frag_id;
};

enum { STEP_NEXT, STEP_LATER_FRAGMENT, STEP_TRUNCATED };

// ext_step moves w past the extension header at w->off: STEP_NEXT, or
// STEP_LATER_FRAGMENT for the fragment header of a non-first fragment (w->next is the
// fragment's protocol), or STEP_TRUNCATED when the header cannot be read. Global, so
// the verifier checks one step once: inlined, a walk of MAX_EXT_HEADERS steps is a
// tree of branches whose pending paths exceed the 8192 the verifier allows when it
// also explores speculative paths (a loader without CAP_PERFMON).
__attribute__((noinline)) int ext_step(struct __sk_buff *skb, struct ext_walk *w)
{
	if (!w)
		return STEP_TRUNCATED;
	// Every extension header is at least 8 bytes long; the fragment header's
	// identification is in bytes 4-7.
	__u8 hdr[8];
	if (bpf_skb_load_bytes(skb, w->off, hdr, sizeof(hdr)) < 0)
		return STEP_TRUNCATED;
	__u8 type = w->next;
	w->next = hdr[0];
	if (type == NEXTHDR_FRAGMENT) {
		w->off += 8;
		__u16 fo = hdr[2] << 8 | hdr[3];
		if (!(fo & 0xfff8) && !(fo & 1))
			return STEP_NEXT; // an atomic fragment (offset 0, no more): a whole datagram
		w->frag_id = (__u32)hdr[4] << 24 | (__u32)hdr[5] << 16 | (__u32)hdr[6] << 8 | hdr[7];
		w->frag = fo & 0xfff8 ? FRAG_LATER : FRAG_FIRST;
		w->frag_next = hdr[0];
		return w->frag == FRAG_LATER ? STEP_LATER_FRAGMENT : STEP_NEXT;
	}
	// AH counts its length in 4-byte units minus 2, the others (RFC 6564) in 8-byte
	// units minus 1.
	w->off += type == NEXTHDR_AUTH ? (hdr[1] + 2) * 4 : (hdr[1] + 1) * 8;
	return STEP_NEXT;
}

// parse reads a packet's addresses, protocol and ports. Inlined: the common path pays
// no call; only a packet with IPv6 extension headers calls ext_step.
//
// Fragments: only a first fragment carries the L4 header, and it is judged with its
// ports (dropped as PARSE_INCOMPLETE where they are not in it). A later fragment
// (p->frag FRAG_LATER, no ports) is not judged by the policy: it follows its first
// fragment (enforce, later_fragment).
static __always_inline int parse(struct __sk_buff *skb, struct packet *p)
{
	__u16 proto = skb->protocol;
	__u32 off = ETH_HLEN;
	if (proto == bpf_htons(ETH_P_IP)) {
		struct iphdr ip;
		if (bpf_skb_load_bytes(skb, off, &ip, sizeof(ip)) < 0 || ip.ihl < 5)
			return PARSE_BAD;
		p->family = 4;
		p->proto = ip.protocol;
		__builtin_memcpy(p->saddr, &ip.saddr, 4);
		__builtin_memcpy(p->daddr, &ip.daddr, 4);
		if (ip.frag_off & bpf_htons(0x3fff)) { // more fragments, or an offset
			p->frag_id = bpf_ntohs(ip.id);
			p->frag_proto = ip.protocol;
			p->frag = ip.frag_off & bpf_htons(0x1fff) ? FRAG_LATER : FRAG_FIRST;
			if (p->frag == FRAG_LATER)
				return PARSE_OK; // no L4 header: decided by its first fragment
		}
		return parse_l4(skb, off + ip.ihl * 4, p);
	}
	if (proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr ip6;
		if (bpf_skb_load_bytes(skb, off, &ip6, sizeof(ip6)) < 0)
			return PARSE_BAD;
		p->family = 6;
		p->hop_limit = ip6.hop_limit;
		__builtin_memcpy(p->saddr, &ip6.saddr, 16);
		__builtin_memcpy(p->daddr, &ip6.daddr, 16);
		__u8 next = ip6.nexthdr;
		off += sizeof(ip6);
		if (!is_ext(next)) { // the common case: no extension header
			p->proto = next;
			return parse_l4(skb, off, p);
		}
		struct ext_walk w = {.off = off, .next = next};
		for (int i = 0; i < MAX_EXT_HEADERS; i++) {
			int s = ext_step(skb, &w);
			if (s == STEP_TRUNCATED)
				return PARSE_INCOMPLETE;
			p->frag = w.frag;
			p->frag_id = w.frag_id;
			p->frag_proto = w.frag_next;
			if (s == STEP_LATER_FRAGMENT) {
				p->proto = w.next;
				return PARSE_OK;
			}
			if (!is_ext(w.next)) {
				p->proto = w.next;
				return parse_l4(skb, w.off, p);
			}
		}
		return PARSE_INCOMPLETE; // more than MAX_EXT_HEADERS extension headers
	}
	return PARSE_NOT_IP;
}

// first_match returns the action of the first port rule matching, its rule id
// (port_rule.rule) above it (action | rule << 8), 0 if none (also for a NULL v: an
// entry that is not there).
//
// It is a global function (as evaluate is), so the verifier checks it once, on its
// own, instead of at each call site with every path that leads there. Inlined, the
// 24-rule loop at three tiers and MAX_ATTEMPTS evaluations exceeds the verifier's limit
// of 8192 pending branches when the loader lacks CAP_PERFMON: Spectre v1 hardening then
// makes it explore each branch's mispredicted side too ("The sequence of 8193 jumps is
// too complex"), and the program would not load with CAP_BPF and CAP_NET_ADMIN alone.
__attribute__((noinline)) int first_match(const struct rule_value *v, __u8 proto, __u16 port)
{
	if (!v)
		return 0;
	__u32 n = v->count;
	for (int i = 0; i < MAX_PORT_RULES; i++) {
		if (i >= n)
			break;
		const struct port_rule *r = &v->rules[i];
		if ((r->proto == 0 || r->proto == proto) && port >= r->port && port <= r->end_port)
			return r->action | (__u32)r->rule << 8;
	}
	return 0;
}

static __always_inline const struct rule_value *lookup(const int dir, __u32 group, __u32 tag,
						       const struct packet *p, const __u8 *peer)
{
	if (p->family == 4) {
		struct lpm_key4 k = {.prefixlen = 64 + 32, .group = group, .tag = tag};
		__builtin_memcpy(k.addr, peer, 4);
		return bpf_map_lookup_elem(dir == DIR_INGRESS ? (void *)&npa_in_v4 : (void *)&npa_eg_v4, &k);
	}
	struct lpm_key6 k = {.prefixlen = 64 + 128, .group = group, .tag = tag};
	__builtin_memcpy(k.addr, peer, 16);
	return bpf_map_lookup_elem(dir == DIR_INGRESS ? (void *)&npa_in_v6 : (void *)&npa_eg_v6, &k);
}

// is_node reports whether peer is one of the node's addresses.
static __always_inline int is_node(const struct packet *p, const __u8 *peer)
{
	if (p->family == 4) {
		struct node_key4 k = {.prefixlen = 32};
		__builtin_memcpy(k.addr, peer, 4);
		return bpf_map_lookup_elem(&npa_node_v4, &k) != 0;
	}
	struct node_key6 k = {.prefixlen = 128};
	__builtin_memcpy(k.addr, peer, 16);
	return bpf_map_lookup_elem(&npa_node_v6, &k) != 0;
}

// node_egress_policy (set by the loader, EBPFOptions.NodeEgress): 0, the pod's
// packets to its node pass as the node's to the pod do; 1, its egress policy judges
// them as any peer's, but for replies of connections the node opened (kubelet
// probes: node_track) and DHCP. A load-time constant: a program whose mode is off
// pays nothing for it, and every agent start loads the programs anew and switches
// the pods' links to them, so a restart with another mode takes effect at once.
volatile const __u32 node_egress_policy = 0;

// dhcp_client reports whether a packet goes from a DHCP client to a server port
// (UDP 68 -> 67, DHCPv6 546 -> 547).
static __always_inline int dhcp_client(const struct packet *p)
{
	if (p->proto != IPPROTO_UDP)
		return 0;
	return p->family == 4 ? p->sport == 68 && p->dport == 67 : p->sport == 546 && p->dport == 547;
}

// node_peer reports whether a packet is traffic between the pod and its node: its
// peer is a node address and, toward the pod, the node itself sent it. A packet the
// node forwards from another interface (another pod, the uplink) with a node address
// as source is not the node's: skb->ingress_ifindex is 0 only for a packet generated
// on the node, so a pod forging the node's address is judged by the policy. From the
// pod under node_egress_policy, only DHCP is.
static __always_inline int node_peer(struct __sk_buff *skb, const int dir, const struct packet *p, const __u8 *peer)
{
	if (dir == DIR_INGRESS && skb->ingress_ifindex != 0)
		return 0;
	if (dir == DIR_EGRESS && node_egress_policy && !dhcp_client(p))
		return 0;
	return is_node(p, peer);
}

static __always_inline int addr_eq(const __u8 *a, const __u8 *b)
{
	__u64 a0, a1, b0, b1;
	__builtin_memcpy(&a0, a, 8);
	__builtin_memcpy(&a1, a + 8, 8);
	__builtin_memcpy(&b0, b, 8);
	__builtin_memcpy(&b1, b + 8, 8);
	return a0 == b0 && a1 == b1;
}

static __always_inline int link_local6(const __u8 *a)
{
	return a[0] == 0xfe && (a[1] & 0xc0) == 0x80; // fe80::/10
}

static __always_inline int link_multicast6(const __u8 *a)
{
	return a[0] == 0xff && a[1] == 0x02; // ff02::/16
}

// own_addr reports whether addr is one of the pod's own addresses.
static __always_inline int own_addr(__u32 ifindex, const struct packet *p, const __u8 *addr)
{
	struct addr_key k = {.ifindex = ifindex, .family = p->family};
	__builtin_memcpy(k.addr, addr, 16);
	return bpf_map_lookup_elem(&npa_pod_addrs, &k) != 0;
}

// checked reports whether the pod's addresses are known (its marker, npa_pod_addrs).
static __always_inline int checked(__u32 ifindex)
{
	struct addr_key k = {.ifindex = ifindex};
	return bpf_map_lookup_elem(&npa_pod_addrs, &k) != 0;
}

// spoof_exempt reports whether a packet from the pod may carry a source that is not
// one of its addresses, because the pod has none yet or the address is link scope:
// IPv6 :: only for neighbour discovery and multicast listener messages (duplicate
// address detection), an IPv6 link-local source only toward link-local or link-scope
// multicast destinations (the pod's own fe80:: address, which npagent does not
// resolve), IPv4 0.0.0.0 only for DHCP (UDP 68 -> 67).
static __always_inline int spoof_exempt(const struct packet *p)
{
	if (p->family == 6) {
		if (link_local6(p->saddr))
			return link_local6(p->daddr) || link_multicast6(p->daddr);
		__u8 zero[16] = {};
		return p->ndp && addr_eq(p->saddr, zero);
	}
	__u32 s;
	__builtin_memcpy(&s, p->saddr, 4);
	return s == 0 && p->proto == IPPROTO_UDP && p->sport == 68 && p->dport == 67;
}

// own_source reports whether a packet from the pod may leave with its source
// address (anti-spoofing): one of the pod's addresses, or a spoof_exempt one. A forged
// source would widen other pods' ingress and make connection entries (the pod's own
// when the node hairpins the packet back). A packet whose IP header cannot be read
// has no source to check: it leaves only a pod whose addresses are unknown.
static __always_inline int own_source(__u32 ifindex, int r, const struct packet *p)
{
	if (r != PARSE_BAD && (own_addr(ifindex, p, p->saddr) || spoof_exempt(p)))
		return 1;
	return !checked(ifindex);
}

// arp_own_sender reports whether an ARP packet from the pod may leave: its sender
// protocol address is one of the pod's IPv4 addresses, or 0.0.0.0 (an RFC 5227
// probe), or the pod's addresses are not known. A pod claiming another address (a
// gratuitous ARP for another pod's or the node's IP) would poison its neighbours'
// caches; an ARP packet that is not IPv4 over Ethernet, or is truncated, has no use
// from a pod.
static __always_inline int arp_own_sender(struct __sk_buff *skb, __u32 ifindex)
{
	if (!checked(ifindex))
		return 1;
	// htype, ptype, hlen, plen, op (8 bytes), sender hardware (6) and protocol (4)
	// addresses.
	__u8 a[18];
	if (bpf_skb_load_bytes(skb, ETH_HLEN, a, sizeof(a)) < 0)
		return 0;
	if (a[0] != 0 || a[1] != 1 || a[2] != 0x08 || a[3] != 0 || a[4] != 6 || a[5] != 4)
		return 0;
	struct addr_key k = {.ifindex = ifindex, .family = 4};
	__builtin_memcpy(k.addr, a + 14, 4);
	if (!(a[14] | a[15] | a[16] | a[17]))
		return 1;
	return bpf_map_lookup_elem(&npa_pod_addrs, &k) != 0;
}

// link_ndp reports whether a packet is neighbour discovery (hop limit 255, as RFC
// 4861 sends it) that stays on the link between the pod and the node: its peer is
// link-local or link-scope multicast, or the node is at the other end (node_ndp).
// Such packets pass without policy (a pod must resolve its gateway, and the node the
// pod); other NDP messages — to or from a peer beyond the node, which the node would
// forward — are judged as ICMPv6.
static __always_inline int link_ndp(const struct packet *p, const __u8 *peer)
{
	return p->ndp == NDP_ND && p->hop_limit == 255 && (link_local6(peer) || link_multicast6(peer));
}

#define AF_INET6_ 10

// node_ndp reports whether neighbour discovery with a global peer is between the pod
// and the node: toward the pod, the node sent it (not forwarded: ingress_ifindex 0);
// from the pod, the node would not forward it (its destination is the node's, e.g.
// a gateway address on the pod's host-side interface that is not in the node set).
// Global, so the verifier checks the route lookup once; only NDP with hop limit 255
// and a global peer gets here.
__attribute__((noinline)) int node_ndp(struct __sk_buff *skb, int dir, const struct packet *p)
{
	if (!p || p->ndp != NDP_ND || p->hop_limit != 255)
		return 0;
	if (dir == DIR_INGRESS)
		return skb->ingress_ifindex == 0;
	struct bpf_fib_lookup f = {.family = AF_INET6_, .ifindex = skb->ifindex};
	__builtin_memcpy(f.ipv6_src, p->saddr, 16);
	__builtin_memcpy(f.ipv6_dst, p->daddr, 16);
	int r = bpf_fib_lookup(skb, &f, sizeof(f), 0);
	return r == BPF_FIB_LKUP_RET_NOT_FWDED || r == BPF_FIB_LKUP_RET_FWD_DISABLED;
}

// load_word loads a state word with (at least) acquire semantics, so that the lookups
// after it see every entry written before the word was stored.
static __always_inline __u64 load_word(__u64 *p)
{
#if defined(__TARGET_ARCH_x86)
	// x86-64 is TSO: a load is not reordered with later loads, so a plain aligned
	// load (one mov from the JIT) is an acquire load. volatile keeps clang from
	// splitting, repeating or dropping it.
	return *(volatile __u64 *)p;
#elif defined(__TARGET_ARCH_arm64)
	// arm64 reorders loads with later loads. A BPF load-acquire instruction needs
	// Linux >= 6.15 and clang >= 20 (-mcpu=v4); instead a fetch-add of 0
	// (BPF_ATOMIC | BPF_FETCH, Linux >= 5.12), which returns the word unchanged and
	// which the arm64 JIT emits as LDADDAL (LSE) or an LDXR/STLXR loop and DMB ISH:
	// fully ordered, so an acquire. It stores the same value back atomically, so it
	// never undoes a concurrent store from user space. The cost: every read takes the
	// word's cache line exclusive. The empty asm hides the 0 from clang, which would
	// otherwise turn the fetch-add into an atomic load its BPF backend cannot emit.
	__u64 zero = 0;
	asm volatile("" : "+r"(zero));
	return __sync_fetch_and_add(p, zero);
#else
#error "policy.c: no acquire load of the state word for this target; build with bpf2go -target amd64 or arm64"
#endif
}

// pod_state returns the pod's state, NULL if npagent does not manage the pod (now).
// The pointer stays valid (array memory is never freed); the words' owner says
// whether it is still this pod's.
static __always_inline struct pod_state *pod_state(__u32 ifindex, __u32 *s)
{
	__u32 *slot = bpf_map_lookup_elem(&npa_pod_slot, &ifindex);
	if (!slot)
		return 0;
	// If the pod was removed since the lookup, the element may hold another pod's
	// slot or a torn value by now: the owner check rejects the word it leads to.
	*s = *(volatile __u32 *)slot;
	return bpf_map_lookup_elem(&npa_slot_state, s);
}

// group_of reads the entry group the word names; after load_word, so ordered after it.
static __always_inline __u32 group_of(const struct pod_state *st, const int dir, __u64 word)
{
	return *(volatile __u32 *)&st->group[dir][WORD_SET(word)];
}

enum { ALLOW = 1, DENY = 2 };

// An evaluation's result: ALLOW or DENY, what decided it (REASON_*) and the deciding
// rule's id (port_rule.rule).
#define RESULT(v, reason, rule) ((int)((v) | (reason) << 2 | (__u32)(rule) << 16))
#define RESULT_VERDICT(r) ((r) & 3)
#define RESULT_REASON(r) (((__u32)(r) >> 2) & 0x3f)
#define RESULT_RULE(r) ((__u32)(r) >> 16)

// evaluate decides a packet by the entry set the word names (RESULT). Its answer counts only
// if the word is unchanged afterwards (enforce checks). Global, as first_match is, so
// the verifier checks it once rather than at each of enforce's MAX_ATTEMPTS calls.
__attribute__((noinline)) int evaluate(int dir, __u32 group, __u64 word, const struct packet *p, __u16 port)
{
	if (!p)
		return RESULT(DENY, REASON_UNSETTLED, 0);
	const __u8 *peer = dir == DIR_INGRESS ? p->saddr : p->daddr;
	__u32 base = TAG_SETS | GROUP_SET(group) << 2, flags = WORD_FLAGS(word);
	__u32 id = GROUP_ID(group);
	const struct rule_value *v;

	if (!flags)
		return RESULT(ALLOW, REASON_NO_POLICY, 0);
	if (flags & FLAG_ADMIN) {
		v = lookup(dir, id, base | TIER_ADMIN, p, peer);
		if (v) {
			int m = first_match(v, p->proto, port);
			int a = m & 0xff;
			if (a == ACTION_ACCEPT)
				return RESULT(ALLOW, REASON_ADMIN_ACCEPT, m >> 8);
			if (a == ACTION_DENY)
				return RESULT(DENY, REASON_ADMIN_DENY, m >> 8);
		}
	}
	if (flags & FLAG_ISOLATED) {
		if (!(flags & FLAG_NAMESPACED))
			return RESULT(DENY, REASON_DEFAULT_DENY, 0);
		v = lookup(dir, id, base | TIER_NAMESPACED, p, peer);
		int m = v ? first_match(v, p->proto, port) : 0;
		if (m)
			return RESULT(ALLOW, REASON_ALLOW, m >> 8);
		return RESULT(DENY, REASON_DEFAULT_DENY, 0);
	}
	if (flags & FLAG_BASELINE) {
		v = lookup(dir, id, base | TIER_BASELINE, p, peer);
		int m = v ? first_match(v, p->proto, port) : 0;
		if ((m & 0xff) == ACTION_DENY)
			return RESULT(DENY, REASON_BASELINE_DENY, m >> 8);
		if ((m & 0xff) == ACTION_ACCEPT)
			return RESULT(ALLOW, REASON_BASELINE_ACCEPT, m >> 8);
	}
	return RESULT(ALLOW, REASON_DEFAULT_ALLOW, 0);
}

// ct_opens reports whether an allowed packet makes (or refreshes) an entry, ct_replies
// whether a denied one may pass as a reply of one: not an ICMP echo reply, nor an echo
// request, nor other ICMP (packet.icmp).
static __always_inline int ct_opens(const struct packet *p)
{
	return p->icmp == 0 || p->icmp == ICMP_ECHO_REQUEST;
}

static __always_inline int ct_replies(const struct packet *p)
{
	return p->icmp == 0 || p->icmp == ICMP_ECHO_REPLY;
}

static __always_inline void ct_fill(struct ct_key *k, __u32 ifindex, const int dir, const struct packet *p,
				    int reverse)
{
	k->ifindex = ifindex;
	k->dir = dir;
	k->proto = p->proto;
	k->family = p->family;
	if (!reverse) {
		k->sport = p->sport;
		k->dport = p->dport;
		__builtin_memcpy(k->saddr, p->saddr, 16);
		__builtin_memcpy(k->daddr, p->daddr, 16);
	} else {
		k->sport = p->dport;
		k->dport = p->sport;
		__builtin_memcpy(k->saddr, p->daddr, 16);
		__builtin_memcpy(k->daddr, p->saddr, 16);
	}
}

// ct_table returns a pod's table of a kind (ct_table_key), NULL if it has none.
static __always_inline void *ct_table(__u32 ifindex, __u32 kind)
{
	struct ct_table_key k = {.ifindex = ifindex, .kind = kind};
	return bpf_map_lookup_elem(&npa_ct_tables, &k);
}

// ct_lookup returns the entry of k in the table its direction (or CT_FRAGMENT) names.
static __always_inline struct ct_value *ct_lookup(const struct ct_key *k)
{
	void *ct = ct_table(k->ifindex, k->dir & CT_FRAGMENT ? CT_TABLE_FRAGMENTS : k->dir);
	return ct ? bpf_map_lookup_elem(ct, k) : 0;
}

// related reports whether an ICMP or ICMPv6 error (p->quoted set) quotes a packet of
// a connection in the table that has not timed out: RELATED traffic, which passes as
// a reply would (path-MTU discovery: IPv4 frag-needed, ICMPv6 packet too big; time
// exceeded; unreachable). Its own source is usually a router the policy never names
// (toward the pod; from the pod, its outer addresses are the quoted packet's, swapped).
// The quoted packet is one the pod sent or received in the other direction, so it is
// the forward packet of a connection the other direction allowed, or a reply of one
// this direction allowed. A quoted IPv6 header's extension-header chain is walked as
// a packet's is (up to MAX_EXT_HEADERS; a later fragment quotes no ports and is not
// matched). It does not refresh the entry. Global, so the verifier checks it once;
// only a packet the policy denied gets here.
__attribute__((noinline)) int related(struct __sk_buff *skb, __u32 ifindex, int dir, const struct packet *p)
{
	if (!p || !p->quoted)
		return 0;
	struct packet q = {.family = p->family};
	__u32 off = p->quoted;
	if (p->family == 4) {
		struct iphdr ip;
		if (bpf_skb_load_bytes(skb, off, &ip, sizeof(ip)) < 0 || ip.ihl < 5)
			return 0;
		if (ip.frag_off & bpf_htons(0x1fff))
			return 0; // a non-first fragment: no ports to match
		q.proto = ip.protocol;
		__builtin_memcpy(q.saddr, &ip.saddr, 4);
		__builtin_memcpy(q.daddr, &ip.daddr, 4);
		off += ip.ihl * 4;
	} else {
		struct ipv6hdr ip6;
		if (bpf_skb_load_bytes(skb, off, &ip6, sizeof(ip6)) < 0)
			return 0;
		__builtin_memcpy(q.saddr, &ip6.saddr, 16);
		__builtin_memcpy(q.daddr, &ip6.daddr, 16);
		struct ext_walk w = {.off = off + sizeof(ip6), .next = ip6.nexthdr};
		for (int i = 0; i < MAX_EXT_HEADERS && is_ext(w.next); i++) {
			if (ext_step(skb, &w) != STEP_NEXT)
				return 0; // truncated, or a later fragment
		}
		if (is_ext(w.next))
			return 0; // longer than the datapath walks
		q.proto = w.next;
		off = w.off;
	}
	// The error's own addresses must be the quoted flow's: it goes to the quoted
	// packet's source, always; from the pod (no router) it comes from the quoted
	// packet's destination too. Toward the pod any router may send it. Otherwise a
	// pod could send errors quoting a tracked flow to any denied destination, and
	// anyone could send them to the pod.
	if (!addr_eq(p->daddr, q.saddr))
		return 0;
	if (dir == DIR_EGRESS && !addr_eq(p->saddr, q.daddr))
		return 0;
	// The quoted packet's ports, or its echo identifier as its entry has it.
	if (parse_l4(skb, off, &q) != PARSE_OK || q.icmp == ICMP_UNTRACKED)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	struct ct_key k = {};
	ct_fill(&k, ifindex, dir == DIR_INGRESS ? DIR_EGRESS : DIR_INGRESS, &q, 0);
	if (ct_live(ct_lookup(&k), now))
		return 1;
	ct_fill(&k, ifindex, dir, &q, 1);
	return ct_live(ct_lookup(&k), now);
}

// frag_key is the entry of a fragmented datagram: its addresses, protocol and IP ID,
// in the direction it passed.
static __always_inline void frag_key(struct ct_key *k, __u32 ifindex, const int dir, const struct packet *p)
{
	k->ifindex = ifindex;
	k->dir = dir | CT_FRAGMENT;
	k->proto = p->frag_proto; // the same in every fragment (not so p->proto in IPv6)
	k->family = p->family;
	k->sport = p->frag_id >> 16;
	k->dport = p->frag_id;
	__builtin_memcpy(k->saddr, p->saddr, 16);
	__builtin_memcpy(k->daddr, p->daddr, 16);
}

// passed is the verdict for a packet that passes. A first fragment passing a
// direction with any policy leaves an entry in the pod's fragment table, so the
// datagram's later fragments (no ports: the policy cannot judge them) pass too.
static __always_inline int passed(__u32 ifindex, const int dir, __u64 word, const struct packet *p)
{
	if (p->frag == FRAG_FIRST && WORD_FLAGS(word)) {
		void *ct = ct_table(ifindex, CT_TABLE_FRAGMENTS);
		if (ct) {
			struct ct_key k = {};
			frag_key(&k, ifindex, dir, p);
			struct ct_value v = {.last_seen_ns = bpf_ktime_get_ns(), .state = CT_FRAGMENT};
			bpf_map_update_elem(ct, &k, &v, BPF_ANY);
		}
	}
	return VERDICT_NEXT;
}

// ct_in_window reports whether a TCP packet from the opener (fwd) or its peer lies in
// the receiver's window as the receiver last announced it: its sequence number in
// [the receiver's last ACK, + its window << shift]. A receiver that has acknowledged
// nothing yet (a SYN awaiting its answer) admits any.
//
// An RST is checked with shift 0, the window as sent (unscaled): window scaling can
// only widen the real window, so this is the tightest bound that holds, and a blind
// attacker needs 2^32 / (window + 1) guesses (64k or more) where the scaled window
// (up to 2^30 bytes) would need 4. A genuine RST that falls outside it (data in
// flight beyond the unscaled window) still reaches the pod, whose kernel handles it;
// the entry merely keeps its normal timeout, and expires or is evicted as an idle one.
// A FIN is checked against the widest scaled window (shift 14, RFC 7323's limit): a
// forged FIN alone changes no timeout (it takes one from each side, and the pod's
// side cannot be forged from outside), while a genuine FIN after bulk data may lie a
// whole scaled window beyond the receiver's last ACK.
static __always_inline int ct_in_window(const struct ct_value *v, __u32 state, const struct packet *p, int fwd,
					int shift)
{
	if (!(state & (fwd ? CT_ACK_REV : CT_ACK_FWD)))
		return 1;
	__u32 ack = fwd ? v->ack[1] : v->ack[0];
	__u32 win = fwd ? v->win[1] : v->win[0];
	return p->tcp_seq - ack <= win << shift;
}

// tcp_state is an entry's state after a TCP packet, seen from the connection's opener
// (fwd) or its peer; it records the sender's acknowledgement and window in v.
//   - a SYN (without ACK): a new connection on these ports, CT_SYN, all else forgotten;
//   - an RST: CT_RST (the reset timeout) if within the receiver's window, no other
//     change (a forged one, even with a bad checksum, never reaches a live connection's
//     entry; ct_in_window);
//   - any other packet clears CT_RST (the connection lives on: an RST the window
//     admitted yet the receiver ignored, or one forged with a guessed sequence number,
//     lasts only until the next packet); a FIN within the window marks its side; the
//     peer's packet marks the entry answered (CT_REPLIED), and the opener's ACK after
//     that completes the handshake (clears CT_SYN).
static __always_inline __u32 tcp_state(struct ct_value *v, __u32 state, const struct packet *p, int fwd)
{
	__u8 flags = p->tcp_flags;
	if ((flags & (TCP_SYN | TCP_ACK)) == TCP_SYN)
		return CT_SYN;
	if (flags & TCP_RST)
		return ct_in_window(v, state, p, fwd, 0) ? state | CT_RST : state;
	state &= ~CT_RST;
	if (flags & TCP_FIN && ct_in_window(v, state, p, fwd, 14))
		state |= fwd ? CT_FIN_FWD : CT_FIN_REV;
	if (!fwd)
		state |= CT_REPLIED;
	else if (state & CT_REPLIED && flags & TCP_ACK && !(flags & TCP_SYN))
		state &= ~CT_SYN;
	if (flags & TCP_ACK) {
		if (fwd) {
			v->ack[0] = p->tcp_ack;
			v->win[0] = p->tcp_win;
			state |= CT_ACK_FWD;
		} else {
			v->ack[1] = p->tcp_ack;
			v->win[1] = p->tcp_win;
			state |= CT_ACK_REV;
		}
	}
	return state;
}

// ct_seen refreshes an entry for a packet of its connection from the opener (fwd) or
// its peer. Any packet from the peer marks it answered; TCP: tcp_state.
static __always_inline void ct_seen(struct ct_value *v, const struct packet *p, __u64 now, int fwd)
{
	v->last_seen_ns = now;
	__u32 st = v->state;
	if (p->proto == IPPROTO_TCP)
		st = tcp_state(v, st, p, fwd);
	else if (!fwd)
		st |= CT_REPLIED;
	if (st != v->state)
		v->state = st;
}

// ct_track records an allowed packet in the table of the direction that allowed it
// (the connection's opener is this side): it refreshes the connection's entry, or, for
// a packet of a connection the other direction opened (a reply this direction's policy
// allows as well), refreshes that one, and otherwise makes an entry — but not for a
// TCP SYN-ACK or RST, which answer a connection and never open one (so peers cannot
// make a pod fill its own table of opened connections by sending it SYNs). An entry
// that timed out is made afresh. It returns 1 when it made an entry (a new flow).
static __always_inline int ct_track(__u32 ifindex, const int dir, const struct packet *p)
{
	void *ct = ct_table(ifindex, dir);
	if (!ct)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	struct ct_key k = {};
	ct_fill(&k, ifindex, dir, p, 0);
	struct ct_value *v = bpf_map_lookup_elem(ct, &k);
	if (ct_live(v, now)) {
		ct_seen(v, p, now, 1);
		return 0;
	}
	if (p->icmp == 0) {
		struct ct_key r = {};
		ct_fill(&r, ifindex, dir == DIR_INGRESS ? DIR_EGRESS : DIR_INGRESS, p, 1);
		struct ct_value *o = ct_lookup(&r);
		if (ct_live(o, now)) {
			ct_seen(o, p, now, 0);
			return 0;
		}
	}
	__u8 f = p->tcp_flags;
	if (p->proto == IPPROTO_TCP && (f & TCP_RST || (f & (TCP_SYN | TCP_ACK)) == (TCP_SYN | TCP_ACK)))
		return 0;
	struct ct_value nv = {};
	ct_seen(&nv, p, now, 1);
	return bpf_map_update_elem(ct, &k, &nv, BPF_ANY) == 0;
}

// node_track records a packet the node sent to the pod under node_egress_policy, as
// an allowed packet of a connection the node opened, so the pod's replies pass its
// egress policy (a kubelet probe's SYN-ACK) while its own connections to the node
// are judged by it. Only where the egress has a policy that could deny the replies.
static __always_inline void node_track(__u32 ifindex, __u64 *wp, const struct packet *p)
{
	__u64 eg = *(volatile __u64 *)(wp + 1);
	if (WORD_OWNER(eg) == ifindex && WORD_FLAGS(eg) && ct_opens(p))
		ct_track(ifindex, DIR_INGRESS, p);
}

// pass and drop count a packet's verdict (count) and return it.
static __always_inline int pass(struct __sk_buff *skb, __u32 ifindex, const int dir, __u64 word, __u32 reason,
				__u32 rule)
{
	count(ifindex, (__u32)word, dir | reason << 8 | rule << 16, 1, skb->len);
	return VERDICT_NEXT;
}

static __always_inline int drop(struct __sk_buff *skb, __u32 slot, __u32 ifindex, const int dir, __u64 word,
				__u32 reason, const struct packet *p)
{
	count(ifindex, (__u32)word, dir | reason << 8, 1, skb->len);
	emit_event((__u64)slot << 32 | ifindex, word << 32 | skb->len, dir | reason << 8, p);
	return VERDICT_DROP;
}

static __always_inline int enforce(struct __sk_buff *skb, const int dir)
{
	__u32 ifindex = skb->ifindex;
	__u32 slot = 0;
	struct pod_state *st = pod_state(ifindex, &slot);
	if (!st)
		return VERDICT_NEXT; // not a pod npagent manages
	__u64 *wp = &st->dir[dir];
	__u64 word = load_word(wp);
	if (WORD_OWNER(word) != ifindex)
		return VERDICT_NEXT;

	struct packet p = {};
	int r = parse(skb, &p);
	if (r == PARSE_NOT_IP) {
		// ARP passes. Any other ethertype is dropped where a policy applies: the node
		// may still turn it into IP (a frame with two VLAN tags shows 0x8100 here:
		// the kernel stripped the outer tag and strips the inner one later, then
		// routes the IP packet), which the policy never judged. From a pod whose
		// addresses are known, always: it would also pass a forged source. ARP from
		// such a pod only with its own sender address (arp_own_sender).
		if (skb->protocol == bpf_htons(ETH_P_ARP)) {
			if (dir == DIR_EGRESS && !arp_own_sender(skb, ifindex))
				return drop(skb, slot, ifindex, dir, word, REASON_SPOOFED, &p);
			return pass(skb, ifindex, dir, word, REASON_ARP, 0);
		}
		if (WORD_FLAGS(word) || (dir == DIR_EGRESS && checked(ifindex)))
			return drop(skb, slot, ifindex, dir, word, REASON_NOT_IP, &p);
		return pass(skb, ifindex, dir, word, REASON_NO_POLICY, 0);
	}
	// Anti-spoofing, whatever the direction's flags.
	if (dir == DIR_EGRESS && !own_source(ifindex, r, &p))
		return drop(skb, slot, ifindex, dir, word, REASON_SPOOFED, &p);
	const __u8 *peer = dir == DIR_INGRESS ? p.saddr : p.daddr;
	if (r != PARSE_OK) {
		// An IP packet whose headers cannot be fully read (truncated, or an IPv6
		// extension-header chain longer than MAX_EXT_HEADERS) cannot be judged: a
		// Deny rule naming its protocol or port might be meant for it. It is dropped
		// in a direction where any policy applies (isolated, or admin or baseline
		// rules), except between the pod and its node; a direction without any
		// policy would allow whatever it carries.
		if (!WORD_FLAGS(word))
			return pass(skb, ifindex, dir, word, REASON_NO_POLICY, 0);
		if (r == PARSE_INCOMPLETE && node_peer(skb, dir, &p, peer))
			return pass(skb, ifindex, dir, word, REASON_NODE, 0);
		return drop(skb, slot, ifindex, dir, word, REASON_UNPARSEABLE, &p);
	}
	if (p.ndp == NDP_ND && (link_ndp(&p, peer) || node_ndp(skb, dir, &p)))
		return pass(skb, ifindex, dir, word, REASON_NDP, 0);

	__u64 now;
	struct ct_key k = {};
	if (p.frag == FRAG_LATER) {
		// A later fragment carries no ports, so the policy cannot judge it: in a
		// direction with any policy it passes only if its datagram's first fragment
		// passed (the entry passed() made), or between the pod and its node. One whose
		// first fragment was denied, not seen yet (reordered) or seen more than
		// ct_fragment_timeout_ns ago is dropped.
		if (!WORD_FLAGS(word))
			return pass(skb, ifindex, dir, word, REASON_NO_POLICY, 0);
		frag_key(&k, ifindex, dir, &p);
		if (ct_live(ct_lookup(&k), bpf_ktime_get_ns()))
			return pass(skb, ifindex, dir, word, REASON_FRAGMENT, 0);
		if (node_peer(skb, dir, &p, peer))
			return pass(skb, ifindex, dir, word, REASON_NODE, 0);
		return drop(skb, slot, ifindex, dir, word, REASON_FRAGMENT_DENIED, &p);
	}

	__u16 port = has_ports(p.proto) ? p.dport : 0;
	int res = RESULT(DENY, REASON_UNSETTLED, 0);
	for (int attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
		res = evaluate(dir, group_of(st, dir, word), word, &p, port);
		__u64 w = load_word(wp);
		if (w == word)
			break;
		// A switch happened while deciding: the set used may have changed under the
		// lookups. Decide again by the new word.
		if (WORD_OWNER(w) != ifindex)
			return VERDICT_NEXT; // the pod was removed meanwhile
		word = w;
		res = RESULT(DENY, REASON_UNSETTLED, 0); // fail closed if the word keeps changing
	}

	if (RESULT_VERDICT(res) == ALLOW) {
		// Remember the connection so its replies pass the other direction — only if
		// that direction has a policy (isolated, or admin or baseline rules) that could
		// deny them: a reply through an open direction needs no entry. Every allowed
		// packet (not only a connection's first) makes a missing entry, so a
		// connection opened while the other direction was open is tracked from its
		// next packet after that direction gets a policy (ICMP: only an echo request
		// makes one, packet.icmp; TCP: ct_track). The other direction's word is read
		// without ordering: it only says whether to track. A packet to the pod from
		// its own address (hairpinned by the node) makes none.
		__u64 other = *(volatile __u64 *)(dir == DIR_INGRESS ? wp + 1 : wp - 1);
		// A new entry is a new flow: reported when events of allowed flows are on.
		if (WORD_OWNER(other) == ifindex && WORD_FLAGS(other) && ct_opens(&p) &&
		    !(dir == DIR_INGRESS && own_addr(ifindex, &p, p.saddr)) && ct_track(ifindex, dir, &p)) {
			__u32 why = RESULT_RULE(res) == 0 ? allowed_reason(word) : RESULT_REASON(res);
			emit_event((__u64)slot << 32 | ifindex, word << 32 | skb->len, dir | why << 8 | RESULT_RULE(res) << 16,
				   &p);
		}
		// Allowed with no rule to name: REASON_NO_POLICY, REASON_ALLOW or
		// REASON_DEFAULT_ALLOW, the one allowed_reason(word) gives (tier rules'
		// ids start at 1).
		if (RESULT_RULE(res) == 0)
			count_allowed(slot * 2 + dir, dir, word, skb->len);
		else
			pass(skb, ifindex, dir, word, RESULT_REASON(res), RESULT_RULE(res));
		return passed(ifindex, dir, word, &p);
	}
	// Denied by this direction's policy: pass a reply of a connection the other
	// direction allowed, traffic between the pod and its own node, and an ICMP error
	// about a tracked connection. The node check
	// comes only here, after the policy: the verdict is "node or policy", so the
	// order does not change it, and a packet the policy allows (the common path) pays
	// no extra lookup. Node traffic passing here makes no connection entry: its replies
	// have the node as peer too and pass the same way.
	if (ct_replies(&p)) {
		now = bpf_ktime_get_ns();
		ct_fill(&k, ifindex, dir == DIR_INGRESS ? DIR_EGRESS : DIR_INGRESS, &p, 1);
		struct ct_value *v = ct_lookup(&k);
		if (ct_live(v, now)) {
			ct_seen(v, &p, now, 0);
			pass(skb, ifindex, dir, word, REASON_CT_REPLY, 0);
			return passed(ifindex, dir, word, &p);
		}
	}
	if (node_peer(skb, dir, &p, peer)) {
		if (dir == DIR_INGRESS && node_egress_policy)
			node_track(ifindex, wp, &p);
		pass(skb, ifindex, dir, word, REASON_NODE, 0);
		return passed(ifindex, dir, word, &p);
	}
	// An ICMP error quoting a tracked connection (RELATED). Last: only ICMP errors
	// the policy denies pay for it.
	if (p.quoted && related(skb, ifindex, dir, &p))
		return pass(skb, ifindex, dir, word, REASON_ICMP_RELATED, 0);
	__u32 what = dir | RESULT_REASON(res) << 8 | RESULT_RULE(res) << 16;
	if (audit_mode)
		what |= REASON_AUDITED << 8;
	count(ifindex, (__u32)word, what, 1, skb->len);
	emit_event((__u64)slot << 32 | ifindex, word << 32 | skb->len, what, &p);
	return audit_mode ? VERDICT_NEXT : VERDICT_DROP;
}

// Attached to the tcx ingress hook of the pod's host-side interface.
SEC("tc")
int from_pod(struct __sk_buff *skb)
{
	return enforce(skb, DIR_EGRESS);
}

// Attached to the tcx egress hook of the pod's host-side interface.
SEC("tc")
int to_pod(struct __sk_buff *skb)
{
	return enforce(skb, DIR_INGRESS);
}
