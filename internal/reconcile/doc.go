// Package reconcile is npagent's control loop: client-go shared informers for
// PolicyEndpoint (all namespaces) and ClusterPolicyEndpoint, a rate-limited workqueue of
// object keys, and workers that turn the objects selecting each local pod into one
// bpfmaps.PodPolicy and commit it. It drives the seen-set (internal/seen) with what
// happened, and hands each reported trigger time to a report.Sink as a report.Record.
//
// What it promises:
//
//   - Event handlers do O(1) work: record the version (its trigger annotation parsed
//     once per version), seen.ObserveVersion (the seen-set keeps an accepted
//     trigger's version until it is reported), count the delivery by cause (add, update,
//     resync, relist, delete; requeue from workers), enqueue when something may need
//     programming. Resyncs and relists of unchanged objects are counted and dropped;
//     they commit nothing (see events.go for how a relist is told from a resync). A
//     delete only records the uid: the worker forgets it (the workqueue serialises a
//     key, so a Forget never races a commit of the same object). Keys of objects with
//     work on this node are served before the others (priority.go), so writes for
//     other nodes never delay this node's own.
//   - Local pods are the podSelectorEndpoints whose hostIP is Config.NodeIP. A pod's
//     policy merges every object selecting it: namespaced rules are unioned, a direction
//     is isolated if any PolicyEndpoint isolates it (podIsolation; empty means Ingress,
//     plus Egress with egress rules, as NetworkPolicy's policyTypes default), and
//     ClusterPolicyEndpoint rules go to the Admin or Baseline tier with spec.priority,
//     keeping their order within an object. The merge is deterministic, so an unchanged
//     re-commit is skipped by the dataplane's content hash and writes nothing.
//   - A change to one object re-commits every local pod it selects and every pod it no
//     longer selects; a pod no object selects any more is removed from the dataplane.
//   - Chunks: the controller splits a policy into several objects (same
//     spec.policyRef), some with rules and no pods. A pod any chunk lists is merged
//     with every chunk of its policy, so a rules-only chunk's change re-commits the
//     pods its siblings list, and its trigger is reported on the nodes where those
//     pods are (elsewhere it is no_local_pods).
//   - Stubs: a PolicyEndpoint with no work here (no pod here, no chunk of its policy
//     with one) is cut down in the informer's transform to its identity, trigger,
//     policyRef and the nodes it selects (stubs.go): the agent's memory follows its
//     node, not the cluster. Its trigger is observed at event time as any other's; its
//     sync compiles nothing (nor validates it: the nodes of its pods do). When its
//     policy gains work here it is fetched in full from the apiserver, and a pod's
//     policy is never committed from part of its chunks (settleSiblings).
//   - Cold start: before the caches sync, the initial list is read as it arrives
//     (kubewatch.ListProgress); a namespace the list is past is complete, and its
//     objects with work here, their policies' other chunks and every
//     ClusterPolicyEndpoint are put in the pod table and its pods committed
//     (coldstart.go) — no seen-set call, no report: the ordinary sync after the caches
//     synced does those, committing the same policies again unchanged.
//   - A trigger is reported only after every local pod of the object version carrying
//     it was committed (seen.Committed), with its attempts: a commit that fails and
//     then succeeds is one record with every attempt. An object with no local pods now
//     or before consumes its trigger without a report (seen.NoLocalWork).
//   - A pod whose interface is not there yet is retried with backoff. That is not a
//     failed commit (nothing was written): the trigger stays pending, and its latency
//     when reported includes the wait, because the policy was not in force before.
//   - Bad input (a CIDR, except, port, protocol, action, tier, podIsolation, hostIP or
//     podIP that does not parse or is out of range; a domainName rule, which cannot be
//     enforced from the object alone, unless Config.Compile says to leave out those
//     that only allow; a PolicyEndpoint pod of another namespace; more map entries
//     than Config.Compile.MaxEntriesPerObject; a version whose merge with the other
//     objects of a pod the dataplane refuses; a PolicyEndpoint version that would take
//     its namespace's local pods over Config.NamespaceEntryShare of a trie, checked
//     before any commit, see share.go) rejects that object version: it is
//     not programmed, the error names the object and the field, it is counted by kind
//     and field (Counts), and it is not retried (a retry cannot heal it; the next write brings a
//     new sync). The object's last valid version stays in force for its pods (fail
//     static, as a dataplane should when its control plane sends garbage), and its
//     pending triggers stay pending until a valid version is committed or it is
//     deleted. Other objects keep being programmed. An object with no valid version
//     (never accepted: a new policy with a domainName rule, say) fails closed
//     instead: the local pods of its own namespace it names are isolated in the
//     directions its podIsolation names (node traffic still allowed), merged with
//     their other objects — it adds isolation and no allow rule, so an isolated
//     direction allows only what a valid object allows, as NetworkPolicy would with
//     its rules unknown — counted (PodsIsolated, each pod once per object) and
//     logged naming pod and object; its first valid version replaces the
//     isolation, its delete releases it. Endpoints whose addresses do not parse
//     cannot be found: counted (PodsUnisolable) and logged. A ClusterPolicyEndpoint
//     with no valid version isolates nothing: the admin and baseline tiers have no
//     isolation to fall back to (isolating would impose a default deny no policy of
//     the pod's namespace asked for, and silence the baseline tier), so its pods get
//     what their other objects give: a rejected admin Deny does not drop. A
//     malformed trigger annotation is counted (invalid_annotation) and logged, but
//     the object is still programmed: a timestamp must not cost enforcement. A
//     version without the annotation is programmed too, and counted
//     (Stats.TriggerMissing, once per version), logged once per object and noted by
//     ExplainObject: a controller that never stamps it leaves nothing to measure.
//   - The informers deliver again within about a second of the apiserver being
//     ready after a restart, however often it restarts: their ListWatch waits for
//     the apiserver instead of failing fast, reopens an ended watch, and lists again
//     in place after a 410, so client-go's reflector backoff (growing to 30-60 s,
//     reset only after two minutes) never applies to an outage. Each informer's
//     watch health (last arrival, list and watch errors, relists by cause) is in
//     Counts; WatchProblem names a watch refused by a ready apiserver, or down
//     past Config.WatchStallTimeout, or open and silent past its own timeout plus
//     that.
//   - Objects are keyed by uid in the seen-set: delete and recreate under one name
//     is two objects; the old one's pods are re-committed without it.
//   - After the caches sync, seen-set entries of objects no longer in either cache
//     are pruned. After every object of the initial list was synced once, pod state
//     the dataplane still holds (pinned by the previous process) for interfaces no
//     current object wants is removed: policies deleted while the agent was down do
//     not stay enforced.
//   - Never open by mistake: across a restart an object whose current version is
//     invalid keeps its last valid version in force (saved per object under
//     Config.LastValidDir, restored before the workers start); without a saved one,
//     the pinned state of the pods it names is kept (what the previous process
//     enforced: its valid version, or its isolation), and a pod it names with no
//     state is isolated as above. A pod whose commit fails and that holds no state
//     is isolated, counted and logged, while the commit is retried.
//
// Where each job lives:
//
//   - controller.go: Config, New, Run, the worker loop (lifecycle).
//   - internal/kubewatch (not this package): the REST client and the informers'
//     ListWatch (apiserver restarts, 410 relists in place), watch health and the
//     stall rule; controller.go builds the informers on it.
//   - watchhealth.go: each informer's watch health read for Counts and /readyz.
//   - events.go: event handlers, the transform, the relist observer.
//   - versions.go: each object version's parsed annotations, recorded at event time;
//     the uids delete events removed, until a worker forgets them.
//   - sync.go: the per-key state machine; recordOutcome is the one place a commit's
//     outcome reaches the seen-set, the Sink and the queue.
//   - podtable.go: objects, pod index, merge and commit behind one lock. A worker
//     compiles its object before it asks for the lock; the wait is measured (the
//     attempt's lock wait), and so are the merge and the dataplane's phases.
//   - gc.go: after the caches sync, restore of last valid versions; after the initial
//     sync, leftovers of the previous process.
//   - lastvalid.go: each object's last valid version, saved for the next process
//     (the objects in an internal/lastvalid store).
//   - pods.go: the watch of this node's pods (spec.nodeName; in strict mode or with
//     Config.PodStatus, one informer for both) and strict enforcing mode, whose
//     worker denies a pod no object selects until one does.
//   - podstatus.go: the pod condition (internal/podcond's type, computed from the
//     pod table and the informers' caches), patched on pods/status only when it
//     changes, coalesced per pod, rate-bounded, and only after the initial sync (a
//     restart, relist or resync writes nothing when nothing changed).
//   - internal/translate (not this package): object → rules and the per-pod merge;
//     gc.go:compile and sync.go call it, the pod table keeps what it returns.
//   - explain.go: a read-only view for an operator (ExplainObject, ExplainPod, in
//     internal/explain's wire types): what the caches, the pod table and the seen-set
//     hold now, plus the explain.History it feeds as things happen (versions at event
//     time, each sync's outcome, reports), dropped when the uid is forgotten.
//   - verdicts.go, flows.go: the verdict counters' pod names; the flow event
//     pipeline (StartFlows): the dataplane's raw events read into a bounded queue
//     (full: dropped and counted), named (pod, deciding object and rule, tier, the
//     version in force and its trigger time) and handed to report.FlowSinks.
//
// Known limits: a pod is identified by its IP, so the two addresses of a dual-stack
// pod are two pods (and would fight over one interface); commits are serialized by
// the pod table's lock (workers compile and read listers in parallel).
package reconcile
