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
//
// Every flag falls back to an environment variable when absent (--node-ip to
// $NODE_IP, --node-name to $NODE_NAME, --kubeconfig to $KUBECONFIG, the others to
// $NPAGENT_<FLAG>); `npagent --help` lists them. OTEL_* variables configure OTLP
// export (see internal/telemetry).
//
// What it promises:
//
//   - Startup fails fast and says why: a bad flag names the flag (exit 2); an
//     unreachable apiserver names its address; missing CRDs are named; eBPF without
//     privileges names CAP_BPF and CAP_NET_ADMIN. The apiserver is probed (GET
//     /version, bounded by --apiserver-timeout) before any informer starts.
//   - --dataplane=memory polices nothing and logs a warning saying so.
//   - HTTP on --metrics-addr: /healthz (alive), /readyz (200 once the informer
//     caches synced and the dataplane is ready; 503 with the reason otherwise),
//     /metrics (Prometheus; the latency histogram is native, protobuf exposition).
//   - SIGTERM or SIGINT: stop taking work, finish the commit in flight, persist the
//     seen-set to --state-file, flush telemetry within --shutdown-timeout, exit 0.
//     The next start restores the seen-set, so a trigger reported before the
//     restart is not reported again, and changes made while the agent was down are
//     still measured.
//
// main is thin: run(ctx, args, getenv, stdout, stderr) is the whole agent, so tests
// drive it in-process as well as through the built binary.
package main
