//go:build tools

// Package tools pins the container runtime of make e2e-node: containerd (the daemon
// and its ctr client, which imports images from an OCI archive without a registry),
// runc and the CNI plugins ptp, host-local and loopback. hack/tools.sh builds them
// into a cache folder outside the clone; nothing imports this.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
	_ "github.com/containernetworking/plugins/plugins/ipam/host-local"
	_ "github.com/containernetworking/plugins/plugins/main/loopback"
	_ "github.com/containernetworking/plugins/plugins/main/ptp"
	_ "github.com/opencontainers/runc"
)
