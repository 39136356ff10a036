package reconcile

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/seen"
	"github.com/npagent/npagent/internal/translate"
)

// The per-key state machine. A worker syncs one key at a time (the workqueue
// serialises a key), in three steps: read the lister's version and compile it
// (compute, no lock); commit what it changes through the pod table (the lock wait,
// then merge and dataplane calls); then record the outcome in exactly one place
// (recordOutcome): the seen-set, the Sink, the logs, and what the queue does next.

type outcome uint8

const (
	outcomeDone   outcome = iota // synced (or nothing to do): forget the key's backoff
	outcomeRetry                 // retry with backoff: a commit failed, an interface is missing
	outcomeGiveUp                // cannot heal (invalid input): wait for the next write
)

// syncTimes are the worker's timestamps of one sync, for the record's spans.
type syncTimes struct {
	workerStart, computeStart, computeEnd time.Time
}

// sync brings the dataplane in line with the lister's version of one object.
func (c *Controller) sync(key translate.Key, workerStart time.Time) outcome {
	obj, exists, err := c.informers[key.Kind].GetIndexer().GetByKey(key.StoreKey())
	if err != nil {
		c.log.Error("read informer cache", "object", key.String(), "err", err)
		return outcomeRetry
	}
	if !exists {
		return c.syncDeleted(key)
	}
	if pe, ok := obj.(*v1alpha1.PolicyEndpoint); ok {
		switch {
		case isStub(pe) && !c.stubs.needed(pe):
			return c.syncStub(key, pe, workerStart)
		case isStub(pe):
			// Its policy gained work here: the object is needed in full again.
			full, err := c.stubs.full(c.rc, pe)
			if err != nil {
				c.log.Warn("stub not fetched in full: retried", "object", key.String(), "err", err)
				return outcomeRetry
			}
			obj = full
		default:
			c.stubs.dropFetched(key)
		}
		if err := c.settleSiblings(key, obj.(*v1alpha1.PolicyEndpoint)); err != nil {
			c.log.Warn("sibling chunk not fetched in full: retried", "object", key.String(), "err", err)
			return outcomeRetry
		}
	}
	times := syncTimes{workerStart: workerStart, computeStart: time.Now()}
	var (
		compiled  *translate.Compiled
		m         metav1.Object
		policyRef string
	)
	switch o := obj.(type) {
	case *v1alpha1.PolicyEndpoint:
		m, policyRef = o, o.Spec.PolicyRef.Name
		compiled, err = c.cfg.Compile.PolicyEndpoint(o, c.cfg.NodeIP)
	case *v1alpha1.ClusterPolicyEndpoint:
		m, policyRef = o, o.Spec.PolicyRef.Name
		compiled, err = c.cfg.Compile.ClusterPolicyEndpoint(o, c.cfg.NodeIP)
	default:
		c.log.Error("unexpected object in informer cache", "object", key.String(), "type", fmt.Sprintf("%T", obj))
		return outcomeGiveUp
	}
	v := c.versions.checkout(m)
	var touched []netip.Addr // the pods whose condition this sync may change
	defer func() { c.statusSynced(key, v.uid, v.resourceVersion, touched) }()
	if err == nil {
		err = compiled.BuildSets(c.pods.version(key, v.uid))
	}
	times.computeEnd = time.Now()
	log := c.log.With("kind", key.Kind.String(), "namespace", key.Namespace, "name", key.Name, "uid", v.uid, "resourceVersion", v.resourceVersion)

	if err != nil {
		// Not programmed: the last valid version (if any) stays in force for its pods,
		// and the triggers stay pending until a later version is committed. Without
		// one, the pods it names are isolated in the directions it names. A retry
		// cannot heal bad input; the next write of the object brings a new sync. Pods
		// a recreated object's predecessor left are still re-committed without it.
		rej := translate.ReadRejected(obj, c.cfg.NodeIP)
		res := c.pods.commitVersion(key, v.uid, nil, &rej, func(res *commitResult) { c.synced(v, res, err) })
		touched = union(res.affected, rej.Named)
		c.forgetDeleted(key, res.replaced)
		return c.rejected(key, v, err, &res, log)
	}

	compiled = c.cfg.Compile.NodeLocal(compiled, obj, c.cfg.NodeIP) // validated in full, kept node-local
	if compiled.DomainRulesDropped > 0 {
		log.Info("domainName rules left out (--drop-fqdn-allow-rules): traffic to those names is not allowed by them", "rules", compiled.DomainRulesDropped)
	}
	res := c.pods.commitVersion(key, v.uid, compiled, nil, func(res *commitResult) { c.synced(v, res, nil) })
	touched = union(res.affected, compiled.Pods)
	compiled.Settle()
	c.forgetDeleted(key, res.replaced)
	if res.rejected != nil {
		return c.rejected(key, v, res.rejected, &res, log)
	}
	if !res.noLocalWork {
		if err := c.lastValid.save(key, obj); err != nil {
			log.Warn("last valid version not saved: after a restart with an invalid current version, this object's rules would be missing", "err", err)
		}
	}
	return c.recordOutcome(key, v, policyRef, &res, times, log)
}

