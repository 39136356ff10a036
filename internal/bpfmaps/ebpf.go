package bpfmaps

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// The programs are built for the deployment targets, amd64 and arm64 (both little
// endian): one object each, policy_x86_bpfel.o and policy_arm64_bpfel.o (bpf2go
// defines __TARGET_ARCH_x86 or __TARGET_ARCH_arm64), which differ only in how the state
// word is loaded (load_word in policy.c: the acquire each CPU needs). The package
// builds for those architectures only. include/ stands in for the host's
// asm/ headers, so no multiarch include path is needed and every host generates the
// same bytes (include/README.md).
//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Iinclude" -target amd64,arm64 -type lpm_key4 -type lpm_key6 -type rule_value -type port_rule -type pod_state -type node_key4 -type node_key6 -type verdict_key -type verdict_value -type allowed_count -type event_config policy policy.c

// DefaultPinPath is where OpenEBPF pins maps and links unless told otherwise.
const DefaultPinPath = "/sys/fs/bpf/npagent"

// EBPFOptions configures OpenEBPF. Zero fields take the defaults.
type EBPFOptions struct {
	// PinPath is the bpffs directory holding the pinned maps and links. Default
	// DefaultPinPath. It must be on a bpffs the host mounted: OpenEBPF never mounts
	// one (a mount inside the agent's container would die with it, and the pins
	// too); it fails, naming the fix, when the path is not on bpffs (ErrNoBPFFS
	// when /sys/fs/bpf itself is not).
	PinPath string
	// Limits are the map capacities. A pinned map adopted from a previous process
	// must have the same capacity: OpenEBPF fails with a *PinnedCapacityError
	// (ErrPinnedCapacity) naming each map and both sizes otherwise.
	Limits Limits
	// ConntrackEntries is the capacity of each of a pod's two LRU connection tables:
	// connections its egress policy allowed (the pod opened them) and connections its
	// ingress policy allowed (peers opened them). A side opening more flows evicts the
	// oldest entries of its own table, never the other's nor another pod's. A third
	// table, a quarter of this size, holds the pod's fragment entries. Default
	// DefaultConntrackEntries. Like Limits, fixed for pinned tables (ErrPinnedCapacity).
	ConntrackEntries int
	// ConntrackTimeout is how long replies of a connection pass after its last packet:
	// an answered (TCP: established) connection, UDP, ICMP echo and other protocols.
	// Default DefaultConntrackTimeout.
	ConntrackTimeout time.Duration
	// ConntrackUnrepliedTimeout replaces it until the peer answered and, for TCP, the
	// handshake completed (unanswered datagrams, SYNs). Default
	// DefaultConntrackUnrepliedTimeout; never longer than ConntrackTimeout.
	ConntrackUnrepliedTimeout time.Duration
	// ConntrackClosingTimeout replaces it once a TCP connection saw a FIN from each
	// side. Default DefaultConntrackClosingTimeout.
	ConntrackClosingTimeout time.Duration
	// ConntrackResetTimeout replaces it once a TCP connection saw a RST within the
	// receiver's window, until the connection's next other packet. Default
	// DefaultConntrackResetTimeout.
	ConntrackResetTimeout time.Duration
	// ConntrackFragmentTimeout is how long the later fragments of a datagram whose
	// first fragment passed still pass. Default DefaultConntrackFragmentTimeout.
	ConntrackFragmentTimeout time.Duration
	// NodeEgress is what the pod's packets to its node's addresses are. Default
	// NodeEgressAllow. The programs are loaded with it, and every OpenEBPF switches
	// the pinned links to the programs it loads: a restart with another mode changes
	// every adopted pod's at once.
	NodeEgress NodeEgress
	// VerdictEntries is the capacity of the verdict counters (one per pod, direction,
	// reason, deciding rule and commit in force; Verdicts folds those of past commits
	// and deletes them). A packet whose counter finds the map full is counted in
	// VerdictCounts.Lost. Default DefaultVerdictEntries.
	VerdictEntries int
	// Audit: packets the policy denies (default deny, admin and baseline Deny rules)
	// pass, counted as would-be denials (VerdictCount.Audited); the datapath's own
	// drops (anti-spoofing, unparseable headers, other ethertypes, fragments) stay.
	// For staged rollouts only: nothing is enforced. The programs are loaded with it
	// and every OpenEBPF switches the pinned links to them, so opening again without
	// it enforces at once.
	Audit bool
	// FlowEventBuffer is the size in bytes of the ring buffer carrying flow events
	// (flowevents.go), a power of two of at least a page. Default
	// DefaultFlowEventBuffer. Events are off until OpenFlowEvents.
	FlowEventBuffer int
}

