package bpfmaps

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Cleaned is what Cleanup removed.
type Cleaned struct {
	// Detached lists the interfaces, ascending, whose programs were detached: their
	// pods are no longer policed.
	Detached []int
	// Pins is how many pinned objects (maps, links, connection tables) were removed.
	Pins int
}

// Cleanup ends npagent's enforcement on the node: it detaches every program it
// attached (the pinned tcx links under pinPath) and removes every pin it made and the
// directory, so that nothing keeps enforcing a frozen policy after the agent is
// uninstalled (pins and links outlive the agent by design, for restarts). It refuses
// with ErrPinDirLocked while an agent holds the directory. A missing directory is
// nothing to clean.
func Cleanup(pinPath string) (Cleaned, error) {
	var c Cleaned
	lock, err := lockPinDir(pinPath)
	if errors.Is(err, fs.ErrNotExist) {
		return c, nil
	}
	if err != nil {
		return c, err
	}
	defer lock.Close()
	// Never remove what is not npagent's: a wrong path (bpffs' root, another
	// agent's directory) is refused, not emptied.
	var st unix.Statfs_t
	if err := unix.Statfs(pinPath, &st); err != nil {
		return c, fmt.Errorf("cleanup: statfs %s: %w", pinPath, err)
	}
	if st.Type != bpfFSMagic {
		return c, fmt.Errorf("cleanup: %s is not on a bpf filesystem: refusing to remove anything", pinPath)
	}
	if _, err := os.Stat(filepath.Join(pinPath, "npa_slot_state")); err != nil {
		return c, fmt.Errorf("cleanup: %s holds no npagent state (no npa_slot_state pin): refusing to remove anything there: %w", pinPath, err)
	}
	// Links first: once its pin is gone and this process closes it, a link's
	// programs are detached.
	ents, err := os.ReadDir(filepath.Join(pinPath, "links"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return c, fmt.Errorf("cleanup: %w", err)
	}
	detached := map[int]bool{}
	for _, ent := range ents {
		path := filepath.Join(pinPath, "links", ent.Name())
		l, err := link.LoadPinnedLink(path, nil)
		if err != nil {
			return c, fmt.Errorf("cleanup: load pinned link %s: %w", path, err)
		}
		err = l.Unpin()
		_ = l.Close()
		if err != nil {
			return c, fmt.Errorf("cleanup: unpin link %s: %w", path, err)
		}
		c.Pins++
		if idx, _, ok := strings.Cut(ent.Name(), "-"); ok {
			if n, err := strconv.Atoi(idx); err == nil {
				detached[n] = true
			}
		}
	}
	for n := range detached {
		c.Detached = append(c.Detached, n)
	}
	slices.Sort(c.Detached)
	// Then every other pin (maps, connection tables): removing a pin drops the
	// kernel's reference; nothing else holds them once the links are gone.
	err = filepath.WalkDir(pinPath, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if err := os.Remove(path); err != nil {
			return err
		}
		c.Pins++
		return nil
	})
	if err != nil {
		return c, fmt.Errorf("cleanup: %w", err)
	}
	if err := os.RemoveAll(pinPath); err != nil {
		return c, fmt.Errorf("cleanup: %w", err)
	}
	return c, nil
}
