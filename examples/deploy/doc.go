// Package deploy holds the manifests that run npagent in a cluster: rbac.yaml (a
// namespace, a service account allowed to get, list and watch PolicyEndpoints and
// ClusterPolicyEndpoints, nothing else) and daemonset.yaml (one agent per node on
// the host network with CAP_BPF, CAP_NET_ADMIN and CAP_SYS_ADMIN, the host's bpffs
// and state directory, NODE_NAME and NODE_IP from the downward API, OTLP export to
// a collector service).
//
// The kit installs no CRDs: the PolicyEndpoint and ClusterPolicyEndpoint CRDs come with
// the AWS Network Policy Controller, which installs (and upgrades) them. Do not apply
// config/crd over them: it is npagent's copy for tests and the demo, schema-compatible
// with the controller's at the version api/v1alpha1's tests compare against, but a
// newer controller may add fields that an older copy would prune.
//
// The package has no code: its test applies the manifests to a real kube-apiserver
// and checks, by impersonating the service account, that the RBAC grants exactly
// what the agent needs.
package deploy
