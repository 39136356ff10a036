// Package seen is npagent's consume-once seen-set: it decides, for each
// policy trigger time (the networking.k8s.aws/last-change-trigger-time
// annotation), whether it is reported as a programming latency, and
// guarantees each (uid, trigger) pair is reported at most once — across
// informer resyncs, relists, workqueue requeues and agent restarts. It uses
// the standard library, internal/atomicfile and the hand-over types of
// internal/report only, and never sees Kubernetes types.
//
// # State
//
// Per object, keyed by UID (delete and recreate under one name is two
// objects):
//
//   - consumed: the newest trigger already reported or deliberately suppressed;
//   - pending: triggers seen in events, newer than consumed, not yet committed,
//     each with the local time it was first received and its failed commits;
//     bounded per object (WithMaxPending), overflow keeps the oldest and the
//     newest and counts the dropped one;
//   - per pending trigger, the version that carried it (ObserveVersion, recorded
//     at event time: resourceVersion, traceparent, local work), kept under the
//     same bound and dropped with the trigger; not persisted;
//   - a guarded flag: nothing was restored or accepted for the uid yet, so the
//     start guard decides its old triggers;
//   - a local flag: a trigger of it was reported and no version since had
//     nothing on this node (it keeps the uid in the state file).
//
// Observe answers Accepted or a Reason. Committed returns the pending
// triggers the dataplane now holds, each once and with its recorded version,
// consuming without a report (no_local_pods) those whose own version had no
// work on this node; Failed keeps them pending and
// counts an attempt; NoLocalWork consumes them without a report; Forget drops
// them when the object is deleted. Every accepted trigger ends reported or
// counted under exactly one of no_local_pods, deleted and overflow (see
// Stats); re-deliveries are counted as redelivered or stale.
//
// A trigger later than the clock plus the allowed skew (WithMaxSkew, default
// 5 s) is future: counted and not consumed, by Observe, Committed or
// NoLocalWork alike. Consuming it would make every later genuine trigger of the
// object stale until the clock passed it, and the state file would carry that
// lock across restarts.
//
// A trigger that is not newer than the guard, for a uid with nothing restored
// or accepted, is before_start, and it is consumed: the next resync of that
// object answers redelivered, so before_start counts each old trigger once
// per process and redelivered counts re-deliveries, as the names say.
//
// # Persistence and the watermark
//
// With WithStatePath, the set persists the uids this node has work for —
// consumed, pending triggers with their receipt times and attempts, the guarded
// and local flags — plus a watermark W, atomically (internal/atomicfile: a uniquely named temporary,
// never through a symlink, fsync, rename, fsync dir), before
// Committed returns reports (so a reported trigger is durable before anyone
// records it), and at Persist. On restart the guard is min(W, start) instead
// of the process start, so changes made while the agent was down are
// measured with their true latency.
//
// W claims: every trigger ≤ W of a uid absent from the file was resolved or
// is older than the guard. At a write,
//
//	W = max(guard, min(observed, now) − lag)
//
// where observed is the newest receipt time of a new trigger accepted since
// the informers' caches synced (MarkSynced), and W = guard before that. W moves
// only with writes this process saw arrive: not while the watch delivers
// nothing (an outage), not with resyncs or relists (they re-deliver what the
// cache holds), not before the initial list. On restore it is bounded below by
// start − WithMaxWatermarkAge (default 1h), so a months-old file does not
// turn every object created since into a months-long latency.
//
// Which uids the file holds. Every node receives every object of the cluster,
// and most have nothing on this node: a file of every uid made each report's
// write cost grow with the cluster (8.9–14.7 ms at 100,000 objects, 2.1 ms at
// 1,000). A write holds a uid when something of it is pending or was committed
// ahead, when a trigger of it was reported and no version since had nothing here
// (the local flag; NoLocalWork clears it), or when it consumed a trigger newer
// than W. So the file, and the cost of a write (its encoding, its bytes, its
// fsync), follow the node's objects and the recent writes; what is left of the
// cluster's size is a walk over the set's maps, skipping the rest.
//
// Why that holds: after a restart a uid in the file has its triggers judged
// against its own consumed and pending triggers, never against W. A uid left out
// had nothing pending, nothing reported still current, and every trigger it
// consumed ≤ W: after a restart its re-listed trigger is ≤ W, so before_start, no
// report — as its entry would have answered (redelivered) but for the name of the
// reason. So W only decides uids the process never saw or left out: objects
// created while it was down (their triggers are newer than W: they are
// measured), objects whose first event was still in flight when it stopped —
// hence the lag (WithWatermarkLag, default 5s), which can only turn a
// before_start into the measurement of a trigger never reported — and the
// objects with nothing here, which answer before_start after each restart. W
// never drops below the guard, so what was before_start stays before_start.
//
// Restart cases (tested in restart_test.go and the property test):
//
//   - trigger reported before the restart, re-listed after: its uid is
//     restored with consumed = trigger → redelivered, no report;
//   - an object with nothing on this node, re-listed after the restart: not in
//     the file, trigger ≤ W → before_start, no report;
//   - trigger written during the downtime for a known object: newer than the
//     restored consumed → accepted, reported once with latency spanning the
//     downtime (which is what the change really took);
//   - object created during the downtime: unknown uid, trigger > W →
//     accepted and reported once;
//   - the same two without a state file: trigger < process start →
//     before_start;
//   - trigger pending (accepted, never committed) at shutdown: restored as
//     pending with its receipt time and attempts, reported by the next commit
//     — even when a newer version written during the downtime means the
//     initial list never delivers it again;
//   - object deleted during the downtime: its restored entry is dropped by
//     Prune after the caches sync (pending triggers counted deleted);
//   - crash without a final Persist: the file is the last write, which
//     covered every report, so nothing is reported twice; what changed after
//     it is replayed (a trigger consumed by NoLocalWork may be accepted
//     again) or, for an object first seen after it with a trigger ≤ W, lost
//     to before_start;
//   - damaged or unreadable file: New returns the error, starts empty with
//     guard = start; a missing file is a first start, not an error.
//
// Reports for which the write failed are still returned, with the error: at
// most once across a restart is then not guaranteed for them.
//
// # Lister ahead of handlers
//
// client-go updates an informer's store before it notifies event handlers, so
// a worker can commit a version whose trigger Observe has not seen yet.
// Committed remembers that trigger as committed ahead instead of consuming
// it: when its event arrives it is accepted and reported by the next commit
// as programmed by that earlier attempt (Report.Ahead; ProgrammedAt is when the
// dataplane first held it).
//
// # Attempts
//
// The set owns each trigger's attempt history: Failed records a failed commit
// attempt (its times, error and phases) against every pending trigger of the
// uid, and Committed returns each reported trigger with the failed attempts
// since it was accepted and then the successful one. The details of the newest
// 16 failures are kept per object; the count is kept whole and persisted, the
// details are not (after a restart a report carries the count and the
// successful attempt). The reconcile loop keeps no attempt history of its own.
//
// # Cost
//
// The set is split into 32 shards by uid, each with its own mutex. Observe
// on a re-delivered trigger takes one shard's mutex and one map lookup and
// allocates nothing; a state write encodes one shard at a time, so it holds
// up only the events of the shard it is encoding. UUID uids are stored as 16-byte keys (others in a
// string-keyed map), times as int64 Unix nanoseconds: an object with nothing
// pending costs one map slot, about 63 bytes at 100,000 objects. A state write
// encodes and writes the uids with work here and those consumed after W (26
// bytes per uid on disk) and skips the others; commits that queue behind a
// write share the next one (group commit), and commits that report nothing write
// nothing.
package seen