// rejected records a version rejected for bad input, err: counted and logged once per
// written version, its triggers left pending until a later version is committed. Not
// retried (a retry cannot heal bad input; the next write brings a new sync), unless
// pods its commit of the last valid version reached are still to be committed.
func (c *Controller) rejected(key translate.Key, v objectVersion, err error, res *commitResult, log *slog.Logger) outcome {
	if c.pods.noteRejected(key, v.uid, v.resourceVersion) {
		field := "spec"
		if fe := (*translate.FieldError)(nil); errors.As(err, &fe) {
			field = fe.Field
		}
		c.stats.invalid(key.Kind, field)
		log.Error("policy object rejected, not programmed", "err", err)
		if res.unisolable > 0 {
			// Its pods cannot all be found: those of this node among the endpoints
			// that do not parse stay as they are (open, if nothing else selects them).
			c.stats.podsUnisolable.Add(uint64(res.unisolable))
			log.Error("rejected object has no valid version and names pods whose addresses do not parse: they cannot be isolated", "endpoints", res.unisolable)
		}
	}
	for _, pod := range res.isolated {
		// Fail closed, as for a pod whose policy cannot be committed: the object's
		// rules are unknown, so its directions allow only what valid objects allow.
		c.stats.podsIsolated.Add(1)
		log.Error("pod isolated: an object naming it was rejected and has no valid version", "pod", pod,
			"ingressDenied", res.isolatedDirs[0], "egressDenied", res.isolatedDirs[1], "err", err)
	}
	c.recordCommit(key, res, log)
	if len(res.notDone) > 0 && !res.invalidPolicy() {
		return outcomeRetry
	}
	return outcomeGiveUp
}

// syncDeleted re-commits the pods a deleted object selected, without it, and forgets
// the deleted uids in the seen-set.
func (c *Controller) syncDeleted(key translate.Key) outcome {
	res, uid := c.pods.commitDeleted(key)
	c.statusChanged(res.affected)
	log := c.log.With("kind", key.Kind.String(), "namespace", key.Namespace, "name", key.Name, "uid", uid)
	c.recordCommit(key, &res, log)
	switch {
	case res.err != nil && res.invalidPolicy():
		return outcomeGiveUp
	case res.err != nil || len(res.notDone) > 0:
		return outcomeRetry
	}
	c.forgetDeleted(key, uid)
	if err := c.lastValid.remove(key); err != nil {
		log.Warn("last valid version of a deleted object not removed", "err", err)
	}
	return outcomeDone
}

// forgetDeleted forgets, in the seen-set and the version table, the uids delete
// events removed under key, and also (when not "") a uid the key no longer holds.
// Only workers call it, so the Forget cannot race a commit of the same object.
func (c *Controller) forgetDeleted(key translate.Key, also types.UID) {
	uids := c.deleted.take(key)
	if also != "" {
		uids = append(uids, also)
	}
	for _, uid := range uids {
		c.cfg.Seen.Forget(string(uid))
		c.versions.forget(uid)
	}
}

// recordCommit hands one commit attempt to the Sink and logs a failure. Every commit
// that called the dataplane passes here once.
func (c *Controller) recordCommit(key translate.Key, res *commitResult, log *slog.Logger) {
	if res.calls == 0 {
		return
	}
	err := res.err
	if err == nil && res.rejected != nil {
		err = res.rejected // the dataplane refused a commit of this attempt
	}
	c.cfg.Sink.Committed(key.Kind, res.attemptWith(err))
	if res.err != nil {
		log.Error("commit failed", "pods", len(res.notDone), "err", res.err)
	}
}