// EBPF is the kernel backend: TC programs attached with tcx to each pod's host-side
// interface, LPM tries of entries tagged with their entry group and set, and per pod a state word per
// direction whose single atomic store is a commit's switch. Maps and links are pinned
// under PinPath.
type EBPF struct {
	*core
	objs    policyObjects
	states  *podStates // guarded by core.mu
	pinPath string
	links   map[uint32]*podLinks // guarded by core.mu
	idents  *ifIdentities        // each attached interface's identity (ifidentity.go); guarded by core.mu
	nodeMu  sync.Mutex           // serializes SetNodeAddrs
	closed  atomic.Bool
	pinLock *os.File // the pin directory, flock'ed for as long as this process uses it
	// adoption is what adopt found and repaired (Adoption).
	adoption Adoption
	// Connection tracking (conntrack.go): each pod's tables, guarded by core.mu;
	// the spec tables are made from, the connection tables' capacity, the timeouts
	// loaded.
	ctTables   map[ctRef]*ebpf.Map
	ctSpec     *ebpf.MapSpec
	ctEntries  int
	ctTimeouts ctTimeouts
	// verdictTotals are the folded counts of commits no longer in force
	// (verdicts.go); guarded by core.mu.
	verdictTotals verdictTotals
	// retiredSeen: keys of commits no longer in force and their packets at the last
	// read, folded once unchanged (Verdicts); guarded by core.mu.
	retiredSeen map[policyVerdictKey]uint64
}

// podLinks are a pod's two tcx attachments.
type podLinks struct {
	fromPod, toPod link.Link
}

const bpfFSMagic = 0xcafe4a11

// OpenEBPF loads the programs and maps, pinned under opts.PinPath, adopting what a
// previous process pinned: maps, links (switched to the newly loaded programs) and each
// entry groups and pods' content hashes, so enforcement survives an agent restart and an
// unchanged re-commit writes nothing. An inactive entry set a crashed commit left
// unlevel is deleted. A pod whose interface is there but whose link is gone (its pin
// removed, or the link detached, while no agent ran) gets its programs attached
// again; a pod whose interface is gone loses its state (Adoption names both). A pinned map whose layout or capacity differs from this build's is
// an error naming the pin path. Needs CAP_BPF to load and CAP_NET_ADMIN to attach.
func OpenEBPF(opts EBPFOptions) (*EBPF, error) { return openEBPF(opts, loadPolicy) }

// openEBPF is OpenEBPF with the object from load; tests load the other targets' objects.
func openEBPF(opts EBPFOptions, load func() (*ebpf.CollectionSpec, error)) (*EBPF, error) {
	if opts.PinPath == "" {
		opts.PinPath = DefaultPinPath
	}
	if opts.ConntrackEntries <= 0 {
		opts.ConntrackEntries = DefaultConntrackEntries
	}
	limits := opts.Limits.withDefaults()
	if err := ensureBPFFS(opts.PinPath); err != nil {
		return nil, fmt.Errorf("open ebpf dataplane: %w", err)
	}
	pinLock, err := lockPinDir(opts.PinPath)
	if err != nil {
		return nil, fmt.Errorf("open ebpf dataplane: %w", err)
	}
	e, err := openLocked(opts, load, limits)
	if err != nil {
		_ = pinLock.Close()
		return nil, err
	}
	e.pinLock = pinLock
	return e, nil
}

// lockPinDir takes an exclusive flock on the pin directory, so a second process cannot
// adopt and change the pinned state this one owns. The kernel drops the lock when the
// process exits, however it exits: a crashed agent never locks out the next one.
func lockPinDir(dir string) (*os.File, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("lock pin directory: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s (is another npagent running on this node? one agent per pin directory)", ErrPinDirLocked, dir)
		}
		return nil, fmt.Errorf("lock pin directory %s: %w", dir, err)
	}
	return f, nil
}

