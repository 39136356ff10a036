package bpfmaps

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
	// Replaced lists the indexes, ascending, whose pod had pinned state but which
	// now name another interface (the pod's was deleted and its index reused, by
	// name and hardware address: ifidentity.go): the old pod's state and connection
	// table were deleted, not inherited by the new interface.
	Replaced []int
}

// Adoption returns what OpenEBPF adopted and repaired.
func (e *EBPF) Adoption() Adoption {
	a := e.adoption
	a.Reattached = append([]int(nil), a.Reattached...)
	a.Vanished = append([]int(nil), a.Vanished...)
	a.Replaced = append([]int(nil), a.Replaced...)
	return a
}
