package relay

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"

	"github.com/npagent/npagent/api/v1alpha1"
)

// NodeNameExtra is the user extra the apiserver sets on a service-account token
// bound to a pod (or a Node): the node the pod runs on. The relay serves that node's
// view, so a token says which node it is for, and an agent cannot ask for another's.
const NodeNameExtra = "authentication.kubernetes.io/node-name"

// reviewer authenticates bearer tokens with TokenReview and authorizes their user with
// SubjectAccessReview (the same list or watch the apiserver would check), caching both
// for ttl: agents reconnect with the same token, and each review is an apiserver
// request.
type reviewer struct {
	cs  kubernetes.Interface
	ttl time.Duration
	now func() time.Time

	mu    sync.Mutex
	cache map[[32]byte]*review
}

type review struct {
	expires time.Time
	user    authenticationv1.UserInfo
	node    string
	err     *apierrors.StatusError // the token's refusal; nil when authenticated with a node
	mu      sync.Mutex
	allowed map[string]*apierrors.StatusError // verb/resource → nil when allowed
}

// maxReviews bounds the cache: beyond it expired reviews are dropped, and if none
// is, all of them (a token flood costs reviews, not memory).
const maxReviews = 20000

func newReviewer(cs kubernetes.Interface, ttl time.Duration) *reviewer {
	return &reviewer{cs: cs, ttl: ttl, now: time.Now, cache: map[[32]byte]*review{}}
}

// authorize returns the node the request's token is bound to, once its user may verb
// resource (cluster-wide) in the apiserver's eyes.
func (a *reviewer) authorize(ctx context.Context, req *http.Request, verb, resource string) (string, *apierrors.StatusError) {
	auth := req.Header.Get("Authorization")
	token, ok := strings.CutPrefix(auth, "Bearer ")
	if !ok || token == "" {
		return "", apierrors.NewUnauthorized("relay: a bearer token is required (the agent's service-account token)")
	}
	rv, err := a.review(ctx, token)
	if err != nil {
		return "", err
	}
	if rv.err != nil {
		return "", rv.err
	}
	if err := a.access(ctx, rv, verb, resource); err != nil {
		return "", err
	}
	return rv.node, nil
}

// review returns the cached or a new TokenReview of token. An error is the
// apiserver's failure to review (not cached); a refused token is a review with err.
func (a *reviewer) review(ctx context.Context, token string) (*review, *apierrors.StatusError) {
	key := sha256.Sum256([]byte(token))
	now := a.now()
	a.mu.Lock()
	rv := a.cache[key]
	a.mu.Unlock()
	if rv != nil && now.Before(rv.expires) {
		return rv, nil
	}
	tr, err := a.cs.AuthenticationV1().TokenReviews().Create(ctx,
		&authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		return nil, apierrors.NewServiceUnavailable(fmt.Sprintf("relay: token review: %v", err))
	}
	rv = &review{expires: now.Add(a.ttl), user: tr.Status.User, allowed: map[string]*apierrors.StatusError{}}
	switch {
	case !tr.Status.Authenticated:
		rv.err = apierrors.NewUnauthorized(fmt.Sprintf("relay: the token is not valid: %s", tr.Status.Error))
	case len(tr.Status.User.Extra[NodeNameExtra]) != 1 || tr.Status.User.Extra[NodeNameExtra][0] == "":
		rv.err = apierrors.NewForbidden(schema.GroupResource{Group: v1alpha1.GroupName, Resource: "policyendpoints"}, "",
			fmt.Errorf("relay: the token of %s names no node (%s): the relay serves a node's view to a token bound to a pod on that node (the projected service-account token a pod mounts)",
				tr.Status.User.Username, NodeNameExtra))
	default:
		rv.node = tr.Status.User.Extra[NodeNameExtra][0]
	}
	a.mu.Lock()
	if len(a.cache) >= maxReviews {
		for k, old := range a.cache {
			if !now.Before(old.expires) {
				delete(a.cache, k)
			}
		}
		if len(a.cache) >= maxReviews {
			a.cache = map[[32]byte]*review{}
		}
	}
	a.cache[key] = rv
	a.mu.Unlock()
	return rv, nil
}

// access checks, once per review, that the user may verb resource cluster-wide: the
// relay hands out nothing the apiserver would refuse the agent.
func (a *reviewer) access(ctx context.Context, rv *review, verb, resource string) *apierrors.StatusError {
	k := verb + "/" + resource
	rv.mu.Lock()
	res, ok := rv.allowed[k]
	rv.mu.Unlock()
	if ok {
		return res
	}
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range rv.user.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	sar, err := a.cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User: rv.user.Username, Groups: rv.user.Groups, UID: rv.user.UID, Extra: extra,
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: verb, Group: v1alpha1.GroupName, Resource: resource},
		}}, metav1.CreateOptions{})
	if err != nil {
		return apierrors.NewServiceUnavailable(fmt.Sprintf("relay: access review: %v", err))
	}
	if !sar.Status.Allowed {
		res = apierrors.NewForbidden(schema.GroupResource{Group: v1alpha1.GroupName, Resource: resource}, "",
			fmt.Errorf("relay: %s may not %s %s cluster-wide: %s", rv.user.Username, verb, resource, sar.Status.Reason))
	}
	rv.mu.Lock()
	rv.allowed[k] = res
	rv.mu.Unlock()
	return res
}
