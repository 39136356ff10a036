// Package lastvalid keeps, per object, the newest valid version this node committed,
// durably, so a process started after a restart can put back in force the last valid
// version of an object whose current version is invalid: the pinned enforcement of
// its pods came from a version the new process never saw, and without it their
// re-commit would merge the other objects alone (for a pod that object alone isolated
// in a direction, that direction would open).
//
// A Store holds one file per Key in its directory, written with internal/atomicfile
// (an exclusive temporary, fsync, rename, fsync of the directory), so a crash leaves
// the old version or the new one, never a mix. A file is named
// kind_namespace_name.json; a name that would pass the file system's 255 bytes is cut
// and ends in a hash of the whole key (FileName), and the key is then read back from
// the version the file holds (Version.Identity). The temporaries a crash left are
// removed when a Store opens.
//
// What a file holds is the caller's: any JSON-encodable Version that can say which
// object, uid and resourceVersion it is. The package needs the standard library and
// atomicfile only; it never sees Kubernetes types (internal/reconcile stores the
// objects as the informer had them).
package lastvalid