// openLocked is openEBPF once the pin directory is locked.
func openLocked(opts EBPFOptions, load func() (*ebpf.CollectionSpec, error), limits Limits) (*EBPF, error) {
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("open ebpf dataplane: remove memlock limit: %w", permissionHint(err, "CAP_SYS_RESOURCE"))
	}
	spec, err := load()
	if err != nil {
		return nil, fmt.Errorf("open ebpf dataplane: parse object: %w", err)
	}
	sizes := map[string]int{
		policyMapNpaPodSlot: limits.Pods, policyMapNpaSlotState: limits.Pods, policyMapNpaCtTables: limits.Pods * len(ctKinds),
		policyMapNpaPodAddrs: limits.Pods * (MaxPodAddrs + 1),
		policyMapNpaInV4:     limits.EntriesV4, policyMapNpaEgV4: limits.EntriesV4,
		policyMapNpaInV6: limits.EntriesV6, policyMapNpaEgV6: limits.EntriesV6,
	}
	for name, n := range sizes {
		spec.Maps[name].MaxEntries = uint32(n)
	}
	// Verdict counters are not pinned (each process counts anew): no capacity to check.
	if opts.VerdictEntries <= 0 {
		opts.VerdictEntries = DefaultVerdictEntries
	}
	spec.Maps[policyMapNpaVerdicts].MaxEntries = uint32(opts.VerdictEntries)
	spec.Maps[policyMapNpaAllowed].MaxEntries = uint32(limits.Pods * 2)
	if err := flowEventMapSizes(spec, limits.Pods, opts.FlowEventBuffer); err != nil {
		return nil, fmt.Errorf("open ebpf dataplane: %w", err)
	}
	// Capacities first, by name and size: the load's own error would say neither
	// which setting sizes the map nor how to resize.
	spec.Maps[policyMapNpaCtTables].InnerMap.MaxEntries = uint32(opts.ConntrackEntries)
	if err := checkPinnedCapacities(opts.PinPath, sizes); err != nil {
		var pe *PinnedCapacityError
		if errors.As(err, &pe) {
			if mm := checkPinnedConntrack(opts.PinPath, opts.ConntrackEntries); mm != nil {
				pe.Mismatches = append(pe.Mismatches, *mm)
			}
		}
		return nil, fmt.Errorf("open ebpf dataplane: %w", err)
	}
	if mm := checkPinnedConntrack(opts.PinPath, opts.ConntrackEntries); mm != nil {
		return nil, fmt.Errorf("open ebpf dataplane: %w", &PinnedCapacityError{PinPath: opts.PinPath, Mismatches: []CapacityMismatch{*mm}})
	}
	timeouts, err := setConntrackVariables(spec, &opts)
	if err != nil {
		return nil, fmt.Errorf("open ebpf dataplane: %w", err)
	}
	if err := setNodeEgressVariable(spec, opts.NodeEgress); err != nil {
		return nil, fmt.Errorf("open ebpf dataplane: %w", err)
	}
	if err := setAuditVariable(spec, opts.Audit); err != nil {
		return nil, fmt.Errorf("open ebpf dataplane: %w", err)
	}
	if err := removeLegacyConntrack(opts.PinPath); err != nil {
		return nil, fmt.Errorf("open ebpf dataplane: %w", err)
	}
	e := &EBPF{pinPath: opts.PinPath, links: map[uint32]*podLinks{}, ctTables: map[ctRef]*ebpf.Map{},
		ctSpec: spec.Maps[policyMapNpaCtTables].InnerMap.Copy(), ctEntries: opts.ConntrackEntries, ctTimeouts: timeouts}
	err = spec.LoadAndAssign(&e.objs, &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: opts.PinPath}})
	if err != nil {
		if errors.Is(err, ebpf.ErrMapIncompatible) {
			return nil, fmt.Errorf("open ebpf dataplane: pinned maps under %s do not match this build or its capacities (remove them to start over): %w", opts.PinPath, err)
		}
		return nil, fmt.Errorf("open ebpf dataplane: load: %w", permissionHint(err, "CAP_BPF"))
	}
	if err := probeTCX(e.objs.FromPod, link.AttachTCX); err != nil {
		e.objs.Close()
		return nil, fmt.Errorf("open ebpf dataplane: %w", err)
	}
	e.states, err = openPodStates(e.objs.NpaPodSlot, e.objs.NpaSlotState)
	if err != nil {
		e.objs.Close()
		return nil, fmt.Errorf("open ebpf dataplane: %w", err)
	}
	e.core = newCore(limits, &ebpfMaps{policyObjects: &e.objs, states: e.states})
	if err := e.adopt(); err != nil {
		e.closeLinks()
		e.closeConntrack()
		e.states.close()
		e.objs.Close()
		return nil, fmt.Errorf("open ebpf dataplane: adopt pinned state: %w", err)
	}
	return e, nil
}

// permissionHint says which capability is missing when the kernel refuses.
func permissionHint(err error, capability string) error {
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
		return fmt.Errorf("%w (needs %s or root)", err, capability)
	}
	return err
}

