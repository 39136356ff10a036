// Package translate turns one PolicyEndpoint or ClusterPolicyEndpoint version into
// validated dataplane rules, and merges the versions selecting one pod into its
// bpfmaps.PodPolicy. It is pure: a function of the object, the node's IP and Options,
// with no Kubernetes client, no clock and no I/O, so every rule of it is tested and
// fuzzed (FuzzCompilePolicyEndpoint) without a control plane. internal/reconcile
// calls it from its workers and its pod table.
//
// What it promises:
//
//   - Options.PolicyEndpoint, Options.ClusterPolicyEndpoint (and Options.Compile for
//     either) validate the whole object and convert it, or reject it with a
//     *FieldError naming the exact element (Path) and the field without indexes
//     (Field, bounded, for counting): a CIDR, except, port, protocol, action, tier,
//     podIsolation, hostIP or podIP that does not parse or is out of range; a
//     domainName rule, unless Options.DropDomainAllowRules leaves out those that only
//     allow; a PolicyEndpoint pod of another namespace; more map entries than
//     Options.MaxEntriesPerObject or half a trie. Every endpoint is validated, local
//     or not: the object is the same on every node, so every agent rejects it alike.
//   - Local pods are the podSelectorEndpoints whose hostIP is the node's IP.
//     Defaults follow NetworkPolicy: a port without protocol is TCP, a rule without
//     ports allows every port, an empty podIsolation means Ingress (plus Egress with
//     egress rules).
//   - MergePodPolicy is deterministic: namespaced rules are unioned, a direction is
//     isolated if any PolicyEndpoint isolates it, and ClusterPolicyEndpoint rules go
//     to the Admin or Baseline tier ordered by priority, object key, then spec order,
//     so the same versions always give the same policy (and the dataplane's content
//     hash skips an unchanged re-commit).
//   - ReadRejected reads, best-effort, what a version that did not compile names: its
//     local pods and, for a PolicyEndpoint, the pods of its own namespace and the
//     directions it isolates (its caller fails closed with them).
//   - Options.NodeLocal keeps a version with no local pod without its rules,
//     recompiled from its source object on the first merge that needs them (see
//     nodelocal.go for the one thing it relies on: the source object never changes,
//     and is an object the caller keeps anyway).
//
// Compiled versions are immutable once shared; Compiled.BuildSets builds a version's
// allow rules into bpfmaps.RuleSets from its predecessor's before it is shared.
//
// It imports api/v1alpha1, the types of internal/bpfmaps and internal/report; never
// client-go.
package translate
