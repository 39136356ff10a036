//go:build tools

// Package tools pins the helm CLI for make e2e-node's quick start check
// (test/e2enode), at the Helm release the chart tests link. hack/tools.sh builds
// it into a cache folder outside the clone; nothing imports this.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
