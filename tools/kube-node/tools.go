//go:build tools

// Package tools pins the node's Kubernetes components for make e2e-node: kubelet,
// kube-scheduler and kube-controller-manager, and kubectl for the quick start
// check, at the version of the test kube-apiserver. hack/tools.sh builds them into
// a cache folder outside the clone; nothing imports this.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
