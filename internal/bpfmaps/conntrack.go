package bpfmaps

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Connection tracking (policy.c, npa_ct_tables): each pod has three LRU tables,
// created before its programs are attached and deleted with them: the connections its
// egress policy allowed (the pod opened them) and those its ingress policy allowed (a
// peer opened them), ConntrackEntries entries each, and its fragmented datagrams'
// entries (ctFragmentEntries). A pod opening many flows evicts only its own entries;
// peers flooding the pod with connections (SYNs to an allowed port) or fragments
// evict only entries of their own kind, never the connections the pod opened. The
// tables are pinned under <PinPath>/conntrack/<ifindex>-<kind> (a restarted agent
// reopens them: connections survive a restart) and held in npa_ct_tables, keyed by
// the pod's ifindex and the kind.

// Default connection tracking timeouts (EBPFOptions fields left zero take them).
const (
	// DefaultConntrackTimeout is an entry's idle timeout: an answered (TCP:
	// established) connection, UDP, ICMP echo and other protocols.
	DefaultConntrackTimeout = 5 * time.Minute
	// DefaultConntrackUnrepliedTimeout applies until the peer answered (TCP: and the
	// handshake completed), as nf_conntrack's unreplied UDP and SYN_SENT/SYN_RECV
	// timeouts do: what unanswered SYNs and datagrams leave behind is gone soon.
	DefaultConntrackUnrepliedTimeout = 30 * time.Second
	// DefaultConntrackClosingTimeout applies once a TCP connection saw a FIN from
	// each side: long enough for the last ACK and retransmitted FINs.
	DefaultConntrackClosingTimeout = 10 * time.Second
	// DefaultConntrackResetTimeout applies once a TCP connection saw a RST within
	// the receiver's window (until the connection's next other packet).
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
	ctReplied  = 1 << 4
	ctSyn      = 1 << 5
)

// ctKind is one of a pod's connection tables (ct_table_key.kind in policy.c).
type ctKind uint32

const (
	ctOpenedByIngress ctKind = ctKind(Ingress)
	ctOpenedByEgress  ctKind = ctKind(Egress)
	ctFragments       ctKind = 2
)

var ctKinds = [...]ctKind{ctOpenedByIngress, ctOpenedByEgress, ctFragments}

// String is the kind's name in its tables' pin names.
func (k ctKind) String() string {
	switch k {
	case ctOpenedByIngress:
		return "ingress"
	case ctOpenedByEgress:
		return "egress"
	}
	return "fragments"
}

// ctFragmentEntries is the capacity of a pod's fragment table: fragmented datagrams
// are rare and their entries live seconds.
func ctFragmentEntries(conntrackEntries int) int { return max(conntrackEntries/4, 16) }

// ctRef names one of a pod's tables, as npa_ct_tables keys it.
type ctRef = policyCtTableKey

func ctRefOf(ifindex uint32, k ctKind) ctRef { return ctRef{Ifindex: ifindex, Kind: uint32(k)} }

// ctTimeouts are the timeouts the programs were loaded with.
type ctTimeouts struct{ idle, unreplied, closing, reset, fragment time.Duration }

// of is the timeout of an entry in state (ct_timeout in policy.c).
func (t ctTimeouts) of(state uint32) time.Duration {
	switch {
	case state&ctRst != 0:
		return t.reset
	case state&(ctFinFwd|ctFinRev) == ctFinFwd|ctFinRev:
		return t.closing
	case state&ctFragment != 0:
		return t.fragment
	case state&ctReplied == 0 || state&ctSyn != 0:
		return t.unreplied
	}
	return t.idle
}

