package bpfmaps

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"
)

// TestReplicasShareEntries (finding 9 of the hardening issue): replicas of one
// tenant's ~16k-peer policy hold its entries once, so they fit a trie that holds
// about one copy and leave the rest to other tenants. Before entry groups every pod
// held its own copy: the second replica failed with ErrCapacity (and a few filled
// the node's tries).
func TestReplicasShareEntries(t *testing.T) {
	const peers, replicas = 16000, 6
	m := NewMemoryWithLimits(Limits{EntriesV4: 20000})
	tenant := widePolicy(peers, 80)
	for i := 1; i <= replicas; i++ {
		res, err := m.Commit(i, tenant)
		if err != nil {
			t.Fatalf("replica %d: %v", i, err)
		}
		if i > 1 && (!res.Shared || res.EntriesWritten != 0) {
			t.Fatalf("replica %d: %+v, want its entries found held (Shared, nothing written)", i, res)
		}
	}
	if n := m.entryCount(Ingress); n != peers {
		t.Fatalf("%d replicas hold %d ingress entries, want one copy (%d)", replicas, n, peers)
	}
	// Another tenant still fits.
	if _, err := m.Commit(100, widePolicy(3000, 443)); err != nil {
		t.Fatalf("another tenant's pod: %v", err)
	}
	checkGroups(t, m.core, m.maps.setEntries)
}

// TestSharedGroupSplitsAndJoins: pods sharing a group diverge and converge again; at
// every step each pod decides by its own policy, the maps hold what the groups record,
// and once every pod holds the same policy again one group (two level sets at most)
// holds it.
func TestSharedGroupSplitsAndJoins(t *testing.T) {
	m := NewMemory()
	g := newPolicyGen(31)
	const pods = 5
	pols := make([]PodPolicy, pods+1)
	check := func(what string) {
		t.Helper()
		checkGroups(t, m.core, m.maps.setEntries)
		for i := 1; i <= pods; i++ {
			for range 40 {
				pkt := g.packet()
				for _, d := range []Direction{Ingress, Egress} {
					if got, want := m.Verdict(i, d, pkt.peer, pkt.proto, pkt.port), referenceVerdict(pols[i], d, pkt); got != want {
						t.Fatalf("%s: pod %d %s %v %v/%d: verdict %v, want %v", what, i, d, pkt.peer, pkt.proto, pkt.port, got, want)
					}
				}
			}
		}
	}
	commit := func(i int, p PodPolicy) CommitResult {
		t.Helper()
		pols[i] = p
		res, err := m.Commit(i, p)
		if err != nil {
			t.Fatalf("pod %d: %v", i, err)
		}
		return res
	}
	base := widePolicy(300, 80)
	for i := 1; i <= pods; i++ {
		commit(i, base)
	}
	check("all on one policy")
	one := m.entryCount(Ingress) + m.entryCount(Egress)
	// One pod at a time moves to a changed policy (as reconcile commits a changed
	// object's pods): the first writes the group's free set, the others find it, the
	// last levels the set all left.
	next := withHost(base, 1)
	for i := 1; i <= pods; i++ {
		res := commit(i, next)
		if i > 1 && !res.Shared {
			t.Fatalf("pod %d: %+v, want the set pod 1 wrote found", i, res)
		}
		check(fmt.Sprintf("pod %d of %d moved", i, pods))
	}
	if n := m.entryCount(Ingress) + m.entryCount(Egress); n > 2*one+2*len(next.Ingress.Allow)+2*len(next.Egress.Allow) {
		t.Fatalf("after all pods moved the tries hold %d entries, one copy was %d", n, one)
	}
	// Split: every pod its own policy; then all join again.
	for i := 1; i <= pods; i++ {
		commit(i, withHost(next, byte(10+i)))
		check(fmt.Sprintf("pod %d split off", i))
	}
	for i := 1; i <= pods; i++ {
		commit(i, base)
		check(fmt.Sprintf("pod %d joined", i))
	}
	if got := len(m.groups[Ingress].byID); got != 1 {
		t.Fatalf("all pods on one policy again: %d ingress groups, want 1", got)
	}
	for i := 1; i <= pods; i++ {
		if _, err := m.Remove(i); err != nil {
			t.Fatal(err)
		}
		pols[i] = PodPolicy{} // no state: allows all
		check(fmt.Sprintf("pod %d removed", i))
	}
	if n := m.entryCount(Ingress) + m.entryCount(Egress); n != 0 || len(m.groups[Ingress].byID)+len(m.groups[Egress].byID) != 0 {
		t.Fatalf("after removing every pod: %d entries, %d groups left", n, len(m.groups[Ingress].byID)+len(m.groups[Egress].byID))
	}
}

