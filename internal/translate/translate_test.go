package translate

import (
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/report"
)

func ptr[T any](v T) *T { return &v }

var testNode = netip.MustParseAddr("192.0.2.10")

func pod(hostIP, podIP string) v1alpha1.PodEndpoint {
	return v1alpha1.PodEndpoint{HostIP: v1alpha1.NetworkAddress(hostIP), PodIP: v1alpha1.NetworkAddress(podIP), Name: "p-" + podIP, Namespace: "shop"}
}

func TestCompilePolicyEndpointConverts(t *testing.T) {
	pe := &v1alpha1.PolicyEndpoint{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop", UID: "u1", ResourceVersion: "7"},
		Spec: v1alpha1.PolicyEndpointSpec{
			PodIsolation: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			PodSelectorEndpoints: []v1alpha1.PodEndpoint{
				pod("192.0.2.10", "10.1.0.7"),
				pod("192.0.2.11", "10.1.0.9"), // another node's pod
				pod("192.0.2.10", "10.1.0.5"),
				pod("192.0.2.10", "10.1.0.7"), // listed twice
			},
			Ingress: []v1alpha1.EndpointInfo{{
				CIDR:   "10.0.0.0/8",
				Except: []v1alpha1.NetworkAddress{"10.9.0.0/16"},
				Ports: []v1alpha1.Port{
					{Port: ptr[int32](80)}, // protocol defaults to TCP
					{Protocol: ptr(corev1.ProtocolUDP), Port: ptr[int32](5000), EndPort: ptr[int32](5010)},
					{Protocol: ptr(corev1.ProtocolSCTP)}, // every SCTP port
				},
			}, {
				CIDR: "192.168.1.1", // a bare address is a /32
			}},
			// Not isolated in egress: NetworkPolicy ignores these rules.
			Egress: []v1alpha1.EndpointInfo{{CIDR: "0.0.0.0/0"}},
		},
	}
	c, err := Options{}.PolicyEndpoint(pe, testNode)
	if err != nil {
		t.Fatal(err)
	}
	wantPods := []netip.Addr{netip.MustParseAddr("10.1.0.5"), netip.MustParseAddr("10.1.0.7")}
	if !reflect.DeepEqual(c.Pods, wantPods) {
		t.Errorf("local pods = %v, want %v", c.Pods, wantPods)
	}
	if c.Isolated != [2]bool{true, false} {
		t.Errorf("isolated = %v, want ingress only", c.Isolated)
	}
	wantIngress := []bpfmaps.Rule{{
		CIDR:   netip.MustParsePrefix("10.0.0.0/8"),
		Except: []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")},
		Ports: []bpfmaps.PortRule{
			{Protocol: bpfmaps.ProtocolTCP, Port: 80},
			{Protocol: bpfmaps.ProtocolUDP, Port: 5000, EndPort: 5010},
			{Protocol: bpfmaps.ProtocolSCTP},
		},
	}, {CIDR: netip.MustParsePrefix("192.168.1.1/32")}}
	if !reflect.DeepEqual(c.Allow[bpfmaps.Ingress], wantIngress) {
		t.Errorf("ingress rules:\n got %+v\nwant %+v", c.Allow[bpfmaps.Ingress], wantIngress)
	}
	if len(c.Allow[bpfmaps.Egress]) != 0 {
		t.Errorf("egress rules of a direction the policy does not isolate were kept: %+v", c.Allow[bpfmaps.Egress])
	}
	if c.Key != (Key{Kind: report.KindPolicyEndpoint, Namespace: "shop", Name: "web"}) || c.UID != "u1" || c.ResourceVersion != "7" {
		t.Errorf("identity = %+v %q %q", c.Key, c.UID, c.ResourceVersion)
	}
}

func TestCompilePolicyEndpointDefaultIsolation(t *testing.T) {
	for _, tc := range []struct {
		name   string
		egress []v1alpha1.EndpointInfo
		want   [2]bool
	}{
		{"ingress only", nil, [2]bool{true, false}},
		{"egress rules", []v1alpha1.EndpointInfo{{CIDR: "10.0.0.0/8"}}, [2]bool{true, true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Options{}.PolicyEndpoint(&v1alpha1.PolicyEndpoint{Spec: v1alpha1.PolicyEndpointSpec{Egress: tc.egress}}, testNode)
			if err != nil {
				t.Fatal(err)
			}
			if c.Isolated != tc.want {
				t.Errorf("isolated = %v, want %v", c.Isolated, tc.want)
			}
		})
	}
}

