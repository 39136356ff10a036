package translate

import (
	"errors"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
)

// FuzzCompilePolicyEndpoint feeds PolicyEndpoints built from arbitrary strings and
// numbers through the agent's path from object to dataplane: compile, merge (two
// objects selecting one pod), commit to the in-memory backend. An object is either rejected with a FieldError naming a field
// of the spec, or every probe packet gets the verdict the object itself gives, read
// straight from its fields by objectAllows (not by the compiler's helpers), from the
// merged policy's Verdict and from the committed entries alike.
func FuzzCompilePolicyEndpoint(f *testing.F) {
	f.Add("10.0.0.0/8", "10.1.0.0/16", "10.2.0.7", "TCP", int32(80), int32(0), true, false, "10.1.2.3", uint16(80), false)
	f.Add("10.0.0.0/8", "10.0.0.0/9", "", "UDP", int32(1000), int32(1010), true, true, "10.200.0.1", uint16(1005), true)
	f.Add("fd00::/64", "fd00::/80", "::/0", "SCTP", int32(0), int32(0), false, false, "fd00::1", uint16(9), false)
	f.Add("10.0.0.1/8", "", "192.168.0.0/16", "", int32(443), int32(0), true, false, "192.168.1.1", uint16(443), true)
	f.Add("fd00::1", "", "", "ICMP", int32(5), int32(4), true, true, "fd00::1", uint16(0), false)
	f.Add("::ffff:10.0.0.0/104", "10.0.0.0/9", "10.0.0.0/33", "tcp", int32(70000), int32(0), true, false, "x", uint16(1), false)
	f.Fuzz(func(t *testing.T, cidrA, exceptA, cidrB, proto string, port, endPort int32, hasPort, hasEnd bool, peer string, probePort uint16, egress bool) {
		var ports []v1alpha1.Port
		if hasPort || proto != "" {
			var p v1alpha1.Port
			if proto != "" {
				p.Protocol = (*corev1.Protocol)(&proto)
			}
			if hasPort {
				p.Port = &port
			}
			if hasEnd {
				p.EndPort = &endPort
			}
			ports = []v1alpha1.Port{p}
		}
		rules := []v1alpha1.EndpointInfo{{CIDR: v1alpha1.NetworkAddress(cidrA), Ports: ports}}
		if exceptA != "" {
			rules[0].Except = []v1alpha1.NetworkAddress{v1alpha1.NetworkAddress(exceptA)}
		}
		dir, isolation := bpfmaps.Ingress, networkingv1.PolicyTypeIngress
		if egress {
			dir, isolation = bpfmaps.Egress, networkingv1.PolicyTypeEgress
		}
		// A second object of another policy selecting the same pod, with one rule
		// (cidrB): the pod's policy is the union, merged by MergePodPolicy.
		var rulesB []v1alpha1.EndpointInfo
		if cidrB != "" {
			rulesB = []v1alpha1.EndpointInfo{{CIDR: v1alpha1.NetworkAddress(cidrB)}}
		}
		var objs []*Compiled
		for i, rs := range [][]v1alpha1.EndpointInfo{rules, rulesB} {
			if i == 1 && rs == nil {
				break
			}
			pe := &v1alpha1.PolicyEndpoint{
				ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "fuzz-" + strconv.Itoa(i), UID: "u1", ResourceVersion: "1"},
				Spec: v1alpha1.PolicyEndpointSpec{
					PolicyRef:            v1alpha1.PolicyReference{Namespace: "ns", Name: "p" + strconv.Itoa(i)},
					PodIsolation:         []networkingv1.PolicyType{isolation},
					PodSelectorEndpoints: []v1alpha1.PodEndpoint{{HostIP: "192.0.2.1", PodIP: "10.9.9.9", Name: "pod", Namespace: "ns"}},
				},
			}
			if egress {
				pe.Spec.Egress = rs
			} else {
				pe.Spec.Ingress = rs
			}
			obj, err := Options{}.PolicyEndpoint(pe, netip.MustParseAddr("192.0.2.1"))
			if err != nil {
				checkFieldError(t, err)
				return
			}
			objs = append(objs, obj)
		}
		rules = append(rules, rulesB...) // the merged policy's rules, as the object fields say

		policy := MergePodPolicy(objs)
		mem := bpfmaps.NewMemory()
		if _, err := mem.Commit(1, policy); err != nil {
			t.Fatalf("commit of a compiled object: %v", err)
		}
		dp := policy.Ingress
		if egress {
			dp = policy.Egress
		}
		for _, addr := range probeAddrs(peer, cidrA, exceptA, cidrB) {
			for _, pr := range []bpfmaps.Protocol{bpfmaps.ProtocolTCP, bpfmaps.ProtocolUDP, bpfmaps.ProtocolSCTP, bpfmaps.ProtocolICMP, bpfmaps.ProtocolICMPv6} {
				want := objectAllows(rules, addr, pr, probePort)
				if got := dp.Verdict(addr, pr, probePort); got != want {
					t.Fatalf("merged policy Verdict(%s, %v, %d) = %v, the object says %v\nrules: %+v", addr, pr, probePort, got, want, rules)
				}
				if got := mem.Verdict(1, dir, addr, pr, probePort); got != want {
					t.Fatalf("committed entries Verdict(%s, %v, %d) = %v, the object says %v\nrules: %+v", addr, pr, probePort, got, want, rules)
				}
			}
		}
	})
}

