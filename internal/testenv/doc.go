// Package testenv gives tests a real Kubernetes control plane — kube-apiserver and etcd
// built from Go module source by hack/tools.sh — with npagent's CRDs installed, and the
// paths of the other real tools the tests drive (the OpenTelemetry Collector).
//
// Nothing here is faked: Start runs the real binaries through envtest. When a binary is
// missing it is built (cached outside the clone, keyed by version); only when that build
// fails is the test skipped, with the build's error as the reason.
//
// The apiserver's certificates live in a fixed CertDir for the life of the test, so
// RestartAPIServer keeps clients' TLS valid across a restart — the restart is how tests
// reproduce the relist storm (410 Gone → informers list every object again).
package testenv
