package bpfmaps

import (
	"net/netip"
	"testing"

	"github.com/npagent/npagent/internal/testenv/netlab"
)

// TestRealNodeEgress: a pod whose policy denies everything both ways, with the node
// namespace's h1 addresses (the pod's gateway) as the node set, IPv4 and IPv6. Under
// NodeEgressAllow it reaches a TCP server on the node's address; the agent then
// restarts on the same pins with NodeEgressPolicy, and it no longer does, while the
// node's own TCP connections to the pod (a kubelet probe) still complete: the pod's
// SYN-ACK passes its egress as the reply of a connection the node opened. Before
// NodeEgressPolicy reached the datapath, the pod reached the node in every mode.
func TestRealNodeEgress(t *testing.T) {
	lab := newTrafficLab(t)
	node4, node6 := netip.MustParseAddr("10.201.1.1"), netip.MustParseAddr("fd00:201:1::1")
	pod4, pod6 := netip.MustParseAddr(labPod4), netip.MustParseAddr(labPod6)
	for _, a := range []netip.Addr{node4, node6} {
		netlab.ServeEcho(t, lab.node, "tcp", netip.AddrPortFrom(a, 7100).String())
		netlab.ServeEcho(t, lab.node, "udp", netip.AddrPortFrom(a, 7101).String())
	}
	for _, a := range []netip.Addr{pod4, pod6} {
		netlab.ServeEcho(t, lab.pod, "tcp", netip.AddrPortFrom(a, 8080).String())
	}
	lab.enterNode(t)
	pin := testPinPath(t)
	deny := PodPolicy{Ingress: DirectionPolicy{Isolated: true}, Egress: DirectionPolicy{Isolated: true}, Addrs: labPodAddrs}
	for _, mode := range []NodeEgress{NodeEgressAllow, NodeEgressPolicy} {
		e := openTestEBPF(t, EBPFOptions{PinPath: pin, NodeEgress: mode})
		if err := e.SetNodeAddrs([]netip.Prefix{netip.PrefixFrom(node4, 32), netip.PrefixFrom(node6, 128)}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.Commit(lab.hostIfindex, deny); err != nil {
			t.Fatal(err)
		}
		for _, fam := range []struct {
			name      string
			node, pod netip.Addr
		}{{"IPv4", node4, pod4}, {"IPv6", node6, pod6}} {
			for _, f := range []struct {
				network string
				port    uint16
			}{{"tcp", 7100}, {"udp", 7101}} {
				err := netlab.Exchange(lab.pod, f.network, netip.AddrPortFrom(fam.node, f.port).String(), trafficTimeout)
				if want := mode == NodeEgressAllow; (err == nil) != want {
					t.Errorf("--node-egress=%v, %s: pod → node %s %d: exchange error %v, want reached=%v", mode, fam.name, f.network, f.port, err, want)
				}
			}
			if err := netlab.Exchange(lab.node, "tcp", netip.AddrPortFrom(fam.pod, 8080).String(), trafficTimeout); err != nil {
				t.Errorf("--node-egress=%v, %s: node → pod tcp 8080 (a probe): %v", mode, fam.name, err)
			}
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestNodeEgressPolicyExceptions runs the programs on crafted packets under
// NodeEgressPolicy: a pod whose egress denies everything cannot send TCP or UDP to a
// node address but still sends DHCP to it (UDP 68 → 67, 546 → 547); other peers stay
// denied; the node's packets to the pod pass. The in-memory backend decides the same
// for what it models (no ports of the pod's own).
func TestNodeEgressPolicyExceptions(t *testing.T) {
	e := openTestEBPF(t, EBPFOptions{NodeEgress: NodeEgressPolicy})
	mem := NewMemory()
	mem.SetNodeEgress(NodeEgressPolicy)
	ifindex := dummyInterface(t)
	node4, node6 := netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("2001:db8::10")
	pod4, pod6 := netip.MustParseAddr("10.255.8.1"), netip.MustParseAddr("fd00:ff::8:1")
	pol := PodPolicy{Ingress: DirectionPolicy{Isolated: true}, Egress: DirectionPolicy{Isolated: true}, Addrs: []netip.Addr{pod4, pod6}}
	for _, dp := range []Dataplane{e, mem} {
		if err := dp.(NodeExemption).SetNodeAddrs([]netip.Prefix{netip.PrefixFrom(node4, 32), netip.PrefixFrom(node6, 128)}); err != nil {
			t.Fatal(err)
		}
		if _, err := dp.Commit(ifindex, pol); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name         string
		src, dst     netip.Addr
		proto        Protocol
		sport, dport uint16
		want         bool
	}{
		{"TCP to the node", pod4, node4, ProtocolTCP, 40000, 10250, false},
		{"UDP to the node", pod4, node4, ProtocolUDP, 40000, 53, false},
		{"TCP6 to the node", pod6, node6, ProtocolTCP, 40000, 10250, false},
		{"DHCP to the node", pod4, node4, ProtocolUDP, 68, 67, true},
		{"DHCPv6 to the node", pod6, node6, ProtocolUDP, 546, 547, true},
		{"DHCP to another address", pod4, netip.MustParseAddr("192.0.2.11"), ProtocolUDP, 68, 67, false},
	} {
		if got := run(t, e.objs.FromPod, ifindex, packetBytes(c.src, c.dst, c.proto, c.sport, c.dport)); got != c.want {
			t.Errorf("%s: kernel passed=%v, want %v", c.name, got, c.want)
		}
		if c.sport != 68 && c.sport != 546 {
			if got := mem.Verdict(ifindex, Egress, c.dst, c.proto, c.dport); got != c.want {
				t.Errorf("%s: Memory allowed=%v, want %v", c.name, got, c.want)
			}
		}
	}
	for _, a := range [][2]netip.Addr{{node4, pod4}, {node6, pod6}} {
		if !run(t, e.objs.ToPod, ifindex, packetBytes(a[0], a[1], ProtocolTCP, 40000, 8080)) || !mem.Verdict(ifindex, Ingress, a[0], ProtocolTCP, 8080) {
			t.Errorf("the node's %s → pod TCP 8080 dropped", a[0])
		}
	}
}