// TestSharedGroupRollback: a write that fails anywhere while three pods of a group
// move to a new policy one by one (into the set no pod names; bringing the set they
// left level) leaves every pod deciding by the policy its last successful commit
// made, and the group records true: a failed write drops a set no pod names, never
// one a pod names. The pods then all reach the new policy.
func TestSharedGroupRollback(t *testing.T) {
	g := newPolicyGen(41)
	base := widePolicy(5000, 80) // more than writeChunk: several writes per set
	next := withHost(base, 9)
	for fail := 1; ; fail++ {
		mem := NewMemory()
		fs := &failingStore{memoryMaps: mem.maps}
		mem.core = newCore(Limits{}, fs)
		pols := map[int]PodPolicy{}
		for i := 1; i <= 3; i++ {
			if _, err := mem.Commit(i, base); err != nil {
				t.Fatal(err)
			}
			pols[i] = base
		}
		fs.failAt = fs.writes + fail
		failed := false
		for i := 1; i <= 3; i++ {
			_, err := mem.Commit(i, next)
			switch {
			case err == nil:
				pols[i] = next
			case errors.Is(err, errInjected):
				failed = true
			default:
				t.Fatalf("write %d: pod %d: %v", fail, i, err)
			}
		}
		if !failed && fs.writes < fs.failAt {
			if fail < 4 {
				t.Fatalf("the pods' moves made only %d writes", fs.writes)
			}
			t.Logf("each of %d writes failed once", fail-1)
			return
		}
		check := func(what string) {
			t.Helper()
			checkGroups(t, mem.core, mem.maps.setEntries)
			for i := 1; i <= 3; i++ {
				for range 40 {
					pkt := g.packet()
					if got, want := mem.Verdict(i, Ingress, pkt.peer, pkt.proto, pkt.port), referenceVerdict(pols[i], Ingress, pkt); got != want {
						t.Fatalf("write %d failed, %s: pod %d %v %v/%d: verdict %v, want %v", fail, what, i, pkt.peer, pkt.proto, pkt.port, got, want)
					}
				}
			}
		}
		check("after the moves")
		for i := 1; i <= 3; i++ {
			if _, err := mem.Commit(i, next); err != nil {
				t.Fatal(err)
			}
			pols[i] = next
		}
		check("after committing again")
	}
}

// withHost returns p with one more ingress allow rule, for host 10.9.9.last.
func withHost(p PodPolicy, last byte) PodPolicy {
	p.Ingress = cloneDirection(p.Ingress)
	p.Ingress.Allow = append(p.Ingress.Allow, Rule{CIDR: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 9, 9, last}), 32)})
	return p
}

var errInjected = errors.New("injected write failure")

// failingStore is the in-memory maps with a write (an entry write or delete) that
// fails, for rollback tests of pure logic.
type failingStore struct {
	*memoryMaps
	writes, failAt int
}

func (f *failingStore) fail() bool {
	f.writes++
	return f.writes == f.failAt
}

func (f *failingStore) writeEntries(d Direction, k4 []policyLpmKey4, v4 []policyRuleValue, k6 []policyLpmKey6, v6 []policyRuleValue) error {
	if f.fail() {
		return errInjected
	}
	return f.memoryMaps.writeEntries(d, k4, v4, k6, v6)
}

func (f *failingStore) deleteEntries(d Direction, k4 []policyLpmKey4, k6 []policyLpmKey6) error {
	if f.fail() {
		return errInjected
	}
	return f.memoryMaps.deleteEntries(d, k4, k6)
}

// TestKernelReplicasShareEntries: in the kernel tries, ten pods with one 10k-peer
// policy hold one copy, and each pod's programs decide by it.
func TestKernelReplicasShareEntries(t *testing.T) {
	e := openTestEBPF(t, EBPFOptions{})
	const peers, pods = 10000, 10
	pol := widePolicy(peers, 80)
	var ifs []int
	for range pods {
		ifindex := dummyInterface(t)
		ifs = append(ifs, ifindex)
		if _, err := e.Commit(ifindex, pol); err != nil {
			t.Fatal(err)
		}
	}
	if n := trieEntries(t, e); n != peers {
		t.Fatalf("%d pods with one %d-peer policy: %d trie entries, want one copy", pods, peers, n)
	}
	g := newPolicyGen(51)
	for _, ifindex := range ifs {
		for range 20 {
			pkt := g.packet()
			if got, want := e.kernelVerdict(t, ifindex, Ingress, pkt), referenceVerdict(pol, Ingress, pkt); got != want {
				t.Fatalf("pod %d %v %v/%d: verdict %v, want %v", ifindex, pkt.peer, pkt.proto, pkt.port, got, want)
			}
		}
	}
	checkGroups(t, e.core, func(d Direction, group, set uint32) dirEntries { return e.kernelSetEntries(t, d, group, set) })
}

