package reconcile

import (
	"fmt"
	"log/slog"
	"maps"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/kubewatch"
)

// namespaceWatch is the informer of the cluster's namespaces, their names and
// labels only. The pod condition needs them for ClusterPolicyEndpoints: a cluster
// policy selects pods by its subject's namespace selector, so a new pod it
// selects is Pending until the controller lists it, not NoPolicy (which is True:
// a readiness gate would open before the cluster policy is in force).
type namespaceWatch struct {
	informer cache.SharedIndexInformer
	reg      cache.ResourceEventHandlerRegistration
}

// newNamespaceWatch builds the informer; relabeled is called with a namespace
// whose labels changed. Nothing runs until Run.
func newNamespaceWatch(restConfig *rest.Config, relabeled func(namespace string), log *slog.Logger) (*namespaceWatch, error) {
	cs, err := corev1client.NewForConfig(restConfig)
	if err != nil {
		return nil, fmt.Errorf("namespaces client: %w", err)
	}
	w := &namespaceWatch{informer: cache.NewSharedIndexInformerWithOptions(
		cache.NewListWatchFromClient(cs.RESTClient(), "namespaces", metav1.NamespaceAll, fields.Everything()), &corev1.Namespace{},
		cache.SharedIndexInformerOptions{ResyncPeriod: 0, ObjectDescription: "namespaces"})}
	if err := w.informer.SetTransform(stripNamespace); err != nil {
		return nil, fmt.Errorf("namespace informer: %w", err)
	}
	if err := w.informer.SetWatchErrorHandlerWithContext(kubewatch.NewErrorHandler(log, "namespaces", nil).Handle); err != nil {
		return nil, fmt.Errorf("namespace informer: %w", err)
	}
	w.reg, err = w.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(oldObj, obj any) {
			o, ok1 := oldObj.(*corev1.Namespace)
			n, ok2 := obj.(*corev1.Namespace)
			if ok1 && ok2 && !maps.Equal(o.Labels, n.Labels) {
				relabeled(n.Name)
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("namespace informer: %w", err)
	}
	return w, nil
}

// stripNamespace keeps what a subject's selector reads: the name and labels.
func stripNamespace(obj any) (any, error) {
	ns, ok := obj.(*corev1.Namespace)
	if !ok {
		return obj, nil
	}
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: ns.Name, UID: ns.UID, ResourceVersion: ns.ResourceVersion, Labels: ns.Labels,
	}}, nil
}

// labelsOf is the namespace's labels; false when the cache does not hold it.
func (w *namespaceWatch) labelsOf(name string) (labels.Set, bool) {
	obj, exists, err := w.informer.GetStore().GetByKey(name)
	ns, ok := obj.(*corev1.Namespace)
	if err != nil || !exists || !ok {
		return nil, false
	}
	return labels.Set(ns.Labels), true
}

// subjectSelects reports whether a cluster policy's subject selects a pod with
// these labels in a namespace with these: Namespaces selects every pod of the
// namespaces it matches, Pods those its pod selector matches in the namespaces
// its namespace selector matches. A selector that does not parse selects nothing
// (the object is rejected by its own sync).
func subjectSelects(s v1alpha1.ClusterPolicySubject, nsLabels, podLabels labels.Set) bool {
	matches := func(ls *metav1.LabelSelector, set labels.Set) bool {
		sel, err := metav1.LabelSelectorAsSelector(ls)
		return err == nil && sel.Matches(set)
	}
	switch {
	case s.Namespaces != nil:
		return matches(s.Namespaces, nsLabels)
	case s.Pods != nil:
		return matches(&s.Pods.NamespaceSelector, nsLabels) && matches(&s.Pods.PodSelector, podLabels)
	}
	return false
}
