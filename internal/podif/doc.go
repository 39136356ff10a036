// Package podif finds a local pod's host-side network interface from its IP: the
// interface npagent attaches the pod's programs to and keys its dataplane state by;
// and lists the pod's own addresses from it (AddrLister: the host routes that name
// it), the only sources the datapath lets the pod send from.
//
// It is its own package because the lookup is a trust decision as much as a
// lookup: only an exact host route to the pod IP, without a gateway, names the
// pod's interface; anything less specific would put a pod's policy on the node's
// own uplink. It imports netlink and nothing of Kubernetes or of the dataplane.
package podif
