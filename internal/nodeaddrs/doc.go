// Package nodeaddrs keeps the dataplane's node set: the node's own addresses, whose
// traffic with a pod always passes (kubelet probes; the NetworkPolicy rule and the
// AWS agent's). It reads the node's interfaces and their addresses with netlink,
// listens for address changes, and writes the set through Exempter
// (bpfmaps.NodeExemption) when it changed.
//
// The node set is the node IP and the Node object's status addresses (SetStatus:
// the caller watches the Node; this package imports nothing of Kubernetes nor of
// the dataplane), --node-cidrs, every address of the interface that holds one of
// them (not loopback's, a dummy's or kube-ipvs0's: Service and DNS VIPs are not the
// node) and of the interfaces named. What the dataplane cannot hold is left out in
// that order, so the node IP stays exempt, and Health says so.
//
// It sits beside internal/podif: both are the node's network facts.
package nodeaddrs
