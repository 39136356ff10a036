package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// tempMarker is in every temporary's name, after a leading dot and at most
// maxTempBase bytes of the target's name; RemoveStale goes by it.
const (
	tempMarker  = ".tmp-"
	maxTempBase = 64
)

// randomSuffix makes a temporary's name unique; tests replace it.
var randomSuffix = func() string { return strconv.FormatUint(rand.Uint64(), 16) }

// tempName is the temporary for path with the given suffix: hidden, in path's
// directory, short whatever path's length.
func tempName(path, suffix string) string {
	dir, base := filepath.Split(path)
	if len(base) > maxTempBase {
		base = base[:maxTempBase]
	}
	return filepath.Join(dir, "."+base+tempMarker+suffix)
}

// isTemp reports whether a directory entry's name is one of Write's temporaries
// (the older ".tmp-*" of os.CreateTemp included).
func isTemp(name string) bool {
	return strings.HasPrefix(name, ".") && strings.Contains(name, tempMarker)
}

// createTemp creates a new temporary for path, never opening an existing file or
// following a symlink (O_EXCL, O_NOFOLLOW): a name taken is retried with another.
func createTemp(path string, perm fs.FileMode) (*os.File, error) {
	for range 100 {
		f, err := os.OpenFile(tempName(path, randomSuffix()), os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, perm)
		if errors.Is(err, fs.ErrExist) || errors.Is(err, syscall.ELOOP) {
			continue
		}
		return f, err
	}
	return nil, fmt.Errorf("create a temporary beside %s: every name tried exists", path)
}

// Write replaces path with data, with permissions perm (before the umask) if it
// creates it: a temporary file in path's directory is written, fsynced and renamed
// over path, then the directory is fsynced. On an error path is as it was (or, if
// only the directory's fsync failed, replaced but perhaps not durable) and the
// temporary is removed.
func Write(path string, data []byte, perm fs.FileMode) (err error) {
	f, err := createTemp(path, perm)
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		return fmt.Errorf("replaced %s, but it may not be durable: %w", path, err)
	}
	return nil
}

// syncDir makes the directory's entries (a rename into it) durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync directory: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}

// RemoveStale removes the temporaries Write left in dir when a process stopped
// between creating one and renaming it, and returns how many it removed. Call it at
// start, before any Write into dir: a temporary of a Write in progress would be
// removed too. A missing dir holds none.
func RemoveStale(dir string) (int, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("remove stale temporaries: %w", err)
	}
	removed := 0
	var errs []error
	for _, e := range ents {
		if e.IsDir() || !isTemp(e.Name()) {
			continue
		}
		// Remove unlinks a symlink itself, never its target.
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		removed++
	}
	if err := errors.Join(errs...); err != nil {
		return removed, fmt.Errorf("remove stale temporaries: %w", err)
	}
	return removed, nil
}
