// Package charts renders the Helm charts of this directory with Helm's own Go packages
// (the engine and the manifest sorter `helm template` uses), so tests and make chart
// need no helm binary.
//
// The chart npagent/ runs the agent: a DaemonSet on every node, its ServiceAccount and
// a read-only ClusterRole on the policy endpoint objects, optionally its Namespace.
// examples/deploy holds the chart rendered with the default values (make chart writes
// it, a test checks it is current).
//
// The tests render the chart with default and non-default values, lint it as helm lint
// does, create every object with a server-side dry run in a real kube-apiserver, apply
// the RBAC and act as the service account to check it may read the policy endpoint
// objects and nothing more, and check the pod's security context, probes, GOMEMLIMIT
// and metrics address.
package charts