// TestCompileControllerShapes compiles objects as the AWS Network Policy Controller
// writes them: pod peers as bare IPs, "allow all" as 0.0.0.0/0 plus ::/0, a policy
// chunked into several objects (one with rules and no pods), a cluster policy with its
// subject.
func TestCompileControllerShapes(t *testing.T) {
	isolation := []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
	withPods := &v1alpha1.PolicyEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "allow-web-abcde"}, Spec: v1alpha1.PolicyEndpointSpec{
		PolicyRef:            v1alpha1.PolicyReference{Name: "allow-web", Namespace: "shop"},
		PodIsolation:         isolation,
		PodSelectorEndpoints: []v1alpha1.PodEndpoint{pod("192.0.2.10", "10.1.0.5")},
		Ingress:              []v1alpha1.EndpointInfo{{CIDR: "10.1.0.9"}, {CIDR: "fd00::9"}},
		Egress:               []v1alpha1.EndpointInfo{{CIDR: "0.0.0.0/0"}, {CIDR: "::/0"}},
	}}
	c, err := Options{}.PolicyEndpoint(withPods, testNode)
	if err != nil {
		t.Fatal(err)
	}
	wantIngress := []bpfmaps.Rule{{CIDR: netip.MustParsePrefix("10.1.0.9/32")}, {CIDR: netip.MustParsePrefix("fd00::9/128")}}
	if !reflect.DeepEqual(c.Allow[bpfmaps.Ingress], wantIngress) {
		t.Errorf("bare pod IPs: ingress rules %+v, want %+v", c.Allow[bpfmaps.Ingress], wantIngress)
	}
	wantEgress := []bpfmaps.Rule{{CIDR: netip.MustParsePrefix("0.0.0.0/0")}, {CIDR: netip.MustParsePrefix("::/0")}}
	if !reflect.DeepEqual(c.Allow[bpfmaps.Egress], wantEgress) {
		t.Errorf("allow all: egress rules %+v, want %+v", c.Allow[bpfmaps.Egress], wantEgress)
	}
	p := MergePodPolicy([]*Compiled{c})
	for _, peer := range []string{"8.8.8.8", "2001:db8::1"} {
		if !p.Egress.Verdict(netip.MustParseAddr(peer), bpfmaps.ProtocolTCP, 443) {
			t.Errorf("allow all: egress to %s denied", peer)
		}
	}
	if !p.Ingress.Verdict(netip.MustParseAddr("10.1.0.9"), bpfmaps.ProtocolTCP, 80) || p.Ingress.Verdict(netip.MustParseAddr("10.1.0.10"), bpfmaps.ProtocolTCP, 80) {
		t.Errorf("bare pod IP: ingress allows other than exactly 10.1.0.9")
	}

	// The policy's second chunk: rules, no pods. It compiles, selects no local pod.
	rulesOnly := &v1alpha1.PolicyEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "allow-web-fghij"}, Spec: v1alpha1.PolicyEndpointSpec{
		PolicyRef:    v1alpha1.PolicyReference{Name: "allow-web", Namespace: "shop"},
		PodIsolation: isolation,
		Ingress:      []v1alpha1.EndpointInfo{{CIDR: "10.1.0.10"}},
	}}
	c, err = Options{}.PolicyEndpoint(rulesOnly, testNode)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Pods) != 0 || !reflect.DeepEqual(c.Allow[bpfmaps.Ingress], []bpfmaps.Rule{{CIDR: netip.MustParsePrefix("10.1.0.10/32")}}) {
		t.Errorf("rules-only chunk: pods %v, ingress %+v; want no pods and its rule", c.Pods, c.Allow[bpfmaps.Ingress])
	}

	// A cluster policy's subject is accepted and not read: podSelectorEndpoints decide.
	for _, subject := range []v1alpha1.ClusterPolicySubject{
		{Namespaces: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "shop"}}},
		{Pods: &v1alpha1.NamespacedPod{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}}},
	} {
		cpe := &v1alpha1.ClusterPolicyEndpoint{ObjectMeta: metav1.ObjectMeta{Name: "deny-metadata"}, Spec: v1alpha1.ClusterPolicyEndpointSpec{
			PolicyRef: v1alpha1.ClusterPolicyReference{Name: "deny-metadata"}, Tier: v1alpha1.TierAdmin, Subject: subject,
			PodSelectorEndpoints: []v1alpha1.PodEndpoint{pod("192.0.2.10", "10.1.0.5")},
			Egress:               []v1alpha1.ClusterEndpointInfo{{Action: v1alpha1.ClusterRuleActionDeny, CIDR: "169.254.169.254"}},
		}}
		c, err := Options{}.ClusterPolicyEndpoint(cpe, testNode)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(c.Pods, []netip.Addr{netip.MustParseAddr("10.1.0.5")}) || len(c.TierRules[bpfmaps.Egress]) != 1 ||
			c.TierRules[bpfmaps.Egress][0].Rule.CIDR != netip.MustParsePrefix("169.254.169.254/32") {
			t.Errorf("subject %+v: pods %v, egress %+v", subject, c.Pods, c.TierRules[bpfmaps.Egress])
		}
	}
}

