package atomicfile

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/npagent/npagent/internal/testenv/skip"
)

// names lists dir's entries.
func names(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestWrite: a new file is created with its permissions, an existing one replaced,
// no temporary is left, and a target whose name takes the whole 255 bytes a name
// may have is written too (its temporary's name is short).
func TestWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state")
	for _, data := range []string{"one", "two, longer"} {
		if err := Write(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		if got := readFile(t, path); got != data {
			t.Errorf("content %q, want %q", got, data)
		}
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, %v; want 0600", fi.Mode(), err)
	}
	long := filepath.Join(dir, strings.Repeat("n", 255))
	if err := Write(long, []byte("long"), 0o600); err != nil {
		t.Fatalf("255-byte name: %v", err)
	}
	if got := names(t, dir); !slices.Equal(got, []string{strings.Repeat("n", 255), "state"}) {
		t.Errorf("directory holds %q, want the two targets only", got)
	}
}

// TestWriteNeverFollowsSymlinks: a symlink planted at the name Write's temporary
// takes next (a fixed name would always be it) is neither followed nor replaced:
// the file it points to keeps its content, Write uses another name.
func TestWriteNeverFollowsSymlinks(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state")
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	planted := tempName(path, "planted")
	if err := os.Symlink(victim, planted); err != nil {
		t.Fatal(err)
	}
	dangling := tempName(path, "dangling") // O_CREAT alone would create its target
	if err := os.Symlink(filepath.Join(dir, "created-through-link"), dangling); err != nil {
		t.Fatal(err)
	}
	suffixes := []string{"planted", "dangling", "free"}
	orig := randomSuffix
	t.Cleanup(func() { randomSuffix = orig })
	randomSuffix = func() string { s := suffixes[0]; suffixes = suffixes[1:]; return s }

	if err := Write(path, []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, victim); got != "precious" {
		t.Errorf("the symlink's target was written: %q", got)
	}
	if _, err := os.Lstat(filepath.Join(dir, "created-through-link")); !os.IsNotExist(err) {
		t.Errorf("a file was created through the dangling symlink: %v", err)
	}
	for _, l := range []string{planted, dangling} {
		if fi, err := os.Lstat(l); err != nil || fi.Mode()&os.ModeSymlink == 0 {
			t.Errorf("%s is no longer the planted symlink: %v", l, err)
		}
	}
	if got := readFile(t, path); got != "new" {
		t.Errorf("target %q, want new", got)
	}
}

// TestWriteFailureKeepsOld: a Write that fails leaves the old file as it was and
// no temporary: the rename fails (the target is a directory), and, as root, the
// write itself fails (a full file system).
func TestWriteFailureKeepsOld(t *testing.T) {
	t.Run("rename", func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "state")
		if err := os.MkdirAll(filepath.Join(path, "inside"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := Write(path, []byte("new"), 0o600); err == nil {
			t.Fatal("Write over a non-empty directory succeeded")
		}
		if got := names(t, dir); !slices.Equal(got, []string{"state"}) {
			t.Errorf("directory holds %q, want the old target only", got)
		}
	})
	t.Run("full", func(t *testing.T) {
		if !skip.Root() {
			skip.Unmet(t, "needs root: mounts a small tmpfs to fill")
		}
		dir := t.TempDir()
		if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"); err != nil {
			skip.Unmet(t, "cannot mount a tmpfs: %v", err)
		}
		t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
		path := filepath.Join(dir, "state")
		if err := Write(path, []byte("old"), 0o600); err != nil {
			t.Fatal(err)
		}
		err := Write(path, bytes.Repeat([]byte("x"), 1<<20), 0o600)
		if err == nil {
			t.Fatal("writing 1 MiB to a 64 KiB file system succeeded")
		}
		t.Logf("the failed write: %v", err)
		if got := readFile(t, path); got != "old" {
			t.Errorf("target %q after a failed write, want old", got)
		}
		if got := names(t, dir); !slices.Equal(got, []string{"state"}) {
			t.Errorf("directory holds %q, want the old target only", got)
		}
	})
}

// TestRemoveStale: the temporaries a crash left (this package's and the older
// os.CreateTemp ".tmp-*" ones, a symlink among them) are removed, the symlink's
// target is not; the targets, other files and directories stay.
func TestRemoveStale(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim")
	for _, f := range []string{victim, filepath.Join(dir, "state"), filepath.Join(dir, "keep.json"),
		tempName(filepath.Join(dir, "state"), "1f"), tempName(filepath.Join(dir, strings.Repeat("n", 200)), "2e"), filepath.Join(dir, ".tmp-123")} {
		if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(victim, tempName(filepath.Join(dir, "other"), "3d")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, ".sub.tmp-dir"), 0o700); err != nil {
		t.Fatal(err)
	}
	n, err := RemoveStale(dir)
	if err != nil || n != 4 {
		t.Errorf("RemoveStale = %d, %v; want 4 removed", n, err)
	}
	if got, want := names(t, dir), []string{".sub.tmp-dir", "keep.json", "state", "victim"}; !slices.Equal(got, want) {
		t.Errorf("directory holds %q, want %q", got, want)
	}
	if n, err := RemoveStale(filepath.Join(dir, "missing")); n != 0 || err != nil {
		t.Errorf("RemoveStale of a missing directory = %d, %v", n, err)
	}
}
