package bpfmaps

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Connection tracking (policy.c, npa_ct_pods): each pod has its own LRU table of
// ConntrackEntries entries, created before its programs are attached and deleted
// with them, so a pod opening many flows evicts only its own entries. A table is
// pinned under <PinPath>/ct/<ifindex> (a restarted agent reopens it: connections
// survive a restart) and held in npa_ct_pods, keyed by the pod's ifindex.

// Default connection tracking timeouts (EBPFOptions fields left zero take them).
const (
	// DefaultConntrackTimeout is an entry's idle timeout: an open TCP connection,
	// UDP, ICMP echo and other protocols.
	DefaultConntrackTimeout = 5 * time.Minute
	// DefaultConntrackClosingTimeout applies once a TCP connection saw a FIN from
	// each side: long enough for the last ACK and retransmitted FINs.
	DefaultConntrackClosingTimeout = 10 * time.Second
	// DefaultConntrackResetTimeout applies once a TCP connection saw a RST.
	DefaultConntrackResetTimeout = 2 * time.Second
	// DefaultConntrackFragmentTimeout is how long the later fragments of a datagram
	// whose first fragment passed still pass.
	DefaultConntrackFragmentTimeout = 10 * time.Second
)

// ct_value.state bits (policy.c).
const (
	ctFinFwd   = 1 << 0
	ctFinRev   = 1 << 1
	ctRst      = 1 << 2
	ctFragment = 1 << 3
)

// ctTimeouts are the timeouts the programs were loaded with.
type ctTimeouts struct{ idle, closing, reset, fragment time.Duration }

// of is the timeout of an entry in state (ct_timeout in policy.c).
func (t ctTimeouts) of(state uint32) time.Duration {
	switch {
	case state&ctRst != 0:
		return t.reset
	case state&(ctFinFwd|ctFinRev) == ctFinFwd|ctFinRev:
		return t.closing
	case state&ctFragment != 0:
		return t.fragment
	}
	return t.idle
}

// setConntrackVariables fills in the defaults of opts' conntrack fields and sets
// the programs' timeouts.
func setConntrackVariables(spec *ebpf.CollectionSpec, opts *EBPFOptions) (ctTimeouts, error) {
	t := ctTimeouts{opts.ConntrackTimeout, opts.ConntrackClosingTimeout, opts.ConntrackResetTimeout, opts.ConntrackFragmentTimeout}
	for _, v := range []struct {
		name string
		d    *time.Duration
		def  time.Duration
	}{
		{policyVarCtTimeoutNs, &t.idle, DefaultConntrackTimeout},
		{policyVarCtClosingTimeoutNs, &t.closing, DefaultConntrackClosingTimeout},
		{policyVarCtResetTimeoutNs, &t.reset, DefaultConntrackResetTimeout},
		{policyVarCtFragmentTimeoutNs, &t.fragment, DefaultConntrackFragmentTimeout},
	} {
		if *v.d <= 0 {
			*v.d = v.def
		}
		if err := spec.Variables[v.name].Set(uint64(v.d.Nanoseconds())); err != nil {
			return t, fmt.Errorf("set %s: %w", v.name, err)
		}
	}
	return t, nil
}

// ctPinDir is where the pods' connection tables are pinned.
func ctPinDir(pinPath string) string { return filepath.Join(pinPath, "ct") }

// legacyConntrackPin is the shared connection table of builds before per-pod
// tables. Only connection state: OpenEBPF removes it (connections it tracked lose
// their replies' passage until their next packet from the allowed side).
const legacyConntrackPin = "npa_ct"

// checkPinnedConntrack compares the capacity of a pinned pod table with the one
// asked for (all are created alike), as checkPinnedCapacities does for the maps.
func checkPinnedConntrack(pinPath string, want int) *CapacityMismatch {
	ents, err := os.ReadDir(ctPinDir(pinPath))
	if err != nil {
		return nil
	}
	for _, ent := range ents {
		m, err := ebpf.LoadPinnedMap(filepath.Join(ctPinDir(pinPath), ent.Name()), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			continue
		}
		pinned := int(m.MaxEntries())
		_ = m.Close()
		if pinned != want {
			return &CapacityMismatch{Map: "ct (per-pod connection tables)", Setting: "ConntrackEntries", Pinned: pinned, Wanted: want}
		}
		return nil
	}
	return nil
}

// ctInstall is a pod's connection table on its way into npa_ct_pods. The update
// of a map of maps returns only after an RCU grace period (the kernel waits for the
// programs that may still use the element it replaced): milliseconds, tens of them on
// a loaded node. So it runs in the background while attach attaches the programs,
// whose tcx attachments wait for grace periods of their own.
type ctInstall struct {
	e       *EBPF
	ifindex uint32
	m       *ebpf.Map
	created bool // a new table (pinned by this call), not the pinned one
	done    chan error
}