// TestCompileDomainNameRules: an FQDN rule (domainName, no cidr) cannot be enforced from
// the object: by default it rejects the object naming the field, and with
// DropDomainAllowRules only the rules whose absence narrows the policy are left out.
func TestCompileDomainNameRules(t *testing.T) {
	pe := func(rules ...v1alpha1.EndpointInfo) *v1alpha1.PolicyEndpoint {
		return &v1alpha1.PolicyEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "fqdn"}, Spec: v1alpha1.PolicyEndpointSpec{
			PodIsolation:         []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			PodSelectorEndpoints: []v1alpha1.PodEndpoint{pod("192.0.2.10", "10.1.0.5")},
			Egress:               rules,
		}}
	}
	cpe := func(action v1alpha1.ClusterRuleAction) *v1alpha1.ClusterPolicyEndpoint {
		return &v1alpha1.ClusterPolicyEndpoint{ObjectMeta: metav1.ObjectMeta{Name: "fqdn"}, Spec: v1alpha1.ClusterPolicyEndpointSpec{
			Tier: v1alpha1.TierAdmin, Priority: 3,
			PodSelectorEndpoints: []v1alpha1.PodEndpoint{pod("192.0.2.10", "10.1.0.5")},
			Egress: []v1alpha1.ClusterEndpointInfo{
				{Action: v1alpha1.ClusterRuleActionDeny, CIDR: "10.0.0.0/8"},
				{Action: action, DomainName: "*.example.com", Ports: []v1alpha1.Port{{Port: ptr[int32](443)}}},
			},
		}}
	}
	dns := v1alpha1.EndpointInfo{CIDR: "10.96.0.10", Ports: []v1alpha1.Port{{Protocol: ptr(corev1.ProtocolUDP), Port: ptr[int32](53)}}}
	fqdn := v1alpha1.EndpointInfo{DomainName: "api.example.com", Ports: []v1alpha1.Port{{Port: ptr[int32](443)}}}
	strict, drop := Options{}, Options{DropDomainAllowRules: true}
	compile := func(o Options, obj any) (*Compiled, error) {
		switch obj := obj.(type) {
		case *v1alpha1.PolicyEndpoint:
			return o.PolicyEndpoint(obj, testNode)
		case *v1alpha1.ClusterPolicyEndpoint:
			return o.ClusterPolicyEndpoint(obj, testNode)
		}
		panic(obj)
	}

	for _, tc := range []struct {
		name      string
		opts      Options
		obj       any
		path, fld string
	}{
		{"PolicyEndpoint", strict, pe(dns, fqdn), "spec.egress[1].domainName", "spec.egress.domainName"},
		{"PolicyEndpoint ingress", strict, &v1alpha1.PolicyEndpoint{Spec: v1alpha1.PolicyEndpointSpec{Ingress: []v1alpha1.EndpointInfo{fqdn}}},
			"spec.ingress[0].domainName", "spec.ingress.domainName"},
		{"ClusterPolicyEndpoint Accept", strict, cpe(v1alpha1.ClusterRuleActionAccept), "spec.egress[1].domainName", "spec.egress.domainName"},
		{"with cidr", drop, pe(v1alpha1.EndpointInfo{CIDR: "10.0.0.0/8", DomainName: "api.example.com"}), "spec.egress[0].domainName", "spec.egress.domainName"},
		{"drop: Deny widens", drop, cpe(v1alpha1.ClusterRuleActionDeny), "spec.egress[1].domainName", "spec.egress.domainName"},
		{"drop: Pass widens", drop, cpe(v1alpha1.ClusterRuleActionPass), "spec.egress[1].domainName", "spec.egress.domainName"},
	} {
		t.Run("rejects/"+tc.name, func(t *testing.T) {
			_, err := compile(tc.opts, tc.obj)
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("err = %v, want a *FieldError", err)
			}
			if fe.Path != tc.path || fe.Field != tc.fld || !strings.HasPrefix(err.Error(), tc.path+" ") {
				t.Errorf("path, field = %q, %q (%v); want %q, %q", fe.Path, fe.Field, err, tc.path, tc.fld)
			}
		})
	}

	// DropDomainAllowRules: the allow-only rule is left out, counted; the rest stays.
	c, err := drop.PolicyEndpoint(pe(dns, fqdn), testNode)
	if err != nil {
		t.Fatal(err)
	}
	want := []bpfmaps.Rule{{CIDR: netip.MustParsePrefix("10.96.0.10/32"), Ports: []bpfmaps.PortRule{{Protocol: bpfmaps.ProtocolUDP, Port: 53}}}}
	if !reflect.DeepEqual(c.Allow[bpfmaps.Egress], want) || c.DomainRulesDropped != 1 || !c.Isolated[bpfmaps.Egress] {
		t.Errorf("drop: egress %+v dropped %d isolated %v; want only the DNS rule, one dropped, still isolated",
			c.Allow[bpfmaps.Egress], c.DomainRulesDropped, c.Isolated[bpfmaps.Egress])
	}
	// An object whose only egress rule is an FQDN stays isolated in egress: narrower.
	c, err = drop.PolicyEndpoint(&v1alpha1.PolicyEndpoint{Spec: v1alpha1.PolicyEndpointSpec{Egress: []v1alpha1.EndpointInfo{fqdn}}}, testNode)
	if err != nil || !c.Isolated[bpfmaps.Egress] || len(c.Allow[bpfmaps.Egress]) != 0 {
		t.Errorf("drop, FQDN-only egress: err %v, isolated %v, rules %+v; want isolated with no rules", err, c.Isolated, c.Allow[bpfmaps.Egress])
	}
	c, err = drop.ClusterPolicyEndpoint(cpe(v1alpha1.ClusterRuleActionAccept), testNode)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.TierRules[bpfmaps.Egress]) != 1 || c.TierRules[bpfmaps.Egress][0].Action != bpfmaps.ActionDeny || c.DomainRulesDropped != 1 {
		t.Errorf("drop, Accept: egress %+v dropped %d; want the Deny rule only", c.TierRules[bpfmaps.Egress], c.DomainRulesDropped)
	}
}

