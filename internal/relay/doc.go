// Package relay is npagent's relay tier (`npagent relay`): it lists and watches
// PolicyEndpoints, ClusterPolicyEndpoints and Nodes once, and serves each agent its
// node's view of the first two, on the apiserver's own paths and with its list and
// watch semantics, so the agent's informer consumes it through its ListWatch
// unchanged (internal/kubewatch with a rest.Config whose host is the relay).
//
// Why. Kubernetes cannot filter PolicyEndpoints per node (the node is inside
// spec.podSelectorEndpoints[]), so without a relay every agent receives, decodes and
// caches every write of the cluster, and the apiserver sends each write to every
// node (DESIGN.md, "Scale"). The relay is one watcher per replica; agents get only
// what concerns their node.
//
// A node's view: every PolicyEndpoint of a policy (namespace and spec.policyRef.name)
// one of whose PolicyEndpoints names a pod on the node (a podSelectorEndpoints[]
// hostIP that is one of the Node's InternalIP or ExternalIP addresses) — the local
// ones and their siblings, which the agent merges — and every ClusterPolicyEndpoint.
// When an object enters a node's view its watchers get ADDED, when it leaves,
// DELETED, as a field-selector watch delivers them.
//
// What it promises. resourceVersions are the apiserver's (lists carry the
// resourceVersion the relay's copy is exact at; events the objects' own), so an agent
// moving between the relay and the apiserver lists again and nothing else. Watches
// resume from any resourceVersion in the relay's window of recent events (Config.
// WindowEvents); an older one, an upstream relist (the apiserver's 410, its restart),
// a watcher that falls behind, or a change of the node's addresses is 410 Gone / an
// ERROR event with reason Expired, and the client lists again. Bookmarks are sent
// to watches that ask. Lists page with limit and continue; a continue token expires
// when the node's view changes (a change to another node's objects leaves it good),
// and the client lists again.
//
// Who may read. A request carries a service-account bearer token; the relay reviews
// it (TokenReview) and serves the node the token is bound to (the user extra
// authentication.kubernetes.io/node-name, set for a pod's projected token). A token
// with no node is refused (403), as is a user the apiserver would not let list or
// watch the resource (SubjectAccessReview). Reviews are cached for Config.ReviewTTL.
//
// The agent side is ClientConfig: a rest.Config whose requests go to the relay and,
// while no relay answers, to the apiserver, with a 410 at each switch so the informer
// lists from the source it then watches.
//
// It imports client-go, api and kubewatch; nothing imports it but cmd/npagent.
package relay
