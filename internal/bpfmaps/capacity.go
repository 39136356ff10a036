package bpfmaps

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
)

// Default capacities (Limits and EBPFOptions fields left zero take them).
const (
	DefaultPods             = 4096
	DefaultEntriesV4        = 65536
	DefaultEntriesV6        = 16384
	DefaultConntrackEntries = 4096 // per pod
)

// ErrPinnedCapacity is wrapped by OpenEBPF when a pinned map was created with
// another capacity than the one asked for. The error is a *PinnedCapacityError
// naming the pin directory, each map and both sizes; nothing was changed. A pinned
// map's capacity is fixed when it is created: to resize, stop the agent, remove the
// pin directory and start it with the new sizes (docs/how-to/resize-maps.md).
var ErrPinnedCapacity = errors.New("pinned eBPF maps have another capacity")

// PinnedCapacityError lists the pinned maps whose capacity differs from the one
// asked for.
type PinnedCapacityError struct {
	PinPath    string
	Mismatches []CapacityMismatch
}

// CapacityMismatch is one pinned map of another capacity.
type CapacityMismatch struct {
	Map     string // the map's pin name, e.g. npa_in_v4
	Setting string // what sizes it: "Limits.EntriesV4" ...
	Pinned  int    // the pinned map's capacity
	Wanted  int    // the capacity this open asked for
}

func (e *PinnedCapacityError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%v under %s:", ErrPinnedCapacity, e.PinPath)
	for i, m := range e.Mismatches {
		if i > 0 {
			b.WriteString(";")
		}
		fmt.Fprintf(&b, " %s (%s) was created with %d entries, this start asks for %d", m.Map, m.Setting, m.Pinned, m.Wanted)
	}
	fmt.Fprintf(&b, ". Start with the pinned sizes, or resize: stop the agent, remove %s, start it with the new sizes"+
		" (pods are not enforced from the removal until the agent has committed each again)", e.PinPath)
	return b.String()
}

// Is makes errors.Is(err, ErrPinnedCapacity) hold.
func (e *PinnedCapacityError) Is(target error) bool { return target == ErrPinnedCapacity }

// mapSetting names what sizes each map, for PinnedCapacityError.
var mapSetting = map[string]string{
	policyMapNpaPodSlot:   "Limits.Pods",
	policyMapNpaSlotState: "Limits.Pods",
	policyMapNpaInV4:      "Limits.EntriesV4",
	policyMapNpaEgV4:      "Limits.EntriesV4",
	policyMapNpaInV6:      "Limits.EntriesV6",
	policyMapNpaEgV6:      "Limits.EntriesV6",
	policyMapNpaCtTables:  "Limits.Pods",
	policyMapNpaPodAddrs:  "Limits.Pods",
}

// checkPinnedCapacities compares the capacity of each map already pinned under dir
// with the one asked for (sizes, by map name), before anything is loaded or
// changed. A map that is not pinned, or cannot be opened, is left to the load.
func checkPinnedCapacities(dir string, sizes map[string]int) error {
	var mism []CapacityMismatch
	for _, name := range slices.Sorted(maps.Keys(sizes)) {
		path := filepath.Join(dir, name)
		if _, err := os.Stat(path); err != nil {
			continue
		}
		m, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			continue
		}
		pinned := int(m.MaxEntries())
		_ = m.Close()
		if pinned != sizes[name] {
			mism = append(mism, CapacityMismatch{Map: name, Setting: mapSetting[name], Pinned: pinned, Wanted: sizes[name]})
		}
	}
	if len(mism) > 0 {
		return &PinnedCapacityError{PinPath: dir, Mismatches: mism}
	}
	return nil
}