func TestCompileRejectsBadInputNamingTheField(t *testing.T) {
	good := func() *v1alpha1.PolicyEndpoint {
		return &v1alpha1.PolicyEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web"}, Spec: v1alpha1.PolicyEndpointSpec{
			PodSelectorEndpoints: []v1alpha1.PodEndpoint{pod("192.0.2.10", "10.1.0.5")},
			Ingress:              []v1alpha1.EndpointInfo{{CIDR: "10.0.0.0/8", Ports: []v1alpha1.Port{{Port: ptr[int32](80)}}}},
		}}
	}
	if _, err := (Options{}).PolicyEndpoint(good(), testNode); err != nil {
		t.Fatalf("the base object must be valid: %v", err)
	}
	for _, tc := range []struct {
		name      string
		mutate    func(*v1alpha1.PolicyEndpoint)
		path, fld string
	}{
		{"cidr", func(p *v1alpha1.PolicyEndpoint) { p.Spec.Ingress[0].CIDR = "10.0.0.0/33" }, "spec.ingress[0].cidr", "spec.ingress.cidr"},
		{"cidr garbage", func(p *v1alpha1.PolicyEndpoint) { p.Spec.Ingress[0].CIDR = "web" }, "spec.ingress[0].cidr", "spec.ingress.cidr"},
		{"except unparsable", func(p *v1alpha1.PolicyEndpoint) {
			p.Spec.Ingress[0].Except = []v1alpha1.NetworkAddress{"10.1.0.0/16", "x"}
		}, "spec.ingress[0].except[1]", "spec.ingress.except"},
		{"except outside", func(p *v1alpha1.PolicyEndpoint) { p.Spec.Ingress[0].Except = []v1alpha1.NetworkAddress{"11.0.0.0/16"} }, "spec.ingress[0].except[0]", "spec.ingress.except"},
		{"except wider", func(p *v1alpha1.PolicyEndpoint) { p.Spec.Ingress[0].Except = []v1alpha1.NetworkAddress{"0.0.0.0/0"} }, "spec.ingress[0].except[0]", "spec.ingress.except"},
		{"except family", func(p *v1alpha1.PolicyEndpoint) { p.Spec.Ingress[0].Except = []v1alpha1.NetworkAddress{"fd00::/64"} }, "spec.ingress[0].except[0]", "spec.ingress.except"},
		{"port zero", func(p *v1alpha1.PolicyEndpoint) { p.Spec.Ingress[0].Ports[0].Port = ptr[int32](0) }, "spec.ingress[0].ports[0].port", "spec.ingress.ports.port"},
		{"port high", func(p *v1alpha1.PolicyEndpoint) { p.Spec.Ingress[0].Ports[0].Port = ptr[int32](65536) }, "spec.ingress[0].ports[0].port", "spec.ingress.ports.port"},
		{"endPort below", func(p *v1alpha1.PolicyEndpoint) { p.Spec.Ingress[0].Ports[0].EndPort = ptr[int32](79) }, "spec.ingress[0].ports[0].endPort", "spec.ingress.ports.endPort"},
		{"endPort alone", func(p *v1alpha1.PolicyEndpoint) { p.Spec.Ingress[0].Ports[0] = v1alpha1.Port{EndPort: ptr[int32](90)} }, "spec.ingress[0].ports[0].endPort", "spec.ingress.ports.endPort"},
		{"protocol", func(p *v1alpha1.PolicyEndpoint) { p.Spec.Ingress[0].Ports[0].Protocol = ptr(corev1.Protocol("ICMP")) }, "spec.ingress[0].ports[0].protocol", "spec.ingress.ports.protocol"},
		{"egress", func(p *v1alpha1.PolicyEndpoint) {
			p.Spec.Egress = []v1alpha1.EndpointInfo{{CIDR: "10.0.0.0/8"}, {CIDR: ""}}
		}, "spec.egress[1].cidr", "spec.egress.cidr"},
		{"hostIP", func(p *v1alpha1.PolicyEndpoint) { p.Spec.PodSelectorEndpoints[0].HostIP = "node-1" }, "spec.podSelectorEndpoints[0].hostIP", "spec.podSelectorEndpoints.hostIP"},
		{"podIP", func(p *v1alpha1.PolicyEndpoint) { p.Spec.PodSelectorEndpoints[0].PodIP = "10.1.0.5/32" }, "spec.podSelectorEndpoints[0].podIP", "spec.podSelectorEndpoints.podIP"},
		{"namespace", func(p *v1alpha1.PolicyEndpoint) {
			p.Spec.PodSelectorEndpoints = append(p.Spec.PodSelectorEndpoints, pod("192.0.2.11", "10.1.0.6"))
			p.Spec.PodSelectorEndpoints[1].Namespace = "kube-system" // another node's pod, still rejected
		}, "spec.podSelectorEndpoints[1].namespace", "spec.podSelectorEndpoints.namespace"},
		{"namespace empty", func(p *v1alpha1.PolicyEndpoint) { p.Spec.PodSelectorEndpoints[0].Namespace = "" }, "spec.podSelectorEndpoints[0].namespace", "spec.podSelectorEndpoints.namespace"},
		{"podIsolation", func(p *v1alpha1.PolicyEndpoint) { p.Spec.PodIsolation = []networkingv1.PolicyType{"Sideways"} }, "spec.podIsolation[0]", "spec.podIsolation"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pe := good()
			tc.mutate(pe)
			_, err := Options{}.PolicyEndpoint(pe, testNode)
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("err = %v, want a *FieldError", err)
			}
			if fe.Path != tc.path || fe.Field != tc.fld {
				t.Errorf("path, field = %q, %q; want %q, %q", fe.Path, fe.Field, tc.path, tc.fld)
			}
			if !strings.HasPrefix(err.Error(), tc.path+" ") {
				t.Errorf("message %q does not start with the path", err)
			}
		})
	}
}

