package bpfmaps

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Judge's equivalence with the kernel: what it reads back from the maps for a
// packet must be what the programs did with that packet — whether it arrived, and
// the verdict counter it moved.

// matrixJudged reports whether the verdict matrix judges a probe's shape as Judge
// does: a whole packet with its ports (plain, behind IPv6 destination options, a
// first fragment) or a forged source. Later fragments (no ports: they follow their
// first) and frames behind VLAN tags (not IP to the program) are not.
func matrixJudged(v matrixVariant) bool {
	return v == matrixPlain || v == matrixExtHeaders || v == matrixFirstFragment || v == matrixForgedSource
}

func matrixPodIndex(name string) int {
	return slices.IndexFunc(matrixPods, func(e matrixEnd) bool { return e.name == name })
}

// judgeProbe is Judge's answer for a matrix probe: whether it passes every program
// on its path (a pod's ingress, its egress, or the sender's egress and then the
// receiver's ingress), and the judgement of each program it reaches, by interface.
func (l *matrixLab) judgeProbe(t *testing.T, e *EBPF, p *matrixProbe) (bool, map[int]Judgement) {
	t.Helper()
	k := p.key
	out := map[int]Judgement{}
	judge := func(pod int, d Direction) bool {
		j, err := e.Judge(Probe{Ifindex: l.hostIfindex[pod], Direction: d, Src: k.src, Dst: k.dst, Proto: k.proto, SrcPort: k.sport, Port: k.dport})
		if err != nil {
			t.Fatalf("judge %+v: %v", k, err)
		}
		if j.Managed {
			out[l.hostIfindex[pod]] = j
		}
		return j.Passes()
	}
	switch p.dir {
	case "ingress":
		return judge(matrixPodIndex(p.pod), Ingress), out
	case "egress":
		return judge(matrixPodIndex(p.pod), Egress), out
	}
	return judge(matrixPodIndex(p.pod), Egress) && judge(matrixPodIndex(p.peer), Ingress), out
}

// judgedCount is the counter a judged packet moves (as verdictName names it).
func judgedCount(d Direction, j Judgement) VerdictCount {
	c := VerdictCount{Direction: d, Reason: j.Reason, Audited: j.Audited, Attributed: j.Attributed}
	if j.Reason != ReasonNode { // the node's passes are credited to no rule
		c.Rule, c.Sources = j.Rule, j.Sources
	}
	return c
}

// withOrigins names every object and tier rule of a scenario's policies, so the
// counters credit them.
func withOrigins(sc matrixScenario) matrixScenario {
	out := matrixScenario{name: sc.name}
	for i, pol := range sc.pods {
		if pol == nil {
			out.pods = append(out.pods, nil)
			continue
		}
		p := *pol
		for d, dp := range []*DirectionPolicy{&p.Ingress, &p.Egress} {
			name := fmt.Sprintf("%s-%s", matrixPods[i].name, Direction(d))
			if dp.Isolated {
				dp.Sources = []Origin{{UID: "uid-" + name, Kind: "PolicyEndpoint", Namespace: "ns", Name: name, Index: -1}}
			}
			dp.Admin, dp.Baseline = slices.Clone(dp.Admin), slices.Clone(dp.Baseline)
			for r := range dp.Admin {
				dp.Admin[r].Origin = Origin{UID: "uid-admin", Kind: "ClusterPolicyEndpoint", Name: "admin-" + name, Index: r}
			}
			for r := range dp.Baseline {
				dp.Baseline[r].Origin = Origin{UID: "uid-baseline", Kind: "ClusterPolicyEndpoint", Name: "baseline-" + name, Index: r}
			}
		}
		out.pods = append(out.pods, &p)
	}
	return out
}

// readTallies is every pod's verdict counters, by interface.
func readTallies(t *testing.T, e *EBPF) map[int]verdictTally {
	t.Helper()
	vc, err := e.Verdicts()
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]verdictTally{}
	for _, c := range vc.Counts {
		if out[c.Ifindex] == nil {
			out[c.Ifindex] = verdictTally{}
		}
		out[c.Ifindex][verdictName(c)] += c.Packets
	}
	return out
}

// TestJudgeMatchesCounters sends the verdict matrix's probes one at a time — each
// scenario's policies with every object and tier rule named, TCP and ICMP, IPv4 and
// IPv6, from and to peers, the node and other pods — and checks that the counter
// each program moved is the one Judge names for the packet (reason, deciding rule
// or objects, commit), and nothing else moved (for a probe to the node, which
// answers it, nothing else in the pod's egress).
func TestJudgeMatchesCounters(t *testing.T) {
	judgeAgainstCounters(t, EBPFOptions{}, matrixScenarios())
}

