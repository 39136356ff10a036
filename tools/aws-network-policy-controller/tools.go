//go:build tools

// Package tools pins the AWS Network Policy Controller, the managed controller
// that writes PolicyEndpoints on EKS, for make e2e-node's quick start check
// (test/e2enode): it runs beside the node's apiserver as it runs beside a
// cluster. hack/tools.sh builds it into a cache folder outside the clone;
// nothing imports this.
package tools

import _ "github.com/aws/amazon-network-policy-controller-k8s/cmd"
