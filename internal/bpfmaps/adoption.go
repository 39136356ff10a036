package bpfmaps

import (
	"fmt"
	"net"
)

// Adoption is what OpenEBPF found pinned by a previous process and what it did
// about it, for the agent to log.
type Adoption struct {
	// Pods is how many pods' pinned state was adopted (their enforcement continued).
	Pods int
	// Reattached lists the interfaces, ascending, whose pod had pinned state but
	// whose tcx link was gone (its pin removed, or the link detached, while no agent
	// ran): their programs were attached again, and enforcement resumed at open.
	Reattached []int
	// Vanished lists the interfaces, ascending, whose pod had pinned state but
	// which no longer exist: their state was deleted.
	Vanished []int
}

// Adoption returns what OpenEBPF adopted and repaired.
func (e *EBPF) Adoption() Adoption {
	a := e.adoption
	a.Reattached = append([]int(nil), a.Reattached...)
	a.Vanished = append([]int(nil), a.Vanished...)
	return a
}

// interfaceIndexes returns the indexes of the interfaces of this network namespace.
func interfaceIndexes() (map[uint32]bool, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("list interfaces: %w", err)
	}
	present := make(map[uint32]bool, len(ifs))
	for _, i := range ifs {
		present[uint32(i.Index)] = true
	}
	return present, nil
}
