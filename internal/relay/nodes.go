package relay

import (
	"net/netip"
	"slices"
	"strconv"
	"sync"

	corev1 "k8s.io/api/core/v1"
)

// nodeAddrs is the Node objects' addresses, as the relay filters by them: a node's
// InternalIP and ExternalIP status addresses (the agent's --node-ip is one of them
// in every supported setup; a PolicyEndpoint's hostIP is the pod's status.hostIP).
type nodeAddrs struct {
	mu    sync.Mutex
	nodes map[string]nodeEntry
	wake  chan struct{} // closed and replaced when a node's addresses change
}

type nodeEntry struct {
	addrs []netip.Addr // sorted
	// changed is the resourceVersion at or after which a view with these addresses
	// began: a watch from before it was listed with other addresses (410).
	changed uint64
}

func newNodeAddrs() *nodeAddrs {
	return &nodeAddrs{nodes: map[string]nodeEntry{}, wake: make(chan struct{})}
}

// statusAddrs is a Node's InternalIP and ExternalIP addresses, sorted.
func statusAddrs(node *corev1.Node) []netip.Addr {
	var out []netip.Addr
	for _, a := range node.Status.Addresses {
		if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil {
			out = append(out, ip.Unmap())
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// set records node's addresses; at is the PolicyEndpoint feed's resourceVersion
// when the change was seen.
func (n *nodeAddrs) set(node *corev1.Node, at uint64) {
	addrs := statusAddrs(node)
	n.mu.Lock()
	defer n.mu.Unlock()
	prev, ok := n.nodes[node.Name]
	if ok && slices.Equal(prev.addrs, addrs) {
		return
	}
	changed := at
	if rv, err := strconv.ParseUint(node.ResourceVersion, 10, 64); err == nil && rv > changed {
		changed = rv
	}
	if !ok {
		changed = 0 // a node seen for the first time: no view had other addresses
	}
	n.nodes[node.Name] = nodeEntry{addrs: addrs, changed: changed}
	close(n.wake)
	n.wake = make(chan struct{})
}

func (n *nodeAddrs) remove(name string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.nodes, name)
	close(n.wake)
	n.wake = make(chan struct{})
}

// get returns node's addresses, whether it is known, and a channel closed when any
// node's addresses change.
func (n *nodeAddrs) get(name string) (nodeEntry, bool, <-chan struct{}) {
	n.mu.Lock()
	defer n.mu.Unlock()
	e, ok := n.nodes[name]
	return e, ok, n.wake
}
