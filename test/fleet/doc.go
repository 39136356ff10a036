// Package fleet measures many agents against one real apiserver (issue 23, "A fleet
// run"): kube-apiserver and etcd from the tool cache (internal/testenv) with the
// controller's CRDs, N npagent processes built from cmd/npagent, each with the memory
// dataplane, a node name and node IP of its own and host routes to its own local pods
// (one veth each), M PolicyEndpoints (testenv/fixture.BenchPE) whose first pod is on
// one agent's node (so ~1/N of the objects are local to each agent), and a churn
// driver writing W trigger-stamped updates a second.
//
// TestFleet measures two baselines (the churn with no agent running,
// so what the agents add to the apiserver is told from the writes' own cost; the
// agents with no churn) and three phases, and prints a markdown table:
//
//   - cold start: every agent started at once, until every /readyz answers 200;
//   - steady churn: apiserver (and etcd) CPU-seconds from /proc, the bytes the
//     apiserver sent for PolicyEndpoints by its own metrics (watch event sizes plus
//     list response sizes), each agent's CPU and RSS from /proc, and trigger→commit
//     p50/p99 across the fleet from the agents' own reports;
//   - an apiserver restart (the relist storm): from the stop until every agent has
//     committed a probe write made to one of its local objects once the apiserver
//     is back (it cannot see that write before its watch is open again), with the
//     apiserver's CPU and the agents' peak RSS over that time.
//
// The reports are the agents' policy.program root spans (one per reported
// trigger), exported over OTLP/HTTP to a sink in the test (internal/testenv/otlptest):
// exactly once holds when no (node, uid, trigger) arrives twice, every trigger the
// writer stamped is reported once on the node of its local pod, and nothing else is
// reported (the objects' creation triggers predate the agents: before_start).
//
// TestFleet runs only with NPAGENT_FLEET=1, which make fleet sets: the measured
// profile (40 agents, 10,000 objects, 20 writes/s) by default, the test's own
// defaults (3 agents, 300 objects, ~1-2 min) with make fleet FLEET_ARGS=. The relay
// variant is a flag away: -relay runs npagent relay, or -relay-cmd starts another and
// -agent-args points every agent at it (see make fleet's help and BENCHMARKS.md,
// "Fleet").
//
// TestRelayTier runs in make test (make e2e; it needs root, the tools and the CRDs,
// and skips saying which is missing, or fails with NPAGENT_TEST_NO_SKIP=1): the same
// harness with a fixed small profile (3 agents, 300 objects, npagent relay), asserting
// what a bypassed or broken relay would break — in steady state the agents watch the
// relay (its /metrics: two watchers per agent) and the apiserver serves one
// PolicyEndpoint watch, the relay's (its apiserver_longrunning_requests), about one
// watch event per write and no LIST; the relay SIGKILLed mid-churn, the agents watch
// the apiserver and report the outage's writes, and the relay started again on the
// same address gets their watches back within the agent's 30 s retry; then the
// apiserver restart, and exactly once over the whole run. It took 80 s at load ~9 on
// the shared 2-core machine (213 s at load ~17), a third of it the agent's 30 s wait
// before it asks the relay again (no flag sets it), and the agent's build.
package fleet
