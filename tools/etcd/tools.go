//go:build tools

// Package tools pins etcd for the test control plane. It is built by
// hack/tools.sh into a cache folder outside the clone; nothing imports it.
package tools

import _ "go.etcd.io/etcd/server/v3"