// ensureBPFFS makes dir a directory on bpffs. It never mounts bpffs: a mount the
// agent made inside its container would die with the container, and the pins with
// it (enforcement would not survive a restart), and it would need CAP_SYS_ADMIN.
// The host mounts bpffs; when /sys/fs/bpf is not one, the error says so.
func ensureBPFFS(dir string) error {
	const root = "/sys/fs/bpf"
	if strings.HasPrefix(filepath.Clean(dir)+"/", root+"/") {
		var st unix.Statfs_t
		if err := unix.Statfs(root, &st); err != nil {
			return fmt.Errorf("statfs %s: %w", root, err)
		}
		if st.Type != bpfFSMagic {
			return fmt.Errorf("%w at %s: mount it on the host (mount -t bpf bpf %s, or systemd's sys-fs-bpf.mount) and into the pod as a hostPath; the agent does not mount it itself (a mount inside its container would die with the container, and the pins with it)",
				ErrNoBPFFS, root, root)
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "links"), 0o700); err != nil {
		return fmt.Errorf("create pin directory: %w", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", dir, err)
	}
	if st.Type != bpfFSMagic {
		return fmt.Errorf("pin path %s is not on a bpf filesystem", dir)
	}
	return nil
}

// Commit implements Dataplane. A pod's first commit attaches the programs to its
// interface before any state is written, so enforcement starts at the switch.
func (e *EBPF) Commit(ifindex int, p PodPolicy) (CommitResult, error) {
	if e.closed.Load() {
		return CommitResult{}, fmt.Errorf("commit pod %d: dataplane closed", ifindex)
	}
	return e.commit(ifindex, p, e.attach)
}

// Remove implements Dataplane: the pod's state is deleted first (its traffic is no
// longer policed), then its entries, then its links are detached and unpinned.
func (e *EBPF) Remove(ifindex int) (CommitResult, error) {
	if e.closed.Load() {
		return CommitResult{}, fmt.Errorf("remove pod %d: dataplane closed", ifindex)
	}
	e.mu.Lock()
	slot, held := e.states.slots[uint32(ifindex)]
	e.mu.Unlock()
	res, err := e.remove(ifindex, e.detach)
	if err == nil && !res.Skipped {
		e.mu.Lock()
		err = e.forgetVerdicts(uint32(ifindex), slot, held)
		e.mu.Unlock()
		if err != nil {
			err = fmt.Errorf("remove pod %d: %w", ifindex, err)
		}
	}
	return res, err
}

// Pods implements Dataplane.
func (e *EBPF) Pods() []int { return e.podList() }

// Ready implements Dataplane.
func (e *EBPF) Ready() error {
	if e.closed.Load() {
		return errors.New("ebpf dataplane: closed")
	}
	return nil
}

// Close implements Dataplane: handles are closed; pinned maps and links, and so the
// enforcement, stay.
func (e *EBPF) Close() error {
	if e.closed.Swap(true) {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	errs := []error{e.closeLinks(), e.closeConntrack()}
	e.states.close()
	errs = append(errs, e.objs.Close())
	if e.pinLock != nil {
		errs = append(errs, e.pinLock.Close()) // releases the flock
	}
	return errors.Join(errs...)
}

// closeLinks closes this process's link handles and the identity map recorded with
// them; the pins, and the attachments, stay.
func (e *EBPF) closeLinks() error {
	errs := []error{e.idents.close()}
	e.idents = nil
	for _, l := range e.links {
		for _, x := range []link.Link{l.fromPod, l.toPod} {
			if x != nil {
				errs = append(errs, x.Close())
			}
		}
	}
	e.links = nil
	return errors.Join(errs...)
}

func (e *EBPF) linkPath(ifindex uint32, prog string) string {
	return filepath.Join(e.pinPath, "links", fmt.Sprintf("%d-%s", ifindex, prog))
}

// attach gives the pod the connection tables it lacks, attaches the programs
// the pod's interface lacks (both, for a new pod; the missing one, for an adopted
// pod whose link was removed) and pins their links; the tables go in while the
// programs are attached (ctInstall). undo detaches what this call attached and
// deletes the tables it made. Called with core.mu held.
func (e *EBPF) attach(ifindex int) (func(), error) {
	idx := uint32(ifindex)
	table, err := e.installConntrack(idx)
	if err != nil {
		return nil, err
	}
	l := e.links[idx]
	if l == nil {
		l = &podLinks{}
	}
	if l.fromPod != nil && l.toPod != nil { // every commit after the first: allocates nothing
		if table == nil {
			return nil, nil
		}
		if err := table.wait(); err != nil {
			return nil, err
		}
		return func() { e.dropNewConntrack(table) }, nil
	}
	had := *l
	undo := func() {
		e.dropNewConntrack(table)
		for _, x := range [][2]link.Link{{l.fromPod, had.fromPod}, {l.toPod, had.toPod}} {
			if x[0] != nil && x[1] == nil {
				_ = x[0].Unpin()
				_ = x[0].Close()
			}
		}
		*l = had
		if had.fromPod == nil && had.toPod == nil {
			delete(e.links, idx)
		}
	}
	if l.fromPod == nil {
		l.fromPod, err = e.attachOne(idx, "from_pod", e.objs.FromPod, ebpf.AttachTCXIngress)
	}
	if err == nil && l.toPod == nil {
		l.toPod, err = e.attachOne(idx, "to_pod", e.objs.ToPod, ebpf.AttachTCXEgress)
	}
	if table != nil {
		// Waited for even when a link failed: undo deletes the table once it is in.
		if werr := table.wait(); err == nil {
			err = werr
		}
	}
	if err == nil {
		err = e.idents.record(idx) // attached to this interface: it is what the links name
	}
	if err != nil {
		undo()
		return nil, err
	}
	e.links[idx] = l
	return undo, nil
}

// dropNewConntrack deletes the tables an attach made that went in.
func (e *EBPF) dropNewConntrack(c *ctInstall) {
	if c == nil {
		return
	}
	for _, t := range c.tables {
		if t.created && e.ctTables[t.ref] == t.m {
			_ = e.dropTable(t.ref)
		}
	}
}

// attachOne attaches prog at the head of the interface's tcx chain and pins its link.
// At the head, npagent judges a packet before any program attached before it or
// later without an anchor of its own (a CNI's, appended at the tail by default): a
// program ahead of it could end the chain (TCX_PASS, a redirect) and the policy would
// never see the packet. npagent's own verdicts are TCX_NEXT or TCX_DROP, so the
// programs behind it still see every packet it allows. A program attached later
// with the head anchor itself goes before npagent's: that order is its choice.
func (e *EBPF) attachOne(ifindex uint32, name string, prog *ebpf.Program, at ebpf.AttachType) (link.Link, error) {
	l, err := link.AttachTCX(link.TCXOptions{Interface: int(ifindex), Program: prog, Attach: at, Anchor: link.Head()})
	if err != nil {
		return nil, fmt.Errorf("attach %s to interface %d: %w", name, ifindex, permissionHint(err, "CAP_NET_ADMIN"))
	}
	if err := l.Pin(e.linkPath(ifindex, name)); err != nil {
		_ = l.Close()
		return nil, fmt.Errorf("pin %s link of interface %d: %w", name, ifindex, err)
	}
	return l, nil
}

// detach unpins and closes the pod's links (closing the last reference detaches).
// Called with core.mu held.
func (e *EBPF) detach(ifindex int) error {
	idx := uint32(ifindex)
	var errs []error
	if l := e.links[idx]; l != nil {
		for _, x := range []link.Link{l.fromPod, l.toPod} {
			if x != nil {
				if err := x.Unpin(); err != nil && !errors.Is(err, os.ErrNotExist) {
					errs = append(errs, err)
				}
				errs = append(errs, x.Close())
			}
		}
		delete(e.links, idx)
	}
	for _, name := range []string{"from_pod", "to_pod"} {
		if err := os.Remove(e.linkPath(idx, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	errs = append(errs, e.dropConntrack(idx), e.idents.forget(idx))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("detach interface %d: %w", ifindex, err)
	}
	return nil
}

// adopt rebuilds the core's records from the pinned maps and links. Per pod and
// direction the group set its word names holds the committed entries; a set no pod
// names is kept if it equals its group's other set (level) and deleted otherwise (a
// commit interrupted before or after its switch, adoptGroups). Entries of groups no
// pod names are deleted, pods
// whose interface is gone are removed, and pods whose interface is there but whose
// links are not (a link pin removed, or the link detached: its tcx link is defunct)
// have their programs attached again — unless the index now names another interface
// (ifidentity.go): then the pod is removed as if its interface were gone, and the new
// interface inherits neither its policy nor its connection table. Entries without
// an entry-set mark were written by an unreleased build with one generation per
// commit; no release wrote that layout, so it is not migrated: adopt refuses with
// ErrIncompatiblePins, naming the pin directory to remove.
func (e *EBPF) adopt() error {
	idents, err := openIfIdentities(e.pinPath)
	if err != nil {
		return err
	}
	e.idents = idents // closed with the links
	for ifindex, st := range e.states.all() {
		e.pods[ifindex] = &podRecord{state: st}
	}

	sets, err := e.readEntrySets()
	if err != nil {
		return err
	}
	if err := e.adoptLinks(); err != nil {
		return err
	}
	if err := e.checkInterfaces(); err != nil {
		return err
	}
	e.adoptGroups(sets)
	e.collectGarbage()
	if err := e.adoptAddrs(); err != nil {
		return fmt.Errorf("pod addresses: %w", err)
	}
	if err := e.adoptConntrack(); err != nil {
		return fmt.Errorf("connection tables: %w", err)
	}
	return nil
}

// readEntrySets reads every trie entry, by direction, group and set, counting them
// as used. Entries without an entry-set mark (an unreleased layout) refuse the
// adoption.
func (e *EBPF) readEntrySets() (map[groupSetKey]*readEntries, error) {
	sets := map[groupSetKey]*readEntries{}
	unmarked := 0
	for d, tries := range [2][2]*ebpf.Map{{e.objs.NpaInV4, e.objs.NpaInV6}, {e.objs.NpaEgV4, e.objs.NpaEgV6}} {
		where := func(group, tag uint32) *readEntries {
			if tag&tagSets == 0 {
				unmarked++
				return nil
			}
			k := groupSetKey{uint32(d), group, tagSet(tag)}
			if sets[k] == nil {
				sets[k] = &readEntries{}
			}
			return sets[k]
		}
		var k4 policyLpmKey4
		var v policyRuleValue
		it := tries[0].Iterate()
		for it.Next(&k4, &v) {
			e.used[d][0]++
			if s := where(k4.Group, k4.Tag); s != nil {
				s.k4, s.v4 = append(s.k4, k4), append(s.v4, v)
			} else {
				e.garbage[d].k4 = append(e.garbage[d].k4, k4)
			}
		}
		if err := it.Err(); err != nil {
			return nil, fmt.Errorf("iterate %s IPv4 trie: %w", Direction(d), err)
		}
		var k6 policyLpmKey6
		it = tries[1].Iterate()
		for it.Next(&k6, &v) {
			e.used[d][1]++
			if s := where(k6.Group, k6.Tag); s != nil {
				s.k6, s.v6 = append(s.k6, k6), append(s.v6, v)
			} else {
				e.garbage[d].k6 = append(e.garbage[d].k6, k6)
			}
		}
		if err := it.Err(); err != nil {
			return nil, fmt.Errorf("iterate %s IPv6 trie: %w", Direction(d), err)
		}
	}
	if unmarked > 0 {
		return nil, fmt.Errorf("%w: %d entries under %s have no entry-set mark (an unreleased layout with one generation per commit); remove the directory and restart: the pods' enforcement lapses until they are committed again",
			ErrIncompatiblePins, unmarked, e.pinPath)
	}

	return sets, nil
}

// adoptLinks switches each pinned link of a pod with state to this process's
// programs; links of pods without state, and defunct ones, are dropped.
func (e *EBPF) adoptLinks() error {
	ents, err := os.ReadDir(filepath.Join(e.pinPath, "links"))
	if err != nil {
		return err
	}
	for _, ent := range ents {
		idxStr, name, ok := strings.Cut(ent.Name(), "-")
		n, perr := strconv.ParseUint(idxStr, 10, 32)
		path := filepath.Join(e.pinPath, "links", ent.Name())
		if !ok || perr != nil || (name != "from_pod" && name != "to_pod") {
			continue
		}
		idx := uint32(n)
		l, err := link.LoadPinnedLink(path, nil)
		if err != nil {
			return fmt.Errorf("load pinned link %s: %w", path, err)
		}
		// A defunct link (its interface deleted, or the link detached) attaches
		// nothing: it is dropped, and the interface's presence decides below.
		info, err := l.Info()
		defunct := err == nil && info.TCX() != nil && info.TCX().Ifindex == 0
		if defunct || e.pods[idx] == nil {
			_ = l.Unpin()
			_ = l.Close()
			continue
		}
		prog := e.objs.FromPod
		if name == "to_pod" {
			prog = e.objs.ToPod
		}
		if err := l.Update(prog); err != nil {
			_ = l.Close()
			return fmt.Errorf("switch pinned link %s to the new program: %w", path, err)
		}
		pl := e.links[idx]
		if pl == nil {
			pl = &podLinks{}
			e.links[idx] = pl
		}
		if name == "from_pod" {
			pl.fromPod = l
		} else {
			pl.toPod = l
		}
	}
	return nil
}

// checkInterfaces drops the state of pods whose interface is gone or names another
// interface now, and re-attaches the programs of pods whose interface is there but
// whose link is not.
func (e *EBPF) checkInterfaces() error {
	// Pods whose interface is gone, or whose index names another interface now, lose
	// their state; pods whose interface is there but a link is not (its pin removed,
	// or the link detached, while no agent ran) get their programs attached again, so
	// enforcement resumes before any commit (an unchanged re-commit is skipped and
	// would not attach them).
	present, err := currentInterfaces()
	if err != nil {
		return err
	}
	for _, idx := range slices.Sorted(maps.Keys(e.pods)) {
		cur, ok := present[idx]
		pl := e.links[idx]
		live := pl != nil && (pl.fromPod != nil || pl.toPod != nil) // not defunct: the same interface
		rec, recorded := e.idents.lookup(idx)
		replaced := ok && !live && recorded && rec != cur
		if !ok || replaced {
			if pl := e.links[idx]; pl != nil {
				for _, x := range []link.Link{pl.fromPod, pl.toPod} {
					if x != nil {
						_ = x.Unpin()
						_ = x.Close()
					}
				}
				delete(e.links, idx)
			}
			if err := e.states.delete(idx); err != nil {
				return fmt.Errorf("delete state of vanished interface %d: %w", idx, err)
			}
			delete(e.pods, idx)
			if replaced {
				e.adoption.Replaced = append(e.adoption.Replaced, int(idx))
			} else {
				e.adoption.Vanished = append(e.adoption.Vanished, int(idx))
			}
			continue
		}
		if live && (!recorded || rec != cur) { // an older build's pin, or renamed while attached
			if err := e.idents.put(idx, cur); err != nil {
				return err
			}
		}
		if pl != nil && pl.fromPod != nil && pl.toPod != nil {
			continue
		}
		if _, err := e.attach(int(idx)); err != nil {
			return fmt.Errorf("re-attach the programs of interface %d, whose link was gone: %w", idx, err)
		}
		e.adoption.Reattached = append(e.adoption.Reattached, int(idx))
	}
	e.adoption.Pods = len(e.pods)
	if err := e.idents.prune(func(idx uint32) bool { return e.pods[idx] != nil }); err != nil {
		return err
	}
	return nil
}

// groupSetKey names an entry set of a direction's group, as read from the tries.
type groupSetKey struct{ dir, group, set uint32 }

// adoptGroups rebuilds the entry groups from what the pods' words name and what the
// tries hold. A set a pod names holds its committed entries (its hash the pods'); a
// set none names is kept if level with its group's other set, else deleted, as is
// every set of a group no pod names.
func (e *EBPF) adoptGroups(sets map[groupSetKey]*readEntries) {
	for _, rec := range e.pods {
		for d := range rec.dirs {
			slot := rec.state.Group[d][wordSet(rec.state.Dir[d])]
			if slot == 0 {
				continue // no entries
			}
			gs := &e.groups[d]
			id := slot >> 1
			g := gs.byID[id]
			if g == nil {
				g = &entryGroup{id: id}
				gs.byID[id] = g
				for set := range g.sets {
					if r := sets[groupSetKey{uint32(d), id, uint32(set)}]; r != nil {
						g.sets[set].entries = entriesFromTrie(r.k4, r.v4, r.k6, r.v6)
					}
				}
				gs.last = max(gs.last, id)
			}
			r := groupRef{g, slot & 1}
			held := r.held()
			switch {
			case held.refs == 0:
				held.hash = rec.state.Hash[d]
			case held.hash != rec.state.Hash[d]:
				held.hash = unknownHash // pods disagree: no later commit may find it
			}
			held.refs++
			rec.dirs[d].ref = r
		}
	}
	for k, r := range sets {
		g := e.groups[k.dir].byID[k.group]
		if g == nil {
			e.garbage[k.dir].k4 = append(e.garbage[k.dir].k4, r.k4...)
			e.garbage[k.dir].k6 = append(e.garbage[k.dir].k6, r.k6...)
			continue
		}
		ref := groupRef{g, k.set}
		held, o := ref.held(), ref.other().held()
		if held.refs == 0 && (o.hash == unknownHash || !held.entries.equal(&o.entries)) {
			e.garbage[k.dir].k4 = append(e.garbage[k.dir].k4, r.k4...)
			e.garbage[k.dir].k6 = append(e.garbage[k.dir].k6, r.k6...)
			held.entries = dirEntries{}
		}
	}
	for d := range e.groups {
		gs := &e.groups[d]
		for _, g := range gs.byID {
			for set := range g.sets {
				r := groupRef{g, uint32(set)}
				held, o := r.held(), r.other().held()
				if held.refs == 0 && held.entries.len() > 0 {
					held.hash = o.hash // level with the other
				}
				if held.hash != unknownHash && held.refs > 0 {
					gs.byHash[held.hash] = r
				}
			}
		}
	}
}

// readEntries are entries read from a trie, tagged keys and their values.
type readEntries struct {
	k4 []policyLpmKey4
	v4 []policyRuleValue
	k6 []policyLpmKey6
	v6 []policyRuleValue
}

// ebpfMaps is the store over the kernel maps.
type ebpfMaps struct {
	*policyObjects
	states *podStates
}

func (m *ebpfMaps) tries(d Direction) (v4, v6 *ebpf.Map) {
	if d == Ingress {
		return m.NpaInV4, m.NpaInV6
	}
	return m.NpaEgV4, m.NpaEgV6
}

func capacityErr(err error) error {
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.E2BIG) {
		return fmt.Errorf("%w: %w", ErrCapacity, err)
	}
	return err
}

func (m *ebpfMaps) writeEntries(d Direction, k4 []policyLpmKey4, v4 []policyRuleValue, k6 []policyLpmKey6, v6 []policyRuleValue) error {
	t4, t6 := m.tries(d)
	if len(k4) > 0 {
		n, err := t4.BatchUpdate(k4, v4, nil)
		if err != nil {
			_, _ = t4.BatchDelete(k4[:n], nil)
			return capacityErr(fmt.Errorf("IPv4 trie: %w", err))
		}
	}
	if len(k6) > 0 {
		n, err := t6.BatchUpdate(k6, v6, nil)
		if err != nil {
			_, _ = t6.BatchDelete(k6[:n], nil)
			if len(k4) > 0 {
				_, _ = t4.BatchDelete(k4, nil)
			}
			return capacityErr(fmt.Errorf("IPv6 trie: %w", err))
		}
	}
	return nil
}

func (m *ebpfMaps) deleteEntries(d Direction, k4 []policyLpmKey4, k6 []policyLpmKey6) error {
	t4, t6 := m.tries(d)
	if err := batchDelete(t4, k4); err != nil {
		return fmt.Errorf("IPv4 trie: %w", err)
	}
	if err := batchDelete(t6, k6); err != nil {
		return fmt.Errorf("IPv6 trie: %w", err)
	}
	return nil
}

// batchDelete deletes keys in order; keys already gone are skipped.
func batchDelete[K any](m *ebpf.Map, keys []K) error {
	for len(keys) > 0 {
		n, err := m.BatchDelete(keys, nil)
		if err == nil {
			return nil
		}
		if !errors.Is(err, ebpf.ErrKeyNotExist) || n >= len(keys) {
			return err
		}
		keys = keys[n+1:] // keys[n] is the missing one
	}
	return nil
}

func (m *ebpfMaps) putPod(ifindex uint32, st *policyPodState) error { return m.states.put(ifindex, st) }

func (m *ebpfMaps) deletePod(ifindex uint32) error { return m.states.delete(ifindex) }

func (m *ebpfMaps) putAddrs(keys []policyAddrKey) error {
	for _, k := range keys {
		if err := m.NpaPodAddrs.Update(&k, uint8(1), ebpf.UpdateAny); err != nil {
			return capacityErr(fmt.Errorf("address map: %w", err))
		}
	}
	return nil
}

func (m *ebpfMaps) deleteAddrs(keys []policyAddrKey) error {
	for _, k := range keys {
		if err := m.NpaPodAddrs.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("address map: %w", err)
		}
	}
	return nil
}

// adoptAddrs reads the pods' addresses from the address map: a pod with state gets
// its addresses back (an unchanged re-commit writes nothing); the keys of pods
// without state are deleted. A pod whose marker is missing (a crash between the
// writes) gets no addresses back, so its next commit writes them all again.
func (e *EBPF) adoptAddrs() error {
	var k policyAddrKey
	var v uint8
	var stale []policyAddrKey
	found := map[uint32][]netip.Addr{}
	marked := map[uint32]bool{}
	it := e.objs.NpaPodAddrs.Iterate()
	for it.Next(&k, &v) {
		if e.pods[k.Ifindex] == nil {
			stale = append(stale, k)
			continue
		}
		if a := addrOf(k); a.IsValid() {
			found[k.Ifindex] = append(found[k.Ifindex], a)
		} else {
			marked[k.Ifindex] = true
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("iterate address map: %w", err)
	}
	for idx, addrs := range found {
		if marked[idx] {
			slices.SortFunc(addrs, netip.Addr.Compare)
			e.pods[idx].addrs = addrs
		}
	}
	return e.store.deleteAddrs(stale)
}

var _ Dataplane = (*EBPF)(nil)

// probeTCX checks that the kernel attaches tcx programs (Linux >= 6.6) before any pod
// needs it: without tcx the maps load and every pod's attach fails, each pod left
// unpoliced while the agent looked healthy. It attaches prog to an interface index no
// interface has, which a kernel with tcx refuses with ENODEV (and cilium/ebpf's own
// feature test tells apart from a kernel without it: ErrNotSupported).
func probeTCX(prog *ebpf.Program, attach func(link.TCXOptions) (link.Link, error)) error {
	l, err := attach(link.TCXOptions{Interface: math.MaxInt32, Program: prog, Attach: ebpf.AttachTCXIngress})
	if err == nil {
		return l.Close()
	}
	if errors.Is(err, ebpf.ErrNotSupported) {
		var u unix.Utsname
		release := "unknown"
		if unix.Uname(&u) == nil {
			release = unix.ByteSliceToString(u.Release[:])
		}
		return fmt.Errorf("%w: tcx program attachment (Linux 6.6 or later), not in kernel %s: npagent cannot attach its programs to pods' interfaces on this node", ErrKernelFeature, release)
	}
	return nil
}
