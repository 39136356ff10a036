// Package e2enode boots a real single-node Kubernetes cluster on this machine — etcd
// and kube-apiserver (internal/testenv), kube-controller-manager, kube-scheduler,
// containerd with runc and the CNI plugins ptp/host-local/loopback, and a kubelet —
// every binary built from Go module source by hack/tools.sh, images imported into
// containerd from archives without a registry. Its tests (make e2e-node) install
// npagent with its Helm chart, through Helm's Go packages, and check it on pods the
// kubelet runs. See README.md for what the machine forces and the measured times.
package e2enode
