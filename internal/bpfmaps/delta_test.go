package bpfmaps

import (
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cilium/ebpf"
)

// widePod is a random pod policy with up to 40 extra single-address rules per
// direction, so that a small change touches few of many entries.
func (g *policyGen) widePod() PodPolicy {
	p := g.pod()
	for _, d := range []*DirectionPolicy{&p.Ingress, &p.Egress} {
		for range g.rnd.IntN(40) {
			a := g.addr(g.family())
			d.Allow = append(d.Allow, Rule{CIDR: netip.PrefixFrom(a, a.BitLen()), Ports: g.ports()})
		}
	}
	return p
}

func cloneDirection(d DirectionPolicy) DirectionPolicy {
	d.Allow = slices.Clone(d.Allow)
	d.Admin = slices.Clone(d.Admin)
	d.Baseline = slices.Clone(d.Baseline)
	return d
}

// mutate returns p with a small change (a rule added, removed or given other ports,
// admin rules added, isolation flipped) or, one time in six, a new random policy.
// p is not modified.
func (g *policyGen) mutate(p PodPolicy) PodPolicy {
	if g.rnd.IntN(6) == 0 {
		return g.widePod()
	}
	q := PodPolicy{Ingress: cloneDirection(p.Ingress), Egress: cloneDirection(p.Egress)}
	d := &q.Ingress
	if g.rnd.IntN(2) == 0 {
		d = &q.Egress
	}
	switch g.rnd.IntN(7) {
	case 0, 1:
		d.Allow = append(d.Allow, g.rule(g.family()))
	case 2, 3:
		if len(d.Allow) > 0 {
			i := g.rnd.IntN(len(d.Allow))
			d.Allow = slices.Delete(d.Allow, i, i+1)
		}
	case 4:
		if len(d.Allow) > 0 {
			d.Allow[g.rnd.IntN(len(d.Allow))].Ports = g.ports()
		}
	case 5:
		d.Admin = append(d.Admin, g.tier()...)
	case 6:
		d.Isolated = !d.Isolated
	}
	return q
}

// commitKinds counts how commits were written.
type commitKinds struct{ delta, full, skipped int }

func (k *commitKinds) add(res CommitResult) {
	switch {
	case res.Skipped:
		k.skipped++
	case res.Delta:
		k.delta++
	default:
		k.full++
	}
}

// requireMix fails unless both kinds of commit were exercised often enough.
func (k *commitKinds) requireMix(t *testing.T, n int) {
	t.Helper()
	t.Logf("%d commits: %d delta, %d full, %d skipped", n, k.delta, k.full, k.skipped)
	if k.delta < n/4 || k.full < n/20 {
		t.Fatalf("too few delta (%d) or full (%d) commits of %d to prove anything", k.delta, k.full, n)
	}
}

// setEntries lists the entries (untagged, in compile order) an entry set holds in
// the in-memory maps.
func (s *memoryMaps) setEntries(ifindex uint32, d Direction, set uint32) dirEntries {
	var t readEntries
	for k, v := range s.v4[d] {
		if k.Ifindex == ifindex && tagSet(k.Tag) == set {
			t.k4, t.v4 = append(t.k4, k), append(t.v4, v)
		}
	}
	for k, v := range s.v6[d] {
		if k.Ifindex == ifindex && tagSet(k.Tag) == set {
			t.k6, t.v6 = append(t.k6, k), append(t.v6, v)
		}
	}
	return entriesFromTrie(t.k4, t.v4, t.k6, t.v6)
}

// checkSets checks what a pod's entry sets hold against the core's record: the
// active set the committed entries, the inactive set the same when level, else none.
func checkSets(t *testing.T, rec *podRecord, held func(d Direction, set uint32) dirEntries) {
	t.Helper()
	for d := range rec.dirs {
		dr := &rec.dirs[d]
		active := wordSet(rec.state.Dir[d])
		if got := held(Direction(d), active); !got.equal(&dr.entries) {
			t.Fatalf("%s: active set holds %d entries, not the %d committed", Direction(d), got.len(), dr.entries.len())
		}
		got := held(Direction(d), active^1)
		if dr.level && !got.equal(&dr.entries) || !dr.level && got.len() != 0 {
			t.Fatalf("%s: inactive set (level %v) holds %d entries, %d committed", Direction(d), dr.level, got.len(), dr.entries.len())
		}
	}
}

