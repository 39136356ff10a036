package bpfmaps

import (
	"math/rand/v2"
	"net/netip"
	"testing"
)

// policyGen draws random policies and packets from a small address universe, so
// that CIDRs, excepts and peers nest and overlap often.
type policyGen struct {
	rnd  *rand.Rand
	node []netip.Prefix // the node set (withNode): packets draw peers from it too
	// anyMix: the draws come from a fuzzer, which may pick policies that allow
	// everything or nothing; the sample-balance checks of random seeds do not apply.
	anyMix bool
}

// testNodeSet is a node set inside the generator's address universe: exact
// addresses and CIDRs of both families.
var testNodeSet = []netip.Prefix{
	netip.MustParsePrefix("10.1.2.128/32"),
	netip.MustParsePrefix("10.255.0.0/16"),
	netip.MustParsePrefix("fd00:0:0:ff:100::2/128"),
	netip.MustParsePrefix("fd00:0:0:80::/64"),
}

// withNode makes checkAgainstReference set testNodeSet on the dataplane and expect
// its peers allowed; packets then sometimes come from a node address.
func (g *policyGen) withNode() *policyGen {
	g.node = testNodeSet
	return g
}

func newPolicyGen(seed uint64) *policyGen {
	return &policyGen{rnd: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

var (
	octets   = []byte{0, 1, 2, 128, 255}
	v4Bits   = []int{0, 8, 16, 24, 25, 30, 31, 32}
	v6Bits   = []int{0, 8, 16, 48, 64, 96, 120, 127, 128}
	portPool = []int32{1, 53, 80, 443, 1000, 8080, 65535}
)

func (g *policyGen) addr(v6 bool) netip.Addr {
	pick := func() byte { return octets[g.rnd.IntN(len(octets))] }
	if !v6 {
		return netip.AddrFrom4([4]byte{10, pick(), pick(), pick()})
	}
	var a [16]byte
	a[0], a[1] = 0xfd, 0x00
	a[7], a[8], a[14], a[15] = pick(), pick(), pick(), pick()
	return netip.AddrFrom16(a)
}

func (g *policyGen) prefix(v6 bool) netip.Prefix {
	bits := v4Bits[g.rnd.IntN(len(v4Bits))]
	if v6 {
		bits = v6Bits[g.rnd.IntN(len(v6Bits))]
	}
	p, _ := g.addr(v6).Prefix(bits)
	return p
}

// within returns a prefix inside p most of the time, an arbitrary one otherwise.
func (g *policyGen) within(p netip.Prefix) netip.Prefix {
	v6 := p.Addr().Is6()
	for range 8 {
		q := g.prefix(v6)
		if q.Bits() > p.Bits() && p.Contains(q.Addr()) {
			return q
		}
	}
	return g.prefix(v6)
}

func (g *policyGen) ports() []PortRule {
	n := g.rnd.IntN(4)
	if n == 0 {
		return nil
	}
	protos := []Protocol{ProtocolAny, ProtocolTCP, ProtocolUDP, ProtocolSCTP, ProtocolTCP}
	out := make([]PortRule, n)
	for i := range out {
		pr := PortRule{Protocol: protos[g.rnd.IntN(len(protos))]}
		switch g.rnd.IntN(4) {
		case 0: // all ports
		case 1, 2:
			pr.Port = portPool[g.rnd.IntN(len(portPool))]
		default:
			pr.Port = portPool[g.rnd.IntN(len(portPool)-1)]
			pr.EndPort = pr.Port + int32(g.rnd.IntN(600))
			if pr.EndPort > 65535 {
				pr.EndPort = 65535
			}
		}
		out[i] = pr
	}
	return out
}

func (g *policyGen) rule(v6 bool) Rule {
	r := Rule{CIDR: g.prefix(v6), Ports: g.ports()}
	for range g.rnd.IntN(3) {
		r.Except = append(r.Except, g.within(r.CIDR))
	}
	return r
}

func (g *policyGen) family() bool { return g.rnd.IntN(3) == 0 } // true: IPv6

func (g *policyGen) tier() []TierRule {
	n := g.rnd.IntN(5)
	out := make([]TierRule, n)
	for i := range out {
		out[i] = TierRule{
			Priority: int32(g.rnd.IntN(4)),
			Action:   Action(1 + g.rnd.IntN(3)),
			Rule:     g.rule(g.family()),
		}
	}
	return out
}

func (g *policyGen) direction() DirectionPolicy {
	d := DirectionPolicy{Isolated: g.rnd.IntN(3) != 0}
	for range g.rnd.IntN(6) {
		d.Allow = append(d.Allow, g.rule(g.family()))
	}
	if g.rnd.IntN(2) == 0 {
		d.Admin = g.tier()
	}
	if g.rnd.IntN(2) == 0 {
		d.Baseline = g.tier()
	}
	return d
}

func (g *policyGen) pod() PodPolicy {
	return PodPolicy{Ingress: g.direction(), Egress: g.direction()}
}

// packet is a peer address, protocol and destination port to evaluate.
type packet struct {
	peer  netip.Addr
	proto Protocol
	port  uint16
}

func (g *policyGen) packet() packet {
	v6 := g.family()
	protos := []Protocol{ProtocolTCP, ProtocolUDP, ProtocolSCTP, ProtocolTCP, ProtocolUDP, ProtocolICMP}
	p := packet{peer: g.addr(v6), proto: protos[g.rnd.IntN(len(protos))]}
	if len(g.node) > 0 && g.rnd.IntN(8) == 0 { // an address inside a node prefix
		n := g.node[g.rnd.IntN(len(g.node))]
		p.peer, v6 = n.Addr(), n.Addr().Is6()
		if n.Bits() < n.Addr().BitLen() {
			b := p.peer.AsSlice()
			b[len(b)-1] = byte(1 + g.rnd.IntN(254))
			p.peer, _ = netip.AddrFromSlice(b)
		}
	}
	if v6 && p.proto == ProtocolICMP {
		p.proto = ProtocolICMPv6
	}
	if p.proto.hasPorts() {
		switch g.rnd.IntN(4) {
		case 0:
			p.port = uint16(g.rnd.IntN(65536))
		case 1:
			p.port = uint16(portPool[g.rnd.IntN(len(portPool))] + 1)
		default:
			p.port = uint16(portPool[g.rnd.IntN(len(portPool))])
		}
	}
	return p
}

// referenceVerdictNode is referenceVerdict with a node set: a peer in it is always
// allowed (traffic between a pod and its own node), in every tier and direction.
func referenceVerdictNode(node []netip.Prefix, p PodPolicy, d Direction, pkt packet) bool {
	return nodeContains(node, pkt.peer) || referenceVerdict(p, d, pkt)
}

// referenceVerdict is what a backend must answer for pkt in direction d of pod
// policy p: the DirectionPolicy's own Verdict.
func referenceVerdict(p PodPolicy, d Direction, pkt packet) bool {
	pol := p.Ingress
	if d == Egress {
		pol = p.Egress
	}
	return pol.Verdict(pkt.peer, pkt.proto, pkt.port)
}

// checkAgainstReference is the property test both backends share: rounds random
// pod policies from g are committed to dp, in turn to each of ifaces, and for
// packets random packets per round, in both directions, the backend's verdict
// must equal referenceVerdict. It fails on the first difference, and when one
// outcome is so rare the sample proves little; it returns what it checked.
func checkAgainstReference(t *testing.T, g *policyGen, dp Dataplane, ifaces []int, rounds, packets int,
	backend func(ifindex int, d Direction, pkt packet) bool) (checked, allowed int) {
	t.Helper()
	if len(g.node) > 0 {
		if err := dp.(NodeExemption).SetNodeAddrs(g.node); err != nil {
			t.Fatalf("set node addresses: %v", err)
		}
	}
	nodeAllowed := 0
	for round := range rounds {
		ifindex := ifaces[round%len(ifaces)]
		p := g.pod()
		if _, err := dp.Commit(ifindex, p); err != nil {
			t.Fatalf("round %d: commit: %v", round, err)
		}
		for range packets {
			pkt := g.packet()
			for _, d := range []Direction{Ingress, Egress} {
				want := referenceVerdictNode(g.node, p, d, pkt)
				if want && !referenceVerdict(p, d, pkt) {
					nodeAllowed++
				}
				if got := backend(ifindex, d, pkt); got != want {
					t.Fatalf("round %d pod %d %s %v %v/%d: backend verdict %v, Verdict %v\npolicy: %+v",
						round, ifindex, d, pkt.peer, pkt.proto, pkt.port, got, want, p)
				}
				checked++
				if want {
					allowed++
				}
			}
		}
	}
	if g.anyMix {
		return checked, allowed
	}
	if allowed < checked/10 || allowed > checked*9/10 {
		t.Fatalf("skewed sample: %d of %d packets allowed", allowed, checked)
	}
	if len(g.node) > 0 && nodeAllowed < checked/100 {
		t.Fatalf("skewed sample: %d of %d packets allowed only as node traffic", nodeAllowed, checked)
	}
	return checked, allowed
}
