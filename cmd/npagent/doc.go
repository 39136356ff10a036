// Command npagent is the node agent: one per node (a DaemonSet), it watches the
// PolicyEndpoint and ClusterPolicyEndpoint objects of networking.k8s.aws/v1alpha1,
// programs the policy of this node's pods into the eBPF dataplane, and reports how
// long each change took to reach it (npagent.policy.programming.latency), each
// trigger time once.
//
// Usage:
//
//	npagent --node-ip=10.0.0.5 [flags]   # run the agent
//	npagent version                      # print the version
//	npagent explain [--json] pe/<ns>/<name> | cpe/<name> | pod/<ns>/<name> | <pod IP>
//	npagent explain verdict --from <ip|pod/ns/name> --to <ip|pod/ns/name> --port <n>/<proto>|icmp
//	npagent wait (--pod <ns>/<name> | --ip <addr>) [--policy <ns>/<name>]... [--timeout D]
//
// Every flag falls back to an environment variable when absent (--node-ip to
// $NODE_IP, --node-name to $NODE_NAME, --kubeconfig to $KUBECONFIG, the others to
// $NPAGENT_<FLAG>); `npagent --help` lists them by group (flagGroups), wrapped to
// 100 columns. OTEL_* variables configure OTLP
// export (see internal/telemetry).
//
// What it promises:
//
//   - A bad flag names the flag and exits 2 at once: the error once and a one-line
//     hint, no usage dump. Local, certain failures at start exit 1 naming the cause
//     and the fix (eBPF without privileges names CAP_BPF and CAP_NET_ADMIN;
//     --metrics-addr in use; no kubeconfig outside a pod names --kubeconfig,
//     $KUBECONFIG and the service account). With --log-format=json the line saying
//     why the agent stopped is JSON too (loggedError).
//   - What may heal by itself does not stop the agent, since a crash loop backs off
//     for minutes after the cause is gone: an apiserver that is unreachable at start
//     or does not serve the CRDs yet, or forbids what the informers need (RBAC,
//     asked by SelfSubjectAccessReview: access.go, named with the verbs missing),
//     is probed again (GET /version, the group and the reviews, each bounded by
//     --apiserver-timeout; 1s doubling to 30s between attempts)
//     while HTTP already answers; a malformed OTEL_* setting is logged once and
//     telemetry degrades (without OTEL_RESOURCE_ATTRIBUTES, else without OTLP
//     export, else off), listed by /readyz.
//   - --dataplane=memory polices nothing and logs a warning saying so.
//   - /metrics on --metrics-addr (default: the node IP, port 9090; ":9090" for
//     every interface; Prometheus; the latency histogram is native, protobuf
//     exposition), every timeout set, at most 16 requests in flight (503 beyond).
//   - The probes on --health-addr (default 127.0.0.1:9438), a listener with its own
//     limit and short timeouts, on loopback so that no pod can starve it (every pod
//     reaches the node IP): /livez and its alias /healthz (liveness and startup
//     probe: 500 when one sync has run, or keys have waited with no sync finishing,
//     for longer than --stall-timeout; 200 while waiting for the apiserver), /readyz
//     (200 once the apiserver answered, the informer caches synced, the dataplane
//     is ready, the loop is not stalled and no informer's watch is stalled (down for
//     longer than --watch-stall-timeout, or open and silent past its own timeout
//     plus that); 503 naming the first that is not; what runs degraded listed
//     either way).
//   - A read-only JSON debug API on the unix socket --debug-socket (default
//     /run/npagent/debug.sock, mode 0600, never TCP; debug.go), 503 until the
//     reconcile loop exists and its caches synced (explain then exits 3, "agent
//     starting", not 1 for an object it has not read yet). A socket that cannot be made degrades (listed by
//     /readyz), it does not stop the agent. explain prints what it answers for an
//     object or a pod, and explain verdict whether a packet would pass this node's
//     programs and what decides it (verdicts.go: the ends resolved by the reconcile
//     loop, the packet judged from the kernel's maps by bpfmaps.Judger; exit 1 when
//     denied); wait polls it until a pod's objects are programmed (exit 0),
//     the timeout (1) or, when the agent never answers, 3; a bad command line is 2.
//   - SIGTERM or SIGINT: stop taking work, finish the commit in flight, persist the
//     seen-set to --state-file, flush telemetry within --shutdown-timeout, exit 0.
//     The next start restores the seen-set, so a trigger reported before the
//     restart is not reported again, and changes made while the agent was down are
//     still measured.
//
// main is thin: run(ctx, args, getenv, stdout, stderr) is the whole agent, so tests
// drive it in-process as well as through the built binary.
package main