// TestKernelSharedGroupsRaceLookups: three pods move between shared and own policies
// at random (another pod's policy, or a change of their own), one commit at a time.
// After each map write of a commit, every pod's programs decide each packet by the
// pod's old or new policy — a pod that is not being committed by its one policy,
// whatever is written into the group sets it shares or left — and packets racing
// the committing pod's commit from another goroutine too. After each commit the
// groups hold what their records say.
func TestKernelSharedGroupsRaceLookups(t *testing.T) {
	e := openTestEBPF(t, EBPFOptions{})
	const pods = 3
	g := newPolicyGen(61)
	steps, packets := 240, 12
	if testing.Short() {
		steps = 60
	}
	ifs := make([]int, pods)
	pols := make([]PodPolicy, pods)
	for i := range ifs {
		ifs[i] = dummyInterface(t)
		pols[i] = g.widePod()
		if _, err := e.Commit(ifs[i], pols[i]); err != nil {
			t.Fatal(err)
		}
	}
	racePackets := func(i int, old, next PodPolicy, sport uint16) []racePacket {
		var out []racePacket
		for range packets {
			pkt := g.packet()
			for _, d := range []Direction{Ingress, Egress} {
				rp := racePacket{old: referenceVerdict(old, d, pkt), next: referenceVerdict(next, d, pkt), what: fmt.Sprintf("pod %d %s %v", i, d, pkt.peer)}
				if d == Ingress {
					pod := podAddrIngress4
					if pkt.peer.Is6() {
						pod = podAddrIngress6
					}
					rp.prog, rp.data = e.objs.ToPod, packetBytes(pkt.peer, pod, pkt.proto, sport, pkt.port)
				} else {
					pod := podAddrEgress4
					if pkt.peer.Is6() {
						pod = podAddrEgress6
					}
					rp.prog, rp.data = e.objs.FromPod, packetBytes(pod, pkt.peer, pkt.proto, sport, pkt.port)
				}
				out = append(out, rp)
			}
		}
		return out
	}
	var r racer
	shared := 0
	for step := range steps {
		i := g.rnd.IntN(pods)
		var next PodPolicy
		if j := g.rnd.IntN(pods); j != i && g.rnd.IntN(2) == 0 {
			next = pols[j]
		} else {
			next = g.mutate(pols[i])
		}
		all := make([][]racePacket, pods)
		for k := range pods {
			nk := pols[k]
			if k == i {
				nk = next
			}
			all[k] = racePackets(k, pols[k], nk, uint16(20000+step))
		}
		writes := 0
		e.afterWrite = func() {
			writes++
			for k := range pods {
				for _, p := range all[k] {
					if got := run(t, p.prog, ifs[k], p.data); got != p.old && got != p.next {
						t.Errorf("step %d (pod %d commits), after map write %d: %s: verdict %v, neither its old policy's nor its new one's", step, i, writes, p.what, got)
					}
				}
			}
		}
		r.start(ifs[i], all[i])
		res, err := e.Commit(ifs[i], next)
		r.finish()
		e.afterWrite = nil
		if t.Failed() {
			t.FailNow()
		}
		if err != nil {
			t.Fatalf("step %d: commit: %v", step, err)
		}
		if r.err != nil || len(r.wrong) > 0 {
			t.Fatalf("step %d (%+v): racing lookups: %v %v", step, res, r.err, r.wrong)
		}
		if res.Shared {
			shared++
		}
		pols[i] = next
		checkGroups(t, e.core, func(d Direction, group, set uint32) dirEntries { return e.kernelSetEntries(t, d, group, set) })
	}
	t.Logf("%d commits, %d found their entries held; %d racing packet runs", steps, shared, r.runs)
	if shared < steps/10 {
		t.Fatalf("only %d of %d commits shared entries: too few to prove anything", shared, steps)
	}
}