// TestDeltaCommitsMatchVerdict: random sequences of small changes and whole new
// policies, committed to the in-memory backend: after every commit each random packet
// gets the verdict Verdict gives for the new policy, the entry sets hold what the
// record says, and the capacity accounting counts what the maps hold.
func TestDeltaCommitsMatchVerdict(t *testing.T) {
	g := newPolicyGen(11)
	m := NewMemory()
	const pods, steps, packets = 3, 600, 60
	pols := make([]PodPolicy, pods)
	var kinds commitKinds
	sharedSeen := 0
	for step := range steps {
		i := step % pods
		ifindex := i + 1
		switch {
		case step < pods:
			pols[i] = g.widePod()
		case g.rnd.IntN(15) == 0:
			pols[i] = pols[(i+1)%pods] // another pod's policy: its compile is shared
		default:
			pols[i] = g.mutate(pols[i])
		}
		res, err := m.Commit(ifindex, pols[i])
		if err != nil {
			t.Fatalf("step %d: commit: %v", step, err)
		}
		kinds.add(res)
		for range packets {
			pkt := g.packet()
			for _, d := range []Direction{Ingress, Egress} {
				if got, want := m.Verdict(ifindex, d, pkt.peer, pkt.proto, pkt.port), referenceVerdict(pols[i], d, pkt); got != want {
					t.Fatalf("step %d (%+v) pod %d %s %v %v/%d: verdict %v, Verdict %v", step, res, ifindex, d, pkt.peer, pkt.proto, pkt.port, got, want)
				}
			}
		}
		checkSets(t, m.pods[uint32(ifindex)], func(d Direction, set uint32) dirEntries {
			return m.maps.setEntries(uint32(ifindex), d, set)
		})
		for d := range 2 {
			if n := m.entryCount(Direction(d)); n != m.used[d][0]+m.used[d][1] {
				t.Fatalf("step %d: %s maps hold %d entries, accounted %d", step, Direction(d), n, m.used[d][0]+m.used[d][1])
			}
		}
		if checkShared(t, m.core) > 1 {
			sharedSeen++
		}
	}
	kinds.requireMix(t, steps)
	if sharedSeen < steps/20 {
		t.Fatalf("a compile was shared after only %d of %d commits", sharedSeen, steps)
	}
	for i := range pods {
		if _, err := m.Remove(i + 1); err != nil {
			t.Fatal(err)
		}
	}
	if n := m.entryCount(Ingress) + m.entryCount(Egress); n != 0 {
		t.Fatalf("after removing every pod %d entries remain", n)
	}
	if len(m.shared) != 0 {
		t.Fatalf("%d shared compiles left after removing every pod", len(m.shared))
	}
}

// checkShared checks the shared compiles: each is held by as many directions as it
// counts, under its hash, and each direction holds the one of its committed hash.
// It returns the most directions holding one.
func checkShared(t *testing.T, c *core) (most int) {
	t.Helper()
	refs := map[*sharedDirection]int{}
	for ifindex, rec := range c.pods {
		for d := range rec.dirs {
			s := rec.dirs[d].shared
			if s == nil {
				continue
			}
			if s.hash != rec.state.Hash[d] || c.shared[s.hash] != s {
				t.Fatalf("pod %d %s holds a shared compile of another hash or not in the cache", ifindex, Direction(d))
			}
			refs[s]++
		}
	}
	for h, s := range c.shared {
		if s.hash != h || s.refs != refs[s] {
			t.Fatalf("shared compile %x: hash %x, %d refs, held %d times", h, s.hash, s.refs, refs[s])
		}
		most = max(most, s.refs)
	}
	return most
}

// TestCompiledEntriesInCompileOrder: the difference between two commits is one merge
// of sorted keys; that needs compileDirection to emit them in compareKey order.
func TestCompiledEntriesInCompileOrder(t *testing.T) {
	g := newPolicyGen(5)
	for range 500 {
		d := g.widePod().Ingress
		ns, admin, baseline, err := validateDirection(Ingress, &d)
		if err != nil {
			t.Fatal(err)
		}
		comp, err := compileDirection(ns, admin, baseline, d.Isolated)
		if err != nil {
			continue // too many ports for one value: rejected anyway
		}
		e := comp.Entries
		if !slices.IsSortedFunc(e.k4, func(a, b policyLpmKey4) int { return compareKey4(&a, &b) }) ||
			!slices.IsSortedFunc(e.k6, func(a, b policyLpmKey6) int { return compareKey6(&a, &b) }) {
			t.Fatalf("compiled entries out of order: %+v", d)
		}
	}
}