// installConntrack starts giving a pod its connection table: the pinned one, or a
// new one. nil if the pod has its table. Called with core.mu held; so is wait.
func (e *EBPF) installConntrack(ifindex uint32) (*ctInstall, error) {
	if e.ctTables[ifindex] != nil {
		return nil, nil
	}
	path := filepath.Join(ctPinDir(e.pinPath), strconv.FormatUint(uint64(ifindex), 10))
	c := &ctInstall{e: e, ifindex: ifindex, done: make(chan error, 1)}
	var err error
	c.m, err = ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("load connection table of interface %d: %w", ifindex, err)
		}
		spec := e.ctSpec.Copy()
		spec.Name = "npa_ct"
		if c.m, err = ebpf.NewMap(spec); err != nil {
			return nil, fmt.Errorf("create connection table of interface %d: %w", ifindex, permissionHint(err, "CAP_BPF"))
		}
		if err := os.MkdirAll(ctPinDir(e.pinPath), 0o700); err != nil {
			_ = c.m.Close()
			return nil, fmt.Errorf("create connection table pin directory: %w", err)
		}
		if err := c.m.Pin(path); err != nil {
			_ = c.m.Close()
			return nil, fmt.Errorf("pin connection table of interface %d: %w", ifindex, err)
		}
		c.created = true
	}
	outer, m := e.objs.NpaCtPods, c.m
	go func() { c.done <- outer.Put(ifindex, m) }()
	return c, nil
}

// wait waits for the table to be in npa_ct_pods and records it; on failure it
// unpins a table it created.
func (c *ctInstall) wait() error {
	if err := <-c.done; err != nil {
		if c.created {
			_ = c.m.Unpin()
		}
		_ = c.m.Close()
		return fmt.Errorf("install connection table of interface %d: %w", c.ifindex, err)
	}
	c.e.ctTables[c.ifindex] = c.m
	return nil
}

// ensureConntrack gives a pod its connection table and waits for it.
func (e *EBPF) ensureConntrack(ifindex uint32) error {
	c, err := e.installConntrack(ifindex)
	if err != nil || c == nil {
		return err
	}
	return c.wait()
}

// dropConntrack deletes a pod's connection table. Called with core.mu held.
func (e *EBPF) dropConntrack(ifindex uint32) error {
	var errs []error
	if err := e.objs.NpaCtPods.Delete(ifindex); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		errs = append(errs, err)
	}
	path := filepath.Join(ctPinDir(e.pinPath), strconv.FormatUint(uint64(ifindex), 10))
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	if m := e.ctTables[ifindex]; m != nil {
		errs = append(errs, m.Close())
		delete(e.ctTables, ifindex)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("delete connection table of interface %d: %w", ifindex, err)
	}
	return nil
}

// adoptConntrack gives every adopted pod its table (the pinned one, or a new one)
// and deletes the tables of interfaces that are no longer pods. Called with core.mu
// held, after adopt settled the pods.
func (e *EBPF) adoptConntrack() error {
	ents, err := os.ReadDir(ctPinDir(e.pinPath))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for _, ent := range ents {
		n, err := strconv.ParseUint(ent.Name(), 10, 32)
		if err == nil && e.pods[uint32(n)] != nil {
			continue
		}
		if err := e.dropConntrack(uint32(n)); err != nil {
			return err
		}
	}
	var idx uint32
	var stale []uint32
	var id ebpf.MapID
	it := e.objs.NpaCtPods.Iterate()
	for it.Next(&idx, &id) {
		if e.pods[idx] == nil {
			stale = append(stale, idx)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("iterate connection tables: %w", err)
	}
	for _, idx := range stale {
		if err := e.dropConntrack(idx); err != nil {
			return err
		}
	}
	for idx := range e.pods {
		if err := e.ensureConntrack(idx); err != nil {
			return err
		}
	}
	return nil
}

// closeConntrack closes this process's table handles; pins and tables stay.
func (e *EBPF) closeConntrack() error {
	var errs []error
	for _, m := range e.ctTables {
		errs = append(errs, m.Close())
	}
	e.ctTables = nil
	return errors.Join(errs...)
}

// conntrackUse counts the live entries of every pod's table (entries whose timeout
// has not passed; the LRU keeps expired ones until it needs their room) against the
// tables' capacity. The tables are read at the call (batches of ctBatch entries), on
// duplicated handles so commits are not held up meanwhile.
func (e *EBPF) conntrackUse() (MapUse, error) {
	e.mu.Lock()
	tables := make([]*ebpf.Map, 0, len(e.ctTables))
	var err error
	for _, m := range e.ctTables {
		c, cerr := m.Clone()
		if cerr != nil {
			err = cerr
			break
		}
		tables = append(tables, c)
	}
	e.mu.Unlock()
	defer func() {
		for _, m := range tables {
			_ = m.Close()
		}
	}()
	if err != nil {
		return MapUse{}, err
	}
	use := MapUse{Max: e.ctEntries * len(tables)}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil { // bpf_ktime_get_ns's clock
		return MapUse{}, err
	}
	now := uint64(ts.Nano())
	for _, m := range tables {
		n, err := countLive(m, now, e.ctTimeouts)
		if err != nil {
			return MapUse{}, err
		}
		use.Used += n
	}
	return use, nil
}

// ctBatch is how many connection table entries one batch lookup reads. A hash
// map's batch holds at least one whole bucket; buckets hold a handful.
const ctBatch = 256

// countLive counts the entries of a connection table that have not timed out at
// now (CLOCK_MONOTONIC nanoseconds).
func countLive(m *ebpf.Map, now uint64, t ctTimeouts) (int, error) {
	keys := make([]policyCtKey, ctBatch)
	vals := make([]policyCtValue, ctBatch)
	var cursor ebpf.MapBatchCursor
	total := 0
	for {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		for _, v := range vals[:n] {
			if int64(now-v.LastSeenNs) < t.of(v.State).Nanoseconds() { // signed, as ct_live
				total++
			}
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}