// TestJudgeMatchesCountersAudit is TestJudgeMatchesCounters with the programs loaded
// in audit mode and with the node egress policy (the pod's packets to its node are
// judged by its egress policy): Judge reads both modes from the loaded programs, so
// a denial it names passes as would_deny and the counter says so.
func TestJudgeMatchesCountersAudit(t *testing.T) {
	scs := matrixScenarios()
	judgeAgainstCounters(t, EBPFOptions{Audit: true, NodeEgress: NodeEgressPolicy}, scs[:min(len(scs), 8)])
}

// judgeAgainstCounters sends the scenarios' probes one by one with programs loaded
// with opts and checks each against Judge.
func judgeAgainstCounters(t *testing.T, opts EBPFOptions, scenarios []matrixScenario) {
	lab := newMatrixLab(t)
	(&trafficLab{node: lab.node}).enterNode(t)
	e := openTestEBPF(t, opts)
	if err := e.SetNodeAddrs(matrixNodeSet); err != nil {
		t.Fatal(err)
	}
	noise := func(name string) bool {
		return name == "ingress ndp" || name == "egress ndp" || name == "ingress arp" || name == "egress arp"
	}
	sent, checked := 0, map[VerdictReason]int{}
	audited, resent := 0, 0
	for si, sc := range scenarios {
		sc = withOrigins(sc)
		for i, pol := range sc.pods {
			var err error
			if pol == nil {
				_, err = e.Remove(lab.hostIfindex[i])
			} else {
				p := *pol
				p.Addrs = []netip.Addr{matrixPods[i].addr(false), matrixPods[i].addr(true)}
				_, err = e.Commit(lab.hostIfindex[i], p)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		for _, batch := range lab.probes(sc) {
			clearConntrack(t, e)
			for n, p := range batch {
				if p.variant != matrixPlain || (p.proto() != ProtocolTCP && !p.icmp()) {
					continue
				}
				// A sample: every scenario, direction, peer and family, fewer ports.
				if (n+si)%3 != 0 && !p.icmp() {
					continue
				}
				passes, judged := lab.judgeProbe(t, e, &p)
				want := map[int]verdictTally{}
				for ifindex, j := range judged {
					d := Ingress
					if p.dir == "egress" || (p.dir == "pod-to-pod" && ifindex == lab.hostIfindex[matrixPodIndex(p.pod)]) {
						d = Egress
					}
					want[ifindex] = verdictTally{verdictName(judgedCount(d, j)): 1}
					checked[j.Reason]++
					if j.Audited {
						audited++
					}
				}
				// send sends the probe and returns the counters that moved. A packet the
				// node's own stack sends meanwhile (an IPv6 multicast listener report,
				// judged by the policy) moves one too: a difference is sent once more,
				// and only one that repeats is Judge's (resending cannot change the
				// verdict: no probe is the reply of another, itself included).
				toNode := p.dir == "egress" && p.peer == matrixNode.name
				send := func() map[int]verdictTally {
					before := readTallies(t, e)
					typ := unix.ETH_P_IP
					if p.key.src.Is6() {
						typ = unix.ETH_P_IPV6
					}
					if err := unix.Sendto(p.sendFD, p.frame(), 0, &unix.SockaddrLinklayer{Ifindex: p.ifindex, Protocol: htons(uint16(typ))}); err != nil && err != unix.ENOBUFS {
						t.Fatal(err)
					}
					sent++
					got := map[int]verdictTally{}
					for deadline := time.Now().Add(time.Second); ; {
						after := readTallies(t, e)
						done := true
						for ifindex := range maps.Keys(after) {
							got[ifindex] = after[ifindex].sub(before[ifindex])
							maps.DeleteFunc(got[ifindex], func(k string, _ uint64) bool {
								// The node answers a probe sent to it: only the probe's own
								// egress counter is the probe's.
								return noise(k) || (toNode && !strings.HasPrefix(k, "egress "))
							})
							if len(got[ifindex]) == 0 {
								delete(got, ifindex)
							}
						}
						for ifindex, w := range want {
							for k, v := range w {
								if got[ifindex][k] < v {
									done = false
								}
							}
						}
						if done || time.Now().After(deadline) {
							return got
						}
						time.Sleep(time.Millisecond)
					}
				}
				if got := send(); fmt.Sprint(got) != fmt.Sprint(want) {
					again := send()
					if fmt.Sprint(again) != fmt.Sprint(want) {
						t.Errorf("%s: %s %s→%s %v %d (judged passes=%v): counters moved %v, then %v; Judge named %v",
							sc.name, p.dir, p.key.src, p.key.dst, p.key.proto, p.key.dport, passes, got, again, want)
					} else {
						resent++
					}
				}
			}
			lab.drain(t, nil)
		}
	}
	t.Logf("%d probes sent one by one (%d again after a stray count); judged by reason: %v; audited %d", sent, resent, checked, audited)
	if opts.Audit {
		if audited == 0 {
			t.Error("no probe was judged a would-be denial in audit mode")
		}
		return
	}
	for _, r := range []VerdictReason{ReasonNoPolicy, ReasonAllow, ReasonDefaultAllow, ReasonAdminAccept, ReasonAdminDeny,
		ReasonBaselineAccept, ReasonBaselineDeny, ReasonDefaultDeny, ReasonNode} {
		if checked[r] == 0 {
			t.Errorf("no probe was judged %s: the test proves less than it claims", r)
		}
	}
}

func (p *matrixProbe) proto() Protocol { return p.key.proto }

func (p *matrixProbe) icmp() bool {
	return p.key.proto == ProtocolICMP || p.key.proto == ProtocolICMPv6
}

// BenchmarkJudge: one `explain verdict` check against a pod whose ingress holds
// 10,000 entries, allowed by one and denied by default: the syscalls of the lookups
// (slot, trie, node set on a denial, modes) under the commit lock.
func BenchmarkJudge(b *testing.B) {
	e := openTestEBPF(b, EBPFOptions{})
	ifindex := dummyInterface(b)
	if _, err := e.Commit(ifindex, widePolicy(10000, 80)); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		port   uint16
		reason VerdictReason
	}{{"allowed", 80, ReasonAllow}, {"default-deny", 81, ReasonDefaultDeny}} {
		b.Run(c.name, func(b *testing.B) {
			p := Probe{Ifindex: ifindex, Direction: Ingress, Src: netip.MustParseAddr("10.0.39.15"), Dst: netip.MustParseAddr("10.200.0.1"),
				Proto: ProtocolTCP, Port: c.port}
			b.ReportAllocs()
			for b.Loop() {
				j, err := e.Judge(p)
				if err != nil || j.Reason != c.reason {
					b.Fatalf("%+v, %v", j, err)
				}
			}
		})
	}
}

// TestJudgeAfterRestart: a new process judges from the pinned state it adopted —
// the same verdict and reason — but cannot name the objects of a commit it did not
// make (Attributed false) until the policy is committed again (an unchanged
// re-commit writes nothing and restores the attribution); an interface without
// state is unmanaged.
func TestJudgeAfterRestart(t *testing.T) {
	pin := testPinPath(t)
	e := openTestEBPF(t, EBPFOptions{PinPath: pin})
	ifindex := dummyInterface(t)
	web := Origin{UID: "u", Kind: "PolicyEndpoint", Namespace: "ns", Name: "web", Index: -1}
	pol := widePolicy(3, 80)
	pol.Ingress.Sources = []Origin{web}
	if _, err := e.Commit(ifindex, pol); err != nil {
		t.Fatal(err)
	}
	probe := Probe{Ifindex: ifindex, Direction: Ingress, Src: netip.MustParseAddr("10.0.0.2"), Dst: netip.MustParseAddr("10.9.0.1"), Proto: ProtocolTCP, Port: 81}
	check := func(e *EBPF, attributed bool) {
		t.Helper()
		j, err := e.Judge(probe)
		if err != nil || !j.Managed || j.Reason != ReasonDefaultDeny || j.Passes() || j.Attributed != attributed ||
			(attributed && (len(j.Sources) != 1 || j.Sources[0] != web)) || (!attributed && len(j.Sources) != 0) {
			t.Fatalf("judged %+v, %v; want default deny, attributed %v", j, err, attributed)
		}
	}
	check(e, true)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e2 := openTestEBPF(t, EBPFOptions{PinPath: pin})
	check(e2, false)
	if res, err := e2.Commit(ifindex, pol); err != nil || !res.Skipped {
		t.Fatalf("unchanged re-commit: %+v, %v; want skipped", res, err)
	}
	check(e2, true)
	if j, err := e2.Judge(Probe{Ifindex: ifindex + 1000, Direction: Egress, Src: probe.Dst, Dst: probe.Src, Proto: ProtocolUDP, Port: 53}); err != nil || j.Managed || !j.Passes() {
		t.Fatalf("no state: %+v, %v; want unmanaged", j, err)
	}
}
