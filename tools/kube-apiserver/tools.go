//go:build tools

// Package tools pins kube-apiserver for the test control plane. It is built by
// hack/tools.sh into a cache folder outside the clone; nothing imports it.
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
