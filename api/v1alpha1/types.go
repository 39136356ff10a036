package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Annotations the policy controller writes on PolicyEndpoint and ClusterPolicyEndpoint.
const (
	// AnnotationLastChangeTriggerTime is the time (RFC3339Nano, UTC) of the change that
	// produced this version of the object: its creation or its latest spec change.
	AnnotationLastChangeTriggerTime = "networking.k8s.aws/last-change-trigger-time"
	// AnnotationTraceParent optionally carries a W3C traceparent, so each node's
	// programming span joins the controller's trace of the same change.
	AnnotationTraceParent = "networking.k8s.aws/traceparent"
)

// NetworkAddress is an IPv4 or IPv6 address or CIDR, as text. The controller writes a
// pod peer as a bare address (no /32 or /128).
type NetworkAddress string

// DomainName is a fully qualified domain name, optionally with a leading "*." wildcard.
// The pattern is the controller's, character for character (its "A-z" included), so
// both schemas accept the same names.
// +kubebuilder:validation:Pattern=`^(\*\.)?([a-zA-z0-9]([-a-zA-Z0-9_]*[a-zA-Z0-9])?\.)+[a-zA-z0-9]([-a-zA-Z0-9_]*[a-zA-Z0-9])?\.?$`
type DomainName string

// PolicyReference names the NetworkPolicy a PolicyEndpoint was derived from.
type PolicyReference struct {
	// Name of the policy.
	Name string `json:"name"`
	// Namespace of the policy.
	Namespace string `json:"namespace"`
}

// ClusterPolicyReference names the cluster network policy a ClusterPolicyEndpoint was
// derived from. Cluster policies have no namespace.
type ClusterPolicyReference struct {
	// Name of the cluster policy.
	Name string `json:"name"`
}

// Port is a transport protocol and an optional port or port range.
type Port struct {
	// Protocol is TCP, UDP or SCTP; the apiserver defaults it to TCP. The schema has
	// no enum (the controller's has none): other values reach the agent, which rejects
	// the object naming this field.
	// +optional
	// +kubebuilder:default=TCP
	Protocol *corev1.Protocol `json:"protocol,omitempty"`
	// Port is the first (or only) port; all ports of the protocol when omitted.
	// +optional
	Port *int32 `json:"port,omitempty"`
	// EndPort, when set, makes the range Port..EndPort inclusive.
	// +optional
	EndPort *int32 `json:"endPort,omitempty"`
}

// EndpointInfo is one peer rule of a PolicyEndpoint: an address block, or a domain name
// (egress only) that the controller leaves for the agent to resolve.
type EndpointInfo struct {
	// CIDR is the peer address block, or a bare address for a pod peer. Empty in a rule
	// that names a DomainName instead.
	// +optional
	CIDR NetworkAddress `json:"cidr,omitempty"`
	// DomainName is the peer's FQDN, for egress rules without a CIDR. npagent cannot
	// enforce it from the object alone (see internal/reconcile).
	// +optional
	DomainName DomainName `json:"domainName,omitempty"`
	// Except lists blocks inside CIDR that the rule does not cover.
	// +optional
	Except []NetworkAddress `json:"except,omitempty"`
	// Ports the rule allows; all traffic when empty.
	// +optional
	Ports []Port `json:"ports,omitempty"`
}

// ClusterEndpointInfo is one peer rule of a cluster-scoped policy, with its action.
// Cluster rules have no except: the controller resolves peers to addresses.
type ClusterEndpointInfo struct {
	// Action taken for matching traffic.
	// +kubebuilder:validation:Enum=Accept;Deny;Pass
	Action ClusterRuleAction `json:"action"`
	// CIDR is the peer address block, or a bare address for a pod peer. Empty in a rule
	// that names a DomainName instead.
	// +optional
	CIDR NetworkAddress `json:"cidr,omitempty"`
	// DomainName is the peer's FQDN, for egress rules without a CIDR. npagent cannot
	// enforce it from the object alone (see internal/reconcile).
	// +optional
	DomainName DomainName `json:"domainName,omitempty"`
	// Ports the rule applies to; all traffic when empty.
	// +optional
	Ports []Port `json:"ports,omitempty"`
}

// ClusterRuleAction is what a cluster-scoped rule does with matching traffic.
type ClusterRuleAction string

// Cluster rule actions.
const (
	ClusterRuleActionAccept ClusterRuleAction = "Accept"
	ClusterRuleActionDeny   ClusterRuleAction = "Deny"
	// ClusterRuleActionPass hands the decision to namespaced policy (admin tier) or to
	// the default (baseline tier).
	ClusterRuleActionPass ClusterRuleAction = "Pass"
)

// ClusterPolicySubject is the cluster policy's subject, as the policy wrote it: exactly
// one of Namespaces or Pods. The controller resolves it into podSelectorEndpoints;
// npagent reads only those, and keeps the subject so that nothing the controller
// writes is pruned.
// +kubebuilder:validation:MinProperties=1
// +kubebuilder:validation:MaxProperties=1
type ClusterPolicySubject struct {
	// Namespaces selects every pod of the namespaces it matches.
	// +optional
	Namespaces *metav1.LabelSelector `json:"namespaces,omitempty"`
	// Pods selects pods by namespace and pod labels.
	// +optional
	Pods *NamespacedPod `json:"pods,omitempty"`
}