func TestCompileClusterPolicyEndpoint(t *testing.T) {
	cpe := &v1alpha1.ClusterPolicyEndpoint{
		ObjectMeta: metav1.ObjectMeta{Name: "deny-metadata"},
		Spec: v1alpha1.ClusterPolicyEndpointSpec{
			Tier:                 v1alpha1.TierAdmin,
			Priority:             10,
			PodSelectorEndpoints: []v1alpha1.PodEndpoint{pod("192.0.2.10", "10.1.0.5")},
			Egress: []v1alpha1.ClusterEndpointInfo{
				{Action: v1alpha1.ClusterRuleActionDeny, CIDR: "169.254.169.254/32"},
				{Action: v1alpha1.ClusterRuleActionPass, CIDR: "0.0.0.0/0", Ports: []v1alpha1.Port{{Protocol: ptr(corev1.ProtocolUDP), Port: ptr[int32](53)}}},
			},
		},
	}
	c, err := Options{}.ClusterPolicyEndpoint(cpe, testNode)
	if err != nil {
		t.Fatal(err)
	}
	want := []bpfmaps.TierRule{
		{Priority: 10, Action: bpfmaps.ActionDeny, Rule: bpfmaps.Rule{CIDR: netip.MustParsePrefix("169.254.169.254/32")},
			Origin: bpfmaps.Origin{Kind: "ClusterPolicyEndpoint", Name: "deny-metadata", Index: 0}},
		{Priority: 10, Action: bpfmaps.ActionPass, Rule: bpfmaps.Rule{CIDR: netip.MustParsePrefix("0.0.0.0/0"), Ports: []bpfmaps.PortRule{{Protocol: bpfmaps.ProtocolUDP, Port: 53}}},
			Origin: bpfmaps.Origin{Kind: "ClusterPolicyEndpoint", Name: "deny-metadata", Index: 1}},
	}
	if !reflect.DeepEqual(c.TierRules[bpfmaps.Egress], want) {
		t.Errorf("egress tier rules:\n got %+v\nwant %+v", c.TierRules[bpfmaps.Egress], want)
	}
	if c.Tier != v1alpha1.TierAdmin || c.Key.Kind != report.KindClusterPolicyEndpoint {
		t.Errorf("tier %q kind %v", c.Tier, c.Key.Kind)
	}

	bad := cpe.DeepCopy()
	bad.Spec.Egress[1].Action = "Allow"
	var fe *FieldError
	if _, err := (Options{}).ClusterPolicyEndpoint(bad, testNode); !errors.As(err, &fe) || fe.Path != "spec.egress[1].action" {
		t.Errorf("bad action: err = %v, want spec.egress[1].action", err)
	}
	bad = cpe.DeepCopy()
	bad.Spec.Tier = "Developer"
	if _, err := (Options{}).ClusterPolicyEndpoint(bad, testNode); !errors.As(err, &fe) || fe.Path != "spec.tier" {
		t.Errorf("bad tier: err = %v, want spec.tier", err)
	}
}

