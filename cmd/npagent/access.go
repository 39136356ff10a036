package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/reconcile"
)

// errForbidden starts checkAccess's error: the apiserver refuses the agent.
var errForbidden = errors.New("forbidden")

// access is one resource the agent reads across the cluster, and the verbs its
// informers use (list, then watch).
type access struct {
	group, resource string
	verbs           []string
}

func (a access) String() string {
	if a.group == "" {
		return a.resource
	}
	return a.resource + "." + a.group
}

// agentAccess is what the reconcile loop needs before it can sync: without it
// the informers retry forever and /readyz could only say "caches not synced".
// The Node watch is not here: it runs without its Node (nodewatch.go).
func agentAccess(mode reconcile.EnforcingMode, podCondition bool) []access {
	watchList := []string{"list", "watch"}
	need := []access{
		{v1alpha1.GroupName, "policyendpoints", watchList},
		{v1alpha1.GroupName, "clusterpolicyendpoints", watchList},
	}
	if mode == reconcile.EnforcingStrict || podCondition {
		need = append(need, access{"", "pods", watchList})
	}
	if podCondition {
		need = append(need, access{"", "namespaces", watchList})
	}
	return need
}

// checkAccess asks the apiserver (SelfSubjectAccessReview) whether the agent's
// user may do each verb of need, and names the first resource with verbs denied:
// "forbidden: cannot list policyendpoints.networking.k8s.aws: the ClusterRole
// lacks list". When the review itself is refused, a real list stands in for it,
// and its Forbidden names the verb list.
func checkAccess(ctx context.Context, cs kubernetes.Interface, need []access) error {
	for _, a := range need {
		var lacking []string
		for _, verb := range a.verbs {
			review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
				ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: verb, Group: a.group, Resource: a.resource}}}
			r, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
			if err != nil {
				lacking = listForbidden(ctx, cs, a)
				break
			}
			if !r.Status.Allowed {
				lacking = append(lacking, verb)
			}
		}
		if len(lacking) > 0 {
			verbs := strings.Join(lacking, " and ")
			return fmt.Errorf("%w: cannot %s %s: the ClusterRole bound to the agent's service account (or --kubeconfig's user) lacks %s; grant get, list and watch on %s (the chart's ClusterRole does)",
				errForbidden, verbs, a, verbs, a)
		}
	}
	return nil
}

// listForbidden lists one object of a: ["list"] when the apiserver answers
// Forbidden, else nothing (the informers will tell).
func listForbidden(ctx context.Context, cs kubernetes.Interface, a access) []string {
	path := "/api/v1/" + a.resource
	if a.group != "" {
		path = "/apis/" + a.group + "/" + v1alpha1.SchemeGroupVersion.Version + "/" + a.resource
	}
	err := cs.Discovery().RESTClient().Get().AbsPath(path).Param("limit", "1").Do(ctx).Error()
	if apierrors.IsForbidden(err) {
		return []string{"list"}
	}
	return nil
}
