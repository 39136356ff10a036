package bpfmaps

import (
	"net/netip"
	"testing"
)

// BenchmarkVerdictConntrack: the program's cost per packet on the connection-tracking
// paths, for a pod whose ingress trie holds 10,000 entries and whose egress is
// isolated too (so connections either direction allows are tracked). All packets are
// TCP ACKs of established flows except where named:
//   - allowed: a packet the ingress policy allows (the entry of its connection is
//     refreshed: the common path);
//   - reply: the reply to a connection the pod opened (the ingress policy denies it,
//     the connection table passes it);
//   - denied-port, denied-miss: denied by the policy, no connection (a table miss).
func BenchmarkVerdictConntrack(b *testing.B) {
	e := openTestEBPF(b, EBPFOptions{})
	ifindex := dummyInterface(b)
	pol := widePolicy(10000, 80)
	pol.Egress = DirectionPolicy{Isolated: true, Allow: []Rule{{CIDR: netip.MustParsePrefix("10.200.0.0/16"), Ports: []PortRule{{Protocol: ProtocolTCP, Port: 443}}}}}
	if _, err := e.Commit(ifindex, pol); err != nil {
		b.Fatal(err)
	}
	ack := func(p []byte) []byte {
		p[14+20+13] = 0x10
		return p
	}
	peer, server := netip.MustParseAddr("10.0.20.7"), netip.MustParseAddr("10.200.0.9")
	// The connections: the peer's to the pod's port 80, the pod's to the server's 443.
	run(b, e.objs.ToPod, ifindex, packetBytes(peer, podAddrIngress4, ProtocolTCP, 40000, 80))
	run(b, e.objs.FromPod, ifindex, packetBytes(podAddrIngress4, server, ProtocolTCP, 50000, 443))
	benchVerdicts(b, e, ifindex, []verdictCase{
		{"allowed", ack(packetBytes(peer, podAddrIngress4, ProtocolTCP, 40000, 80))},
		{"reply", ack(packetBytes(server, podAddrIngress4, ProtocolTCP, 443, 50000))},
		{"denied-port", ack(packetBytes(peer, podAddrIngress4, ProtocolTCP, 40000, 81))},
		{"denied-miss", ack(packetBytes(netip.MustParseAddr("11.0.0.1"), podAddrIngress4, ProtocolTCP, 40000, 80))},
	})
}