// checkFieldError checks a rejection names a spec field, without indexes in the
// counter's label, and quotes the value.
func checkFieldError(t *testing.T, err error) {
	t.Helper()
	var fe *FieldError
	if !errors.As(err, &fe) {
		t.Fatalf("rejected with %T %v, want a *FieldError", err, err)
	}
	if !strings.HasPrefix(fe.Path, "spec.") || strings.ContainsAny(fe.Field, "[]") || fe.Msg == "" {
		t.Fatalf("FieldError %+v: want a spec path, an index-free field and a message", fe)
	}
	if !strings.Contains(err.Error(), strconv.Quote(fe.Value)) {
		t.Fatalf("error %q does not quote the value %q", err, fe.Value)
	}
}

// objectAllows is what an isolated direction with these PolicyEndpoint rules allows,
// read from the object's fields as NetworkPolicy defines them: a peer inside a rule's
// cidr (a bare address is one host) and outside its excepts, and no ports or a port
// entry whose protocol (TCP when unset) and port or range match. Port-less packets
// (ICMP) match only rules without ports.
func objectAllows(rules []v1alpha1.EndpointInfo, peer netip.Addr, proto bpfmaps.Protocol, port uint16) bool {
	block := func(s v1alpha1.NetworkAddress) netip.Prefix {
		if p, err := netip.ParsePrefix(string(s)); err == nil {
			return p.Masked()
		}
		a := netip.MustParseAddr(string(s)) // compiled: it parses
		return netip.PrefixFrom(a, a.BitLen())
	}
	protoOf := map[corev1.Protocol]bpfmaps.Protocol{
		corev1.ProtocolTCP: bpfmaps.ProtocolTCP, corev1.ProtocolUDP: bpfmaps.ProtocolUDP, corev1.ProtocolSCTP: bpfmaps.ProtocolSCTP,
	}
	for _, r := range rules {
		if !block(r.CIDR).Contains(peer) {
			continue
		}
		excepted := false
		for _, e := range r.Except {
			excepted = excepted || block(e).Contains(peer)
		}
		if excepted {
			continue
		}
		if len(r.Ports) == 0 {
			return true
		}
		for _, p := range r.Ports {
			want := bpfmaps.ProtocolTCP
			if p.Protocol != nil {
				want = protoOf[*p.Protocol]
			}
			if want != proto {
				continue
			}
			switch {
			case p.Port == nil:
				return true
			case p.EndPort == nil:
				if int32(port) == *p.Port {
					return true
				}
			case int32(port) >= *p.Port && int32(port) <= *p.EndPort:
				return true
			}
		}
	}
	return false
}

// probeAddrs draws peers around the object's own blocks, where verdicts change: each
// block's first and last address and their neighbours, and the fuzzed peer.
func probeAddrs(peer string, blocks ...string) []netip.Addr {
	var out []netip.Addr
	if a, err := netip.ParseAddr(peer); err == nil && a.Zone() == "" {
		out = append(out, a)
	}
	for _, s := range blocks {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, err := netip.ParseAddr(s)
			if err != nil || a.Zone() != "" {
				continue
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		p = p.Masked()
		first := p.Addr()
		last := lastAddr(p)
		for _, a := range []netip.Addr{first, first.Prev(), last, last.Next()} {
			if a.IsValid() {
				out = append(out, a)
			}
		}
	}
	return out
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}
