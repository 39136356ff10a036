// Package netlab is the network plumbing shared by tests that send real
// packets: commands run with their output on failure, network namespaces that
// clean themselves up, and a TCP/UDP echo server and client that run inside a
// namespace.
//
// Each test still draws its own topology (bpfmaps routes between a pod and a
// peer through a node namespace; reconcile makes one pod the way a CNI does);
// what they share lives here. It depends on iproute2 and
// github.com/vishvananda/netns only, so the dataplane's tests can use it
// without the control-plane harness of package testenv.
package netlab
