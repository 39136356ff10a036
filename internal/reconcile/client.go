package reconcile

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/npagent/npagent/api/v1alpha1"
)

// newRESTClient returns a REST client for networking.k8s.aws/v1alpha1. No generated
// clientset exists for these types; list and watch are all the agent needs, and
// client-go's ListWatch builds both on a plain REST client.
func newRESTClient(restConfig *rest.Config) (*rest.RESTClient, error) {
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("reconcile: scheme: %w", err)
	}
	cfg := rest.CopyConfig(restConfig)
	cfg.GroupVersion = &v1alpha1.SchemeGroupVersion
	cfg.APIPath = "/apis"
	cfg.ContentType = runtime.ContentTypeJSON // custom resources are served as JSON only
	cfg.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	if cfg.UserAgent == "" {
		cfg.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	rc, err := rest.RESTClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("reconcile: rest client: %w", err)
	}
	return rc, nil
}

// newListWatch lists and watches one resource in all namespaces. It calls beginList
// before every request that (re)lists: a List, or a watch that streams the initial
// state (sendInitialEvents, client-go's WatchList mode). That is how the loop tells a
// relist's re-deliveries from new writes (see transform in controller.go).
func newListWatch(rc rest.Interface, resource string, beginList func()) *cache.ListWatch {
	base := cache.NewListWatchFromClient(rc, resource, metav1.NamespaceAll, fields.Everything())
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			beginList()
			return base.ListWithContextFunc(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			if opts.SendInitialEvents != nil && *opts.SendInitialEvents {
				beginList()
			}
			return base.WatchFuncWithContext(ctx, opts)
		},
	}
}
