// Package deploy holds the manifests that run npagent in a cluster without Helm: the
// Helm chart deploy/charts/npagent rendered with its default values (make chart writes
// them; deploy/charts' tests fail when they are stale, and check them in a real
// kube-apiserver). namespace.yaml is the namespace, labelled to allow the privileged
// pod (hostNetwork, hostPath); rbac.yaml a service account allowed to get, list and
// watch PolicyEndpoints, ClusterPolicyEndpoints, its Node, pods and namespaces (their
// labels: cluster policies' subjects), and to patch pods/status (the pod condition,
// docs/how-to/pod-status.md), nothing else;
// pod-status-policy.yaml the ValidatingAdmissionPolicy narrowing that patch to the pods
// of the node the agent's token is bound to and to its own condition; daemonset.yaml one
// agent per node on the host network with CAP_BPF and CAP_NET_ADMIN only, the host's
// bpffs (which the host must mount) and state directory, NODE_NAME and NODE_IP from
// the downward API, OTLP export to a collector service.
//
// The kit installs no CRDs: the PolicyEndpoint and ClusterPolicyEndpoint CRDs come with
// the AWS Network Policy Controller, which installs (and upgrades) them. Do not apply
// config/crd over them: it is npagent's copy for tests and the demo, schema-compatible
// with the controller's at the version api/v1alpha1's tests compare against, but a
// newer controller may add fields that an older copy would prune.
//
// The package has no code.
package deploy