// kernelSetEntries lists the entries an entry set of a pod holds in the kernel tries.
func (e *EBPF) kernelSetEntries(t testing.TB, ifindex uint32, d Direction, set uint32) dirEntries {
	t.Helper()
	var r readEntries
	t4, t6 := (&ebpfMaps{policyObjects: &e.objs}).tries(d)
	var v policyRuleValue
	var k4 policyLpmKey4
	it := t4.Iterate()
	for it.Next(&k4, &v) {
		if k4.Ifindex == ifindex && k4.Tag&tagSets != 0 && tagSet(k4.Tag) == set {
			r.k4, r.v4 = append(r.k4, k4), append(r.v4, v)
		}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	var k6 policyLpmKey6
	it = t6.Iterate()
	for it.Next(&k6, &v) {
		if k6.Ifindex == ifindex && k6.Tag&tagSets != 0 && tagSet(k6.Tag) == set {
			r.k6, r.v6 = append(r.k6, k6), append(r.v6, v)
		}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return entriesFromTrie(r.k4, r.v4, r.k6, r.v6)
}

// racer runs packets through the programs from another goroutine while a commit
// runs, and records every verdict that is neither the old policy's nor the new one's.
type racer struct {
	stop  atomic.Bool
	wg    sync.WaitGroup
	runs  int
	wrong []string
	err   error
}

type racePacket struct {
	prog      *ebpf.Program
	data      []byte
	old, next bool
	what      string
}

func (r *racer) start(ifindex int, pkts []racePacket) {
	r.stop.Store(false)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for !r.stop.Load() {
			for i := range pkts {
				p := &pkts[i]
				ret, err := p.prog.Run(&ebpf.RunOptions{Data: p.data, Context: skbContext{Ifindex: uint32(ifindex)}})
				if err != nil {
					r.err = err
					return
				}
				r.runs++
				if got := ret != verdictDrop; got != p.old && got != p.next {
					r.wrong = append(r.wrong, p.what)
				}
			}
		}
	}()
}

func (r *racer) finish() {
	r.stop.Store(true)
	r.wg.Wait()
}

// TestKernelDeltaCommitsRaceLookups: random sequences of delta and full commits to
// the kernel. While each commit runs, another goroutine runs packets through the
// programs (BPF_PROG_TEST_RUN), and after each of the commit's map writes the test
// runs them too: each verdict must be the old policy's or the new one's. After each commit every packet gets the new policy's verdict and the entry
// sets hold what the record says.
func TestKernelDeltaCommitsRaceLookups(t *testing.T) {
	e := openTestEBPF(t, EBPFOptions{})
	ifindex := dummyInterface(t)
	g := newPolicyGen(13)
	steps, packets := 400, 24
	if testing.Short() {
		steps = 80
	}
	var kinds commitKinds
	var r racer
	pol := g.widePod()
	if _, err := e.Commit(ifindex, pol); err != nil {
		t.Fatal(err)
	}
	for step := range steps {
		next := g.mutate(pol)
		var pkts []racePacket
		var plain []packet
		for range packets {
			pkt := g.packet()
			plain = append(plain, pkt)
			for _, d := range []Direction{Ingress, Egress} {
				rp := racePacket{old: referenceVerdict(pol, d, pkt), next: referenceVerdict(next, d, pkt), what: d.String() + " " + pkt.peer.String()}
				if d == Ingress {
					pod := podAddrIngress4
					if pkt.peer.Is6() {
						pod = podAddrIngress6
					}
					rp.prog, rp.data = e.objs.ToPod, packetBytes(pkt.peer, pod, pkt.proto, uint16(20000+step), pkt.port)
				} else {
					pod := podAddrEgress4
					if pkt.peer.Is6() {
						pod = podAddrEgress6
					}
					rp.prog, rp.data = e.objs.FromPod, packetBytes(pod, pkt.peer, pkt.proto, uint16(20000+step), pkt.port)
				}
				pkts = append(pkts, rp)
			}
		}
		steps := 0
		e.afterWrite = func() {
			// Every intermediate state of the maps decides as one of the policies.
			steps++
			for i := range pkts {
				p := &pkts[i]
				if got := run(t, p.prog, ifindex, p.data); got != p.old && got != p.next {
					t.Errorf("step %d, after map write %d: %s: verdict %v, neither the old policy's nor the new one's", step, steps, p.what, got)
				}
			}
		}
		r.start(ifindex, pkts)
		res, err := e.Commit(ifindex, next)
		r.finish()
		e.afterWrite = nil
		if t.Failed() {
			t.FailNow()
		}
		if err != nil {
			t.Fatalf("step %d: commit: %v", step, err)
		}
		if r.err != nil {
			t.Fatalf("step %d: BPF_PROG_TEST_RUN: %v", step, r.err)
		}
		if len(r.wrong) > 0 {
			t.Fatalf("step %d (%+v): racing lookups saw neither the old nor the new verdict: %v", step, res, r.wrong)
		}
		kinds.add(res)
		pol = next
		for _, pkt := range plain {
			for _, d := range []Direction{Ingress, Egress} {
				if got, want := e.kernelVerdict(t, ifindex, d, pkt), referenceVerdict(pol, d, pkt); got != want {
					t.Fatalf("step %d (%+v) %s %v %v/%d: kernel verdict %v, Verdict %v", step, res, d, pkt.peer, pkt.proto, pkt.port, got, want)
				}
			}
		}
		checkSets(t, e.pods[uint32(ifindex)], func(d Direction, set uint32) dirEntries {
			return e.kernelSetEntries(t, uint32(ifindex), d, set)
		})
	}
	t.Logf("%d racing packet runs", r.runs)
	kinds.requireMix(t, steps)
	if _, err := e.Remove(ifindex); err != nil {
		t.Fatal(err)
	}
	if n := trieEntries(t, e); n != 0 {
		t.Fatalf("%d trie entries left after removing the pod", n)
	}
}
