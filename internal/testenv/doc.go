// Package testenv gives tests a real Kubernetes control plane — kube-apiserver and etcd
// built from Go module source by hack/tools.sh — with npagent's CRDs installed, and the
// paths of the other real tools the tests drive (the OpenTelemetry Collector).
//
// The CRDs installed are npagent's generated ones (config/crd), which api/v1alpha1's
// tests keep schema-compatible with the AWS Network Policy Controller's; WithCRDDir
// installs others, e.g. the controller's own, found by UpstreamCRDDir outside the
// repository (they are test data, never copied in).
//
// Nothing here is faked: Start runs the real binaries through envtest. When a binary is
// missing it is built (cached outside the clone, keyed by version); only when that build
// fails is the test skipped, with the build's error as the reason.
//
// The apiserver's certificates live in a fixed CertDir for the life of the test, so
// RestartAPIServer keeps clients' TLS valid across a restart — the restart is how tests
// reproduce the relist storm (410 Gone → informers list every object again).
//
// Start boots a control plane per test. Shared boots one per test binary (package)
// for tests that leave each other alone (each in its own Namespace, none stopping,
// restarting or compacting it), stopped by Main from the package's TestMain.
package testenv