// setConntrackVariables fills in the defaults of opts' conntrack fields and sets
// the programs' timeouts. The unreplied timeout is never longer than the idle one.
func setConntrackVariables(spec *ebpf.CollectionSpec, opts *EBPFOptions) (ctTimeouts, error) {
	t := ctTimeouts{opts.ConntrackTimeout, opts.ConntrackUnrepliedTimeout, opts.ConntrackClosingTimeout, opts.ConntrackResetTimeout, opts.ConntrackFragmentTimeout}
	if t.idle <= 0 {
		t.idle = DefaultConntrackTimeout
	}
	if t.unreplied <= 0 {
		t.unreplied = DefaultConntrackUnrepliedTimeout
	}
	t.unreplied = min(t.unreplied, t.idle)
	for _, v := range []struct {
		name string
		d    *time.Duration
		def  time.Duration
	}{
		{policyVarCtTimeoutNs, &t.idle, DefaultConntrackTimeout},
		{policyVarCtUnrepliedTimeoutNs, &t.unreplied, DefaultConntrackUnrepliedTimeout},
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
func ctPinDir(pinPath string) string { return filepath.Join(pinPath, "conntrack") }

// ctPinPath is where a pod's table of a kind is pinned.
func ctPinPath(pinPath string, r ctRef) string {
	return filepath.Join(ctPinDir(pinPath), fmt.Sprintf("%d-%s", r.Ifindex, ctKind(r.Kind)))
}

// parseCtPin is the table a pin name in ctPinDir names; false for any other name.
func parseCtPin(name string) (ctRef, bool) {
	idx, kind, ok := strings.Cut(name, "-")
	n, err := strconv.ParseUint(idx, 10, 32)
	if !ok || err != nil {
		return ctRef{}, false
	}
	for _, k := range ctKinds {
		if k.String() == kind {
			return ctRefOf(uint32(n), k), true
		}
	}
	return ctRef{}, false
}

// Connection state of older builds, removed by OpenEBPF (only connection state:
// connections it tracked lose their replies' passage until their next packet from the
// allowed side): the shared table of builds before per-pod tables, and the one table
// per pod (16-byte values, fragments and both directions' connections together) of
// builds before per-kind tables, with the map of maps that held them. The programs of
// the old build keep using them until adopt moves the links to the new programs.
var legacyConntrackPins = []string{"npa_ct", "npa_ct_pods", "ct"}

// removeLegacyConntrack removes the connection state older builds pinned.
func removeLegacyConntrack(pinPath string) error {
	for _, name := range legacyConntrackPins {
		if err := os.RemoveAll(filepath.Join(pinPath, name)); err != nil {
			return fmt.Errorf("remove the connection tables of an older build: %w", err)
		}
	}
	return nil
}

// ctCapacity is the capacity of a table of kind k.
func (e *EBPF) ctCapacity(k ctKind) int {
	if k == ctFragments {
		return ctFragmentEntries(e.ctEntries)
	}
	return e.ctEntries
}

// checkPinnedConntrack compares the capacity of the pinned pod connection tables
// with the one asked for (all are created alike, and a pod's fragment table is sized
// from the same setting), as checkPinnedCapacities does for the maps.
func checkPinnedConntrack(pinPath string, want int) *CapacityMismatch {
	ents, err := os.ReadDir(ctPinDir(pinPath))
	if err != nil {
		return nil
	}
	for _, ent := range ents {
		r, ok := parseCtPin(ent.Name())
		if !ok || ctKind(r.Kind) == ctFragments {
			continue
		}
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

// ctInstall is a pod's connection tables on their way into npa_ct_tables. The
// update of a map of maps returns only after an RCU grace period (the kernel waits for
// the programs that may still use the element it replaced): milliseconds, tens of them
// on a loaded node. So they run in the background, one goroutine per table, while
// attach attaches the programs, whose tcx attachments wait for grace periods of their
// own.
type ctInstall struct {
	e       *EBPF
	ifindex uint32
	tables  []ctNew
	done    chan error
}

// ctNew is one table of a ctInstall.
type ctNew struct {
	ref     ctRef
	m       *ebpf.Map
	created bool // a new table (pinned by this call), not the pinned one
}

// installConntrack starts giving a pod the tables it lacks: the pinned ones, or new
// ones. nil if the pod has them all. Called with core.mu held; so is wait.
func (e *EBPF) installConntrack(ifindex uint32) (*ctInstall, error) {
	c := &ctInstall{e: e, ifindex: ifindex}
	for _, k := range ctKinds {
		r := ctRefOf(ifindex, k)
		if e.ctTables[r] != nil {
			continue
		}
		t, err := e.openTable(r)
		if err != nil {
			c.discard()
			return nil, err
		}
		c.tables = append(c.tables, t)
	}
	if len(c.tables) == 0 {
		return nil, nil
	}
	c.done = make(chan error, len(c.tables))
	outer := e.objs.NpaCtTables
	for _, t := range c.tables {
		go func() { c.done <- outer.Put(t.ref, t.m) }()
	}
	return c, nil
}

// openTable opens a pod's pinned table, or creates and pins a new one.
func (e *EBPF) openTable(r ctRef) (ctNew, error) {
	path := ctPinPath(e.pinPath, r)
	t := ctNew{ref: r}
	var err error
	t.m, err = ebpf.LoadPinnedMap(path, nil)
	if err == nil {
		return t, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return t, fmt.Errorf("load %s connection table of interface %d: %w", ctKind(r.Kind), r.Ifindex, err)
	}
	spec := e.ctSpec.Copy()
	spec.Name = "npa_ct_" + ctKind(r.Kind).String()[:2]
	spec.MaxEntries = uint32(e.ctCapacity(ctKind(r.Kind)))
	if t.m, err = ebpf.NewMap(spec); err != nil {
		return t, fmt.Errorf("create %s connection table of interface %d: %w", ctKind(r.Kind), r.Ifindex, permissionHint(err, "CAP_BPF"))
	}
	if err := os.MkdirAll(ctPinDir(e.pinPath), 0o700); err != nil {
		_ = t.m.Close()
		return t, fmt.Errorf("create connection table pin directory: %w", err)
	}
	if err := t.m.Pin(path); err != nil {
		_ = t.m.Close()
		return t, fmt.Errorf("pin %s connection table of interface %d: %w", ctKind(r.Kind), r.Ifindex, err)
	}
	t.created = true
	return t, nil
}

// discard closes the tables of an install that never started, unpinning those it
// created.
func (c *ctInstall) discard() {
	for _, t := range c.tables {
		if t.created {
			_ = t.m.Unpin()
		}
		_ = t.m.Close()
	}
}

// wait waits for the tables to be in npa_ct_tables and records them; on failure it
// records those that went in (dropNewConntrack or dropConntrack deletes them), and
// unpins and closes the others it created.
func (c *ctInstall) wait() error {
	var errs []error
	for range c.tables {
		if err := <-c.done; err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		for _, t := range c.tables {
			var id ebpf.MapID
			if err := c.e.objs.NpaCtTables.Lookup(t.ref, &id); err == nil {
				c.e.ctTables[t.ref] = t.m
				continue
			}
			if t.created {
				_ = t.m.Unpin()
			}
			_ = t.m.Close()
		}
		return fmt.Errorf("install connection tables of interface %d: %w", c.ifindex, errors.Join(errs...))
	}
	for _, t := range c.tables {
		c.e.ctTables[t.ref] = t.m
	}
	return nil
}

// ensureConntrack gives a pod its connection tables and waits for them.
func (e *EBPF) ensureConntrack(ifindex uint32) error {
	c, err := e.installConntrack(ifindex)
	if err != nil || c == nil {
		return err
	}
	return c.wait()
}

// dropConntrack deletes a pod's connection tables. Called with core.mu held.
func (e *EBPF) dropConntrack(ifindex uint32) error {
	var errs []error
	for _, k := range ctKinds {
		if err := e.dropTable(ctRefOf(ifindex, k)); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("delete connection tables of interface %d: %w", ifindex, err)
	}
	return nil
}

// dropTable deletes one table: from npa_ct_tables, its pin, this process's handle.
func (e *EBPF) dropTable(r ctRef) error {
	var errs []error
	if err := e.objs.NpaCtTables.Delete(r); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		errs = append(errs, err)
	}
	if err := os.Remove(ctPinPath(e.pinPath, r)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	if m := e.ctTables[r]; m != nil {
		errs = append(errs, m.Close())
		delete(e.ctTables, r)
	}
	return errors.Join(errs...)
}

// adoptConntrack gives every adopted pod its tables (the pinned ones, or new ones)
// and deletes the tables of interfaces that are no longer pods. Called with core.mu
// held, after adopt settled the pods.
func (e *EBPF) adoptConntrack() error {
	ents, err := os.ReadDir(ctPinDir(e.pinPath))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for _, ent := range ents {
		r, ok := parseCtPin(ent.Name())
		if ok && e.pods[r.Ifindex] != nil {
			continue
		}
		if !ok { // not a table of this build's
			if err := os.Remove(filepath.Join(ctPinDir(e.pinPath), ent.Name())); err != nil {
				return err
			}
			continue
		}
		if err := e.dropTable(r); err != nil {
			return err
		}
	}
	var r ctRef
	var stale []ctRef
	var id ebpf.MapID
	it := e.objs.NpaCtTables.Iterate()
	for it.Next(&r, &id) {
		if e.pods[r.Ifindex] == nil {
			stale = append(stale, r)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("iterate connection tables: %w", err)
	}
	for _, r := range stale {
		if err := e.dropTable(r); err != nil {
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

// conntrackUse counts the live entries of every pod's tables, all kinds (entries
// whose timeout has not passed; the LRU keeps expired ones until it needs their room)
// against the tables' capacity. The tables are read at the call (batches of ctBatch entries), on
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
	var use MapUse
	for _, m := range tables {
		use.Max += int(m.MaxEntries())
	}
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
