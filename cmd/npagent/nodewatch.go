package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/npagent/npagent/internal/kubewatch"
	"github.com/npagent/npagent/internal/nodeaddrs"
)

// nodeAddrsRefresh is how often the node's addresses are read again besides on
// netlink's change notifications.
const nodeAddrsRefresh = 30 * time.Second

// nodeStatusAddrs is a Node's own addresses: its InternalIP and ExternalIP
// status addresses (not host names).
func nodeStatusAddrs(node *corev1.Node) []netip.Addr {
	var out []netip.Addr
	for _, a := range node.Status.Addresses {
		if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil {
			out = append(out, ip.Unmap())
		}
	}
	return out
}

// watchNode watches this node's Node object (a field selector on its name: one
// object) and hands its addresses to n. It waits up to syncTimeout for the first
// list, so that the first commits find the Node's addresses exempt; after that, or
// when the Node is not found or cannot be read (RBAC: get, list, watch nodes), the
// node set goes on without them (the node IP, its interface, --node-cidrs), /readyz
// notes it, and the watch keeps trying. stop ends the watch.
func watchNode(ctx context.Context, rc *rest.Config, name string, n *nodeaddrs.Keeper, syncTimeout time.Duration, log *slog.Logger) (stop func(), err error) {
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("node %s: client: %w", name, err)
	}
	f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
	}))
	inf := f.Core().V1().Nodes().Informer()
	if err := inf.SetWatchErrorHandlerWithContext(kubewatch.NewErrorHandler(log, "nodes", nil).Handle); err != nil {
		return nil, fmt.Errorf("node %s: %w", name, err)
	}
	set := func(obj any) {
		if node, ok := obj.(*corev1.Node); ok && node.Name == name {
			n.SetStatus(nodeStatusAddrs(node), "")
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    set,
		UpdateFunc: func(_, obj any) { set(obj) },
		DeleteFunc: func(any) {
			n.SetStatus(nil, "node addresses: Node "+name+" deleted; only the node IP's interface and --node-cidrs are exempt")
		},
	}); err != nil {
		return nil, fmt.Errorf("node %s: %w", name, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	f.Start(ctx.Done())
	syncCtx, cancelSync := context.WithTimeout(ctx, syncTimeout)
	defer cancelSync()
	switch {
	case !cache.WaitForCacheSync(syncCtx.Done(), inf.HasSynced):
		log.Warn("Node object not read; exempting the node IP's interface and --node-cidrs until it is (needs get, list and watch on nodes)",
			"node", name, "waited", syncTimeout)
	case len(inf.GetStore().List()) == 0:
		n.SetStatus(nil, "node addresses: Node "+name+" not found; only the node IP's interface and --node-cidrs are exempt")
		log.Warn("Node object not found; exempting the node IP's interface and --node-cidrs until it exists", "node", name)
	}
	return func() { cancel(); f.Shutdown() }, nil
}