func TestLocalPodsIPv6AndMappedHost(t *testing.T) {
	node6 := netip.MustParseAddr("fd00::10")
	pods, names, err := localPods([]v1alpha1.PodEndpoint{pod("fd00::10", "fd01::5"), pod("fd00::11", "fd01::6")}, node6, root("spec"))
	if err != nil || len(pods) != 1 || pods[0] != netip.MustParseAddr("fd01::5") {
		t.Errorf("ipv6: pods %v err %v", pods, err)
	}
	// The local pods' names, for the verdict counters; only the local ones.
	if want := map[netip.Addr]PodName{netip.MustParseAddr("fd01::5"): {Namespace: "shop", Name: "p-fd01::5"}}; !reflect.DeepEqual(names, want) {
		t.Errorf("ipv6: names %v, want %v", names, want)
	}
	// A hostIP written as an IPv4-mapped IPv6 address is the same node.
	pods, _, err = localPods([]v1alpha1.PodEndpoint{pod("::ffff:192.0.2.10", "10.1.0.5")}, testNode, root("spec"))
	if err != nil || len(pods) != 1 {
		t.Errorf("mapped: pods %v err %v", pods, err)
	}
}

// TestMergePodPolicy checks the merged policy through bpfmaps' reference Verdict.
func TestMergePodPolicy(t *testing.T) {
	compile := func(t *testing.T, obj any) *Compiled {
		t.Helper()
		var c *Compiled
		var err error
		switch o := obj.(type) {
		case *v1alpha1.PolicyEndpoint:
			c, err = Options{}.PolicyEndpoint(o, testNode)
		case *v1alpha1.ClusterPolicyEndpoint:
			c, err = Options{}.ClusterPolicyEndpoint(o, testNode)
		}
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	eps := []v1alpha1.PodEndpoint{pod("192.0.2.10", "10.1.0.5")}
	web := compile(t, &v1alpha1.PolicyEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web"}, Spec: v1alpha1.PolicyEndpointSpec{
		PodIsolation: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}, PodSelectorEndpoints: eps,
		Ingress: []v1alpha1.EndpointInfo{{CIDR: "10.2.0.0/16", Ports: []v1alpha1.Port{{Port: ptr[int32](80)}}}},
	}})
	metrics := compile(t, &v1alpha1.PolicyEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "metrics"}, Spec: v1alpha1.PolicyEndpointSpec{
		PodIsolation: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}, PodSelectorEndpoints: eps,
		Ingress: []v1alpha1.EndpointInfo{{CIDR: "10.3.0.5/32", Ports: []v1alpha1.Port{{Port: ptr[int32](9090)}}}},
		Egress:  []v1alpha1.EndpointInfo{{CIDR: "10.3.0.0/16"}},
	}})
	denyMeta := compile(t, &v1alpha1.ClusterPolicyEndpoint{ObjectMeta: metav1.ObjectMeta{Name: "b-deny"}, Spec: v1alpha1.ClusterPolicyEndpointSpec{
		Tier: v1alpha1.TierAdmin, Priority: 20, PodSelectorEndpoints: eps,
		Ingress: []v1alpha1.ClusterEndpointInfo{{Action: v1alpha1.ClusterRuleActionDeny, CIDR: "10.2.0.66/32"}},
	}})
	allowOps := compile(t, &v1alpha1.ClusterPolicyEndpoint{ObjectMeta: metav1.ObjectMeta{Name: "a-allow"}, Spec: v1alpha1.ClusterPolicyEndpointSpec{
		Tier: v1alpha1.TierAdmin, Priority: 10, PodSelectorEndpoints: eps,
		Ingress: []v1alpha1.ClusterEndpointInfo{{Action: v1alpha1.ClusterRuleActionAccept, CIDR: "10.2.0.66/32", Ports: []v1alpha1.Port{{Port: ptr[int32](22)}}}},
	}})
	baseline := compile(t, &v1alpha1.ClusterPolicyEndpoint{ObjectMeta: metav1.ObjectMeta{Name: "baseline"}, Spec: v1alpha1.ClusterPolicyEndpointSpec{
		Tier: v1alpha1.TierBaseline, Priority: 1, PodSelectorEndpoints: eps,
		Egress: []v1alpha1.ClusterEndpointInfo{{Action: v1alpha1.ClusterRuleActionDeny, CIDR: "0.0.0.0/0"}},
	}})

	p := MergePodPolicy([]*Compiled{denyMeta, baseline, web, allowOps, metrics})
	in, out := p.Ingress, p.Egress
	addr := netip.MustParseAddr
	for _, tc := range []struct {
		name string
		dir  bpfmaps.DirectionPolicy
		peer string
		prot bpfmaps.Protocol
		port uint16
		want bool
	}{
		{"web rule", in, "10.2.1.1", bpfmaps.ProtocolTCP, 80, true},
		{"metrics rule (union)", in, "10.3.0.5", bpfmaps.ProtocolTCP, 9090, true},
		{"isolated: other port", in, "10.2.1.1", bpfmaps.ProtocolTCP, 81, false},
		{"isolated: other peer", in, "10.4.0.1", bpfmaps.ProtocolTCP, 80, false},
		{"admin deny beats namespaced allow", in, "10.2.0.66", bpfmaps.ProtocolTCP, 80, false},
		{"lower priority admin accept first", in, "10.2.0.66", bpfmaps.ProtocolTCP, 22, true},
		{"egress isolated by metrics", out, "10.3.1.1", bpfmaps.ProtocolUDP, 53, true},
		{"egress isolated: baseline not consulted, default deny", out, "8.8.8.8", bpfmaps.ProtocolUDP, 53, false},
	} {
		if got := tc.dir.Verdict(addr(tc.peer), tc.prot, tc.port); got != tc.want {
			t.Errorf("%s: verdict(%s %v/%d) = %v, want %v", tc.name, tc.peer, tc.prot, tc.port, got, tc.want)
		}
	}
	if !in.Isolated || !out.Isolated {
		t.Errorf("isolation = %v/%v, want both", in.Isolated, out.Isolated)
	}
	// Admin rules ordered by priority across objects.
	if len(in.Admin) != 2 || in.Admin[0].Priority != 10 || in.Admin[1].Priority != 20 {
		t.Errorf("admin tier order: %+v", in.Admin)
	}
	// Verdict counters credit the isolating objects and each admin rule's object.
	srcName := func(os []bpfmaps.Origin) (names []string) {
		for _, o := range os {
			names = append(names, fmt.Sprintf("%s %s/%s#%d", o.Kind, o.Namespace, o.Name, o.Index))
		}
		return names
	}
	if got, want := srcName(in.Sources), []string{"PolicyEndpoint shop/metrics#-1", "PolicyEndpoint shop/web#-1"}; !slices.Equal(got, want) {
		t.Errorf("ingress sources %q, want %q", got, want)
	}
	if got, want := srcName(out.Sources), []string{"PolicyEndpoint shop/metrics#-1"}; !slices.Equal(got, want) {
		t.Errorf("egress sources %q, want %q", got, want)
	}
	if got, want := srcName([]bpfmaps.Origin{in.Admin[0].Origin, in.Admin[1].Origin}),
		[]string{"ClusterPolicyEndpoint /a-allow#0", "ClusterPolicyEndpoint /b-deny#0"}; !slices.Equal(got, want) {
		t.Errorf("admin rule origins %q, want %q", got, want)
	}

	// Deterministic whatever the input order: the dataplane's hash skip depends on it.
	again := MergePodPolicy([]*Compiled{metrics, allowOps, web, baseline, denyMeta})
	if !reflect.DeepEqual(p, again) {
		t.Errorf("merge depends on input order")
	}

	// Without namespaced policy the baseline tier decides egress.
	p = MergePodPolicy([]*Compiled{baseline})
	if p.Egress.Isolated || p.Egress.Verdict(addr("8.8.8.8"), bpfmaps.ProtocolUDP, 53) {
		t.Errorf("baseline deny-all egress not in force: %+v", p.Egress)
	}
	if !p.Ingress.Verdict(addr("8.8.8.8"), bpfmaps.ProtocolTCP, 80) {
		t.Errorf("ingress without any policy must allow")
	}
}