// recordOutcome turns a commit of a valid version into seen-set calls, records and a
// queue outcome.
func (c *Controller) recordOutcome(key translate.Key, v objectVersion, policyRef string, res *commitResult, times syncTimes, log *slog.Logger) outcome {
	uid := string(v.uid)
	if res.noLocalWork {
		// Nothing of this object is (or was) on this node: nothing to commit, and no
		// latency to report — a near-zero one would drag the percentiles down.
		c.cfg.Seen.NoLocalWork(uid, v.trigger)
		c.stats.noLocalWork.Add(1)
		return outcomeDone
	}
	c.recordCommit(key, res, log)
	if res.err != nil {
		c.cfg.Seen.Failed(uid, *res.attemptWith(res.err))
		if res.invalidPolicy() {
			// The merged policy is one the dataplane can never take (too many port
			// rules for a prefix, say); retrying the same input cannot help.
			c.stats.invalid(key.Kind, "spec")
			return outcomeGiveUp
		}
		return outcomeRetry
	}
	if len(res.notDone) > 0 {
		// A local pod's interface is not there yet (or could not be resolved). That is
		// not a failed commit — nothing was written for the pod — so seen.Failed is not
		// called; the trigger stays pending and the key is retried with backoff. When
		// the pod appears and is committed, the trigger is reported with a latency that
		// includes the wait: the policy was not in force on this node before.
		c.stats.interfaceWaits.Add(1)
		if c.pods.noteWaiting(key, v.resourceVersion) {
			log.Info("waiting for pod interfaces", "pods", fmt.Sprint(res.notDone), "err", res.resolveErr)
		}
		// For /readyz the object is programmed: every pod of it that has an interface
		// here has its policy, and a pod without one has no traffic to police. A stale
		// PolicyEndpoint naming a pod long gone must not hold the agent unready (and a
		// DaemonSet rollout with it).
		c.ready.programmed(key)
		return outcomeRetry
	}
	if res.pods == 0 {
		// Every affected pod had neither a policy nor committed state (pods the
		// object left before their interface ever appeared): nothing of this node's
		// dataplane was touched, so there is no latency to report.
		c.cfg.Seen.NoLocalWork(uid, v.trigger)
		c.stats.noLocalWork.Add(1)
		return outcomeDone
	}

	// Each trigger is reported with its own version (the seen-set keeps it from the
	// event that brought the trigger), and only if that version changed this node:
	// the commit may serve triggers of versions coalesced while the key waited, or a
	// recreated object whose predecessor's pods it removes here — a change no trigger
	// of the new uid caused; the seen-set consumes those as no_local_pods. A trigger
	// restored from the state file has no record in this process: the committed
	// version stands in, as before.
	reports, err := c.cfg.Seen.Committed(uid, v.trigger, res.attempt)
	if err != nil {
		log.Warn("seen-set state not persisted: these reports may repeat after a restart", "err", err)
	}
	versions := make([]seen.Version, len(reports))
	var served []string // every reported trigger's traceparent, when a commit served several
	for i, r := range reports {
		tv := seen.Version{ResourceVersion: v.resourceVersion, TraceParent: v.traceParent, RemovedOnly: v.removedOnly()}
		if r.Version != nil {
			tv = *r.Version
		}
		versions[i] = tv
		if len(reports) > 1 && tv.TraceParent != "" {
			served = append(served, tv.TraceParent)
		}
	}
	for i, r := range reports {
		tv := versions[i]
		rec := &report.Record{
			Kind:            key.Kind,
			Namespace:       key.Namespace,
			Name:            key.Name,
			UID:             uid,
			PolicyRef:       policyRef,
			ResourceVersion: tv.ResourceVersion,
			Trigger:         r.Trigger,
			Received:        r.ReceivedAt,
			WorkerStart:     times.workerStart,
			ComputeStart:    times.computeStart,
			ComputeEnd:      times.computeEnd,
			Attempts:        r.Attempts,
			Pods:            res.pods,
			Entries:         res.entries,
			TraceParent:     tv.TraceParent,
			RemovedOnly:     tv.RemovedOnly,
			Served:          othersThan(served, tv.TraceParent),
		}
		if r.Ahead {
			// An earlier commit already held this version (the lister ran ahead of the
			// event): that commit ends the latency, and this sync's timings are not it.
			rec.WorkerStart, rec.ComputeStart, rec.ComputeEnd = time.Time{}, time.Time{}, time.Time{}
		}
		c.cfg.Sink.Report(rec)
	}
	c.stats.reports.Add(uint64(len(reports)))
	return outcomeDone
}

// othersThan returns the traceparents in all but own (once), nil if none.
func othersThan(all []string, own string) []string {
	var out []string
	skipped := false
	for _, tp := range all {
		if tp == own && !skipped {
			skipped = true
			continue
		}
		out = append(out, tp)
	}
	return out
}
