// Package atomicfile replaces a file so that a crash, at any point, leaves either
// the old content or the new one under its name — never a mix, never an empty file —
// and so that the new content survives a power loss once Write returns.
//
// Write puts the data in a temporary file of its own in the target's directory,
// created exclusively (O_EXCL) with a random name and O_NOFOLLOW, so a file or a
// symlink planted there beforehand is never written through; it fsyncs the file,
// renames it over the target and fsyncs the directory, which makes the rename
// itself durable. A process stopped between the create and the rename leaves its
// temporary behind: RemoveStale, called at start before the first Write into the
// directory, removes those. Temporary names are short whatever the target's
// length, so a target whose name fits the file system's 255-byte limit can always
// be written.
//
// npagent's seen-set state file and its last valid versions use it. It needs the
// standard library only.
package atomicfile