// TestCompileEnforcesEntryBudget: CIDRs plus except blocks of both directions count
// against MaxEntriesPerObject; one over is a FieldError naming the count, for both
// kinds; rules of a direction the object does not isolate are not programmed and do
// not count.
func TestCompileEnforcesEntryBudget(t *testing.T) {
	pe := &v1alpha1.PolicyEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "big"}, Spec: v1alpha1.PolicyEndpointSpec{
		PodIsolation: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
		Ingress:      []v1alpha1.EndpointInfo{{CIDR: "10.0.0.0/8", Except: []v1alpha1.NetworkAddress{"10.1.0.0/16", "10.2.0.0/16"}}}, // 3
		Egress:       []v1alpha1.EndpointInfo{{CIDR: "192.0.2.0/24"}, {CIDR: "fd00::/64"}},                                           // 2
	}}
	five := Options{MaxEntriesPerObject: 5}
	if _, err := five.PolicyEndpoint(pe, testNode); err != nil {
		t.Fatalf("5 entries with a budget of 5: %v", err)
	}
	_, err := Options{MaxEntriesPerObject: 4}.PolicyEndpoint(pe, testNode)
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Path != "spec" || fe.Field != "spec" || fe.Value != "5" || !strings.Contains(fe.Msg, "4") {
		t.Fatalf("5 entries with a budget of 4: err %v, want a FieldError at spec naming 5 and 4", err)
	}
	ingressOnly := pe.DeepCopy()
	ingressOnly.Spec.PodIsolation = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	if _, err := (Options{MaxEntriesPerObject: 3}).PolicyEndpoint(ingressOnly, testNode); err != nil {
		t.Errorf("egress rules of an object not isolating egress counted: %v", err)
	}
	cpe := &v1alpha1.ClusterPolicyEndpoint{ObjectMeta: metav1.ObjectMeta{Name: "deny"}, Spec: v1alpha1.ClusterPolicyEndpointSpec{
		Tier: v1alpha1.TierAdmin,
		Ingress: []v1alpha1.ClusterEndpointInfo{{Action: v1alpha1.ClusterRuleActionDeny, CIDR: "10.0.0.0/8"},
			{Action: v1alpha1.ClusterRuleActionDeny, CIDR: "10.1.0.0/16"}},
	}}
	if _, err := (Options{MaxEntriesPerObject: 1}).ClusterPolicyEndpoint(cpe, testNode); !errors.As(err, &fe) || fe.Value != "2" {
		t.Errorf("CPE with 2 entries, budget 1: err %v, want a FieldError naming 2", err)
	}
	// The zero value takes the default.
	big := &v1alpha1.PolicyEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "big"}}
	for i := range DefaultMaxEntriesPerObject + 1 {
		big.Spec.Ingress = append(big.Spec.Ingress, v1alpha1.EndpointInfo{CIDR: v1alpha1.NetworkAddress(fmt.Sprintf("10.%d.%d.0/24", i/256, i%256))})
	}
	if _, err := (Options{}).PolicyEndpoint(big, testNode); !errors.As(err, &fe) || fe.Value != strconv.Itoa(DefaultMaxEntriesPerObject+1) {
		t.Errorf("default budget: err %v, want a FieldError naming %d", err, DefaultMaxEntriesPerObject+1)
	}
	big.Spec.Ingress = big.Spec.Ingress[:DefaultMaxEntriesPerObject]
	if _, err := (Options{}).PolicyEndpoint(big, testNode); err != nil {
		t.Errorf("default budget, exactly %d entries: %v", DefaultMaxEntriesPerObject, err)
	}
}

