package bpfmaps

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// An interface index names an interface only while it exists: once a pod's veth is
// deleted, the kernel may give its index to the next pod's (a CNI may also ask for
// it). A process that adopts pinned state after downtime must not take a new pod's
// interface for the old one: it would inherit the old pod's policy and connection
// table. So each attached interface's identity beyond its index — its name and
// hardware address, fixed by the CNI when it creates the veth — is recorded in a
// pinned map beside the links, and compared when the state is adopted.
//
// A live (not defunct) tcx link proves the interface is the one it was attached to:
// deleting an interface leaves its links defunct. The recorded identity decides only
// when no link is live (the interface was deleted, or the links were detached or
// unpinned while no agent ran). An interface with no record (pinned by a build that
// kept none) is taken for the same one, as before, and recorded.

// ifIdentPin is the identity map's pin name under the pin directory.
const ifIdentPin = "npa_if_ident"

// ifIdentity is what identifies an interface beyond its index: its name
// (IFNAMSIZ bytes) and its hardware address (up to MAX_ADDR_LEN bytes).
type ifIdentity struct {
	Name    [unix.IFNAMSIZ]byte
	AddrLen uint32
	Addr    [32]byte
}

func identityOf(i net.Interface) ifIdentity {
	var id ifIdentity
	copy(id.Name[:], i.Name)
	id.AddrLen = uint32(copy(id.Addr[:], i.HardwareAddr))
	return id
}

func (id ifIdentity) String() string {
	return fmt.Sprintf("%s (%s)", strings.TrimRight(string(id.Name[:]), "\x00"), net.HardwareAddr(id.Addr[:min(id.AddrLen, 32)]))
}

// ifIdentities is the pinned map from interface index to its identity at attach.
// Its capacity is independent of Limits (entries are allocated on insert), so a
// change of limits never makes it incompatible.
type ifIdentities struct {
	m *ebpf.Map
}

// openIfIdentities opens the pinned identity map, creating it if there is none. A
// pinned map of another layout is replaced: its records are lost, and every adopted
// interface is taken for the same one, as without records.
func openIfIdentities(pinPath string) (*ifIdentities, error) {
	spec := &ebpf.MapSpec{
		Name: ifIdentPin, Type: ebpf.Hash, KeySize: 4, ValueSize: uint32(binary.Size(ifIdentity{})),
		MaxEntries: 1 << 16, Flags: unix.BPF_F_NO_PREALLOC, Pinning: ebpf.PinByName,
	}
	opts := ebpf.MapOptions{PinPath: pinPath}
	m, err := ebpf.NewMapWithOptions(spec, opts)
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		if err := os.Remove(filepath.Join(pinPath, ifIdentPin)); err != nil {
			return nil, fmt.Errorf("replace the interface identity map of another layout: %w", err)
		}
		m, err = ebpf.NewMapWithOptions(spec, opts)
	}
	if err != nil {
		return nil, fmt.Errorf("interface identity map: %w", err)
	}
	return &ifIdentities{m: m}, nil
}

// lookup returns the identity recorded for ifindex, if any.
func (t *ifIdentities) lookup(ifindex uint32) (ifIdentity, bool) {
	var id ifIdentity
	if t == nil || t.m.Lookup(&ifindex, &id) != nil {
		return ifIdentity{}, false
	}
	return id, true
}

// record stores the identity the interface ifindex has now.
func (t *ifIdentities) record(ifindex uint32) error {
	if t == nil {
		return nil
	}
	i, err := net.InterfaceByIndex(int(ifindex))
	if err != nil {
		return fmt.Errorf("record identity of interface %d: %w", ifindex, err)
	}
	return t.put(ifindex, identityOf(*i))
}

func (t *ifIdentities) put(ifindex uint32, id ifIdentity) error {
	if err := t.m.Put(&ifindex, &id); err != nil {
		return fmt.Errorf("record identity of interface %d: %w", ifindex, err)
	}
	return nil
}

// forget deletes ifindex's record.
func (t *ifIdentities) forget(ifindex uint32) error {
	if t == nil {
		return nil
	}
	if err := t.m.Delete(&ifindex); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("forget identity of interface %d: %w", ifindex, err)
	}
	return nil
}

// prune deletes the records of interfaces keep does not hold.
func (t *ifIdentities) prune(keep func(uint32) bool) error {
	var idx uint32
	var id ifIdentity
	var stale []uint32
	it := t.m.Iterate()
	for it.Next(&idx, &id) {
		if !keep(idx) {
			stale = append(stale, idx)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("iterate interface identities: %w", err)
	}
	for _, idx := range stale {
		if err := t.forget(idx); err != nil {
			return err
		}
	}
	return nil
}

func (t *ifIdentities) close() error {
	if t == nil {
		return nil
	}
	return t.m.Close()
}

// currentInterfaces returns the interfaces of this network namespace by index, with
// their identities.
func currentInterfaces() (map[uint32]ifIdentity, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("list interfaces: %w", err)
	}
	present := make(map[uint32]ifIdentity, len(ifs))
	for _, i := range ifs {
		present[uint32(i.Index)] = identityOf(i)
	}
	return present, nil
}