// NamespacedPod selects pods by a namespace selector AND a pod selector.
type NamespacedPod struct {
	// NamespaceSelector selects namespaces; empty selects all.
	NamespaceSelector metav1.LabelSelector `json:"namespaceSelector"`
	// PodSelector selects pods within those namespaces; empty selects all.
	PodSelector metav1.LabelSelector `json:"podSelector"`
}

// PodEndpoint is a pod selected by the policy.
type PodEndpoint struct {
	// HostIP is the IP of the node the pod runs on: an agent programs the pods whose
	// HostIP is its own node IP.
	HostIP NetworkAddress `json:"hostIP"`
	// PodIP is the pod's IP.
	PodIP NetworkAddress `json:"podIP"`
	// Name of the pod.
	Name string `json:"name"`
	// Namespace of the pod.
	Namespace string `json:"namespace"`
}

// PolicyEndpointSpec is one NetworkPolicy resolved to pods and CIDRs. The controller
// splits a large policy into several objects (chunks) with the same policyRef: a chunk
// may carry rules and no podSelectorEndpoints, or pods and no rules.
type PolicyEndpointSpec struct {
	// PolicyRef names the NetworkPolicy this object was derived from.
	PolicyRef PolicyReference `json:"policyRef"`
	// PodSelector is the policy's pod selector.
	// +optional
	PodSelector *metav1.LabelSelector `json:"podSelector,omitempty"`
	// PodIsolation lists the directions in which the selected pods are isolated
	// (NetworkPolicy spec.policyTypes).
	// +optional
	PodIsolation []networkingv1.PolicyType `json:"podIsolation,omitempty"`
	// PodSelectorEndpoints are the pods the policy selects.
	// +optional
	PodSelectorEndpoints []PodEndpoint `json:"podSelectorEndpoints,omitempty"`
	// Ingress rules: peers allowed to reach the selected pods.
	// +optional
	Ingress []EndpointInfo `json:"ingress,omitempty"`
	// Egress rules: peers the selected pods may reach.
	// +optional
	Egress []EndpointInfo `json:"egress,omitempty"`
}

// PolicyEndpointStatus is empty: agents report through telemetry, not status writes.
type PolicyEndpointStatus struct{}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status

// PolicyEndpoint is a namespaced NetworkPolicy resolved for the dataplane.
type PolicyEndpoint struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   PolicyEndpointSpec   `json:"spec,omitempty"`
	Status PolicyEndpointStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// PolicyEndpointList is a list of PolicyEndpoint.
type PolicyEndpointList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []PolicyEndpoint `json:"items"`
}

// ClusterPolicyTier orders cluster-scoped policy relative to namespaced policy.
type ClusterPolicyTier string

// Cluster policy tiers.
const (
	// TierAdmin rules decide before namespaced policy.
	TierAdmin ClusterPolicyTier = "Admin"
	// TierBaseline rules apply only where no namespaced policy isolates the pod.
	TierBaseline ClusterPolicyTier = "Baseline"
)

// ClusterPolicyEndpointSpec is one cluster-scoped policy resolved to pods and CIDRs.
type ClusterPolicyEndpointSpec struct {
	// PolicyRef names the cluster policy this object was derived from.
	PolicyRef ClusterPolicyReference `json:"policyRef"`
	// Tier is Admin or Baseline.
	// +kubebuilder:validation:Enum=Admin;Baseline
	Tier ClusterPolicyTier `json:"tier"`
	// Priority orders policies within a tier: lower first.
	Priority int32 `json:"priority"`
	// Subject is the policy's subject as written in the policy. npagent does not
	// evaluate it: the controller resolves it into PodSelectorEndpoints.
	Subject ClusterPolicySubject `json:"subject"`
	// PodSelectorEndpoints are the pods the policy selects.
	// +optional
	PodSelectorEndpoints []PodEndpoint `json:"podSelectorEndpoints,omitempty"`
	// Ingress rules, in order.
	// +optional
	Ingress []ClusterEndpointInfo `json:"ingress,omitempty"`
	// Egress rules, in order.
	// +optional
	Egress []ClusterEndpointInfo `json:"egress,omitempty"`
}

// ClusterPolicyEndpointStatus is empty: agents report through telemetry.
type ClusterPolicyEndpointStatus struct{}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=cpe

// ClusterPolicyEndpoint is a cluster-scoped policy resolved for the dataplane.
type ClusterPolicyEndpoint struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ClusterPolicyEndpointSpec   `json:"spec,omitempty"`
	Status ClusterPolicyEndpointStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// ClusterPolicyEndpointList is a list of ClusterPolicyEndpoint.
type ClusterPolicyEndpointList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ClusterPolicyEndpoint `json:"items"`
}