// TestCompileEntriesFitHalfATrie: whatever the budget, one direction's entries of
// one family may fill at most half that family's trie (a commit holds two entry
// sets). With the default tries (IPv6: 16,384), 8,192 IPv6 CIDRs in one direction
// compile and 8,193 are a FieldError naming the direction, the count and the flag;
// the same count in IPv4, or split over two directions, fits.
func TestCompileEntriesFitHalfATrie(t *testing.T) {
	v6 := func(n int) []v1alpha1.EndpointInfo {
		var out []v1alpha1.EndpointInfo
		for i := range n {
			out = append(out, v1alpha1.EndpointInfo{CIDR: v1alpha1.NetworkAddress(fmt.Sprintf("fd00:%x:%x::/48", i/4096, i%4096))})
		}
		return out
	}
	pe := func(in, eg []v1alpha1.EndpointInfo) *v1alpha1.PolicyEndpoint {
		return &v1alpha1.PolicyEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "v6"}, Spec: v1alpha1.PolicyEndpointSpec{
			PodIsolation: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}, Ingress: in, Egress: eg}}
	}
	half := bpfmaps.DefaultEntriesV6 / 2
	if _, err := (Options{}).PolicyEndpoint(pe(v6(half), nil), testNode); err != nil {
		t.Fatalf("%d IPv6 entries in one direction: %v", half, err)
	}
	_, err := Options{}.PolicyEndpoint(pe(v6(half+1), nil), testNode)
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Path != "spec.ingress" || fe.Value != strconv.Itoa(half+1) || !strings.Contains(fe.Msg, "--max-entries-ipv6") {
		t.Fatalf("%d IPv6 entries in one direction: err %v, want a FieldError at spec.ingress naming the count and --max-entries-ipv6", half+1, err)
	}
	if _, err := (Options{}).PolicyEndpoint(pe(v6(half), v6(half)), testNode); err != nil {
		t.Errorf("%d IPv6 entries in each direction: %v", half, err)
	}
	if _, err := (Options{MapEntriesV6: 4 * bpfmaps.DefaultEntriesV6}).PolicyEndpoint(pe(v6(half+1), nil), testNode); err != nil {
		t.Errorf("%d IPv6 entries with a larger trie: %v", half+1, err)
	}
}
