package bpfmaps

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
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

// setEntries lists the entries (untagged, in compile order) an entry set of a group
// holds in the in-memory maps.
func (s *memoryMaps) setEntries(d Direction, group, set uint32) dirEntries {
	var t readEntries
	for k, v := range s.v4[d] {
		if k.Group == group && tagSet(k.Tag) == set {
			t.k4, t.v4 = append(t.k4, k), append(t.v4, v)
		}
	}
	for k, v := range s.v6[d] {
		if k.Group == group && tagSet(k.Tag) == set {
			t.k6, t.v6 = append(t.k6, k), append(t.v6, v)
		}
	}
	return entriesFromTrie(t.k4, t.v4, t.k6, t.v6)
}

// isLevel reports whether the group set a pod's direction names has its group's other
// set level with it (a change is then written as a difference).
func isLevel(rec *podRecord, d Direction) bool {
	r := rec.dirs[d].ref
	return r.g != nil && r.other().held().entries.len() > 0 && r.other().held().entries.equal(&r.held().entries)
}

// checkGroups checks the entry groups against the maps and the pods: every set holds
// what its record says; it is named by as many pod directions as it counts; a set no
// pod names is level with its group's other set or empty; every group is named by
// some pod; a pod's direction names a set holding its committed compile's entries;
// and a content is held by one set that byHash finds.
func checkGroups(t *testing.T, c *core, held func(d Direction, group, set uint32) dirEntries) {
	t.Helper()
	for d := range c.groups {
		gs := &c.groups[d]
		refs := map[groupRef]int{}
		for ifindex, rec := range c.pods {
			r := rec.dirs[d].ref
			if slot := rec.state.Group[d][wordSet(rec.state.Dir[d])]; slot != r.slot() {
				t.Fatalf("pod %d %s: its word names group slot %#x, the record %#x", ifindex, Direction(d), slot, r.slot())
			}
			if r.g == nil {
				if s := rec.dirs[d].shared; s != nil && s.comp.Entries.len() != 0 {
					t.Fatalf("pod %d %s names no group but its compile has %d entries", ifindex, Direction(d), s.comp.Entries.len())
				}
				continue
			}
			if gs.byID[r.g.id] != r.g {
				t.Fatalf("pod %d %s names group %d, which is not recorded", ifindex, Direction(d), r.g.id)
			}
			refs[r]++
			if s := rec.dirs[d].shared; s != nil && !s.comp.Entries.equal(&r.held().entries) {
				t.Fatalf("pod %d %s: its set holds %d entries, its compile %d", ifindex, Direction(d), r.held().entries.len(), s.comp.Entries.len())
			}
			if h := r.held().hash; h != rec.state.Hash[d] {
				t.Fatalf("pod %d %s: its set holds content %x, the pod %x", ifindex, Direction(d), h, rec.state.Hash[d])
			}
		}
		for id, g := range gs.byID {
			if g.sets[0].refs+g.sets[1].refs == 0 {
				t.Fatalf("%s group %d: no pod names it", Direction(d), id)
			}
			for set := range g.sets {
				r := groupRef{g, uint32(set)}
				s := r.held()
				if got := held(Direction(d), id, uint32(set)); !got.equal(&s.entries) {
					t.Fatalf("%s group %d set %d holds %d entries, its record %d", Direction(d), id, set, got.len(), s.entries.len())
				}
				if s.refs != refs[r] {
					t.Fatalf("%s group %d set %d: %d refs, named %d times", Direction(d), id, set, s.refs, refs[r])
				}
				if o := r.other().held(); s.refs == 0 && s.entries.len() != 0 && !s.entries.equal(&o.entries) {
					t.Fatalf("%s group %d set %d: named by no pod, holds %d entries, not level with the other set's %d", Direction(d), id, set, s.entries.len(), o.entries.len())
				}
				if s.refs > 0 {
					if f, ok := gs.holding(s.hash); !ok || f.held().hash != s.hash {
						t.Fatalf("%s group %d set %d: content %x not found by hash", Direction(d), id, set, s.hash)
					}
				}
			}
		}
		for h, r := range gs.byHash {
			if r.held().hash != h || gs.byID[r.g.id] != r.g {
				t.Fatalf("%s: content %x found in group %d set %d, which holds %x", Direction(d), h, r.g.id, r.set, r.held().hash)
			}
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
		checkGroups(t, m.core, m.maps.setEntries)
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

// kernelSetEntries lists the entries an entry set of a group holds in the kernel tries.
func (e *EBPF) kernelSetEntries(t testing.TB, d Direction, group, set uint32) dirEntries {
	t.Helper()
	var r readEntries
	t4, t6 := (&ebpfMaps{policyObjects: &e.objs}).tries(d)
	var v policyRuleValue
	var k4 policyLpmKey4
	it := t4.Iterate()
	for it.Next(&k4, &v) {
		if k4.Group == group && k4.Tag&tagSets != 0 && tagSet(k4.Tag) == set {
			r.k4, r.v4 = append(r.k4, k4), append(r.v4, v)
		}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	var k6 policyLpmKey6
	it = t6.Iterate()
	for it.Next(&k6, &v) {
		if k6.Group == group && k6.Tag&tagSets != 0 && tagSet(k6.Tag) == set {
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
// the kernel, of policies made of rule sets changed mostly as the controller changes
// them (so that many commits are incremental). While each commit runs, another goroutine runs packets through the
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
	incremental := 0
	cur := g.setsPod(t)
	pol := cur.flat()
	if _, err := e.Commit(ifindex, cur.policy()); err != nil {
		t.Fatal(err)
	}
	for step := 0; step < steps; step++ {
		nextSets := g.mutateSets(t, cur)
		next := nextSets.flat()
		if _, err := fullCompile(next.Ingress); err != nil {
			step-- // too many ports for one value: rejected anyway
			continue
		}
		if _, err := fullCompile(next.Egress); err != nil {
			step--
			continue
		}
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
		res, err := e.Commit(ifindex, nextSets.policy())
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
		if res.Incremental {
			incremental++
		}
		pol, cur = next, nextSets
		for _, pkt := range plain {
			for _, d := range []Direction{Ingress, Egress} {
				if got, want := e.kernelVerdict(t, ifindex, d, pkt), referenceVerdict(pol, d, pkt); got != want {
					t.Fatalf("step %d (%+v) %s %v %v/%d: kernel verdict %v, Verdict %v", step, res, d, pkt.peer, pkt.proto, pkt.port, got, want)
				}
			}
		}
		checkGroups(t, e.core, func(d Direction, group, set uint32) dirEntries { return e.kernelSetEntries(t, d, group, set) })
	}
	t.Logf("%d racing packet runs, %d incremental commits", r.runs, incremental)
	kinds.requireMix(t, steps)
	if incremental < steps/8 {
		t.Fatalf("only %d of %d commits incremental", incremental, steps)
	}
	if _, err := e.Remove(ifindex); err != nil {
		t.Fatal(err)
	}
	if n := trieEntries(t, e); n != 0 {
		t.Fatalf("%d trie entries left after removing the pod", n)
	}
}

// setsPod is a pod policy as reconcile builds it: isolation, tiers and some Allow
// rules (base), and per direction one RuleSet per object, each mostly host rules
// (the controller's pod peers) and sometimes a broad rule.
type setsPod struct {
	base PodPolicy
	objs [2][][]Rule
	sets [2][]*RuleSet
}

func (g *policyGen) hostRule() Rule {
	a := g.addr(g.family())
	return Rule{CIDR: netip.PrefixFrom(a, a.BitLen()), Ports: g.ports()}
}

func (g *policyGen) objectRules() []Rule {
	var rs []Rule
	for range g.rnd.IntN(30) {
		rs = append(rs, g.hostRule())
	}
	if g.rnd.IntN(3) == 0 {
		rs = append(rs, g.rule(g.family()))
	}
	return rs
}

func (g *policyGen) setsPod(t testing.TB) *setsPod {
	p := &setsPod{base: g.pod()}
	for d, dp := range []*DirectionPolicy{&p.base.Ingress, &p.base.Egress} {
		if g.rnd.IntN(3) == 0 { // one object alone, as most pods' policies are
			dp.Isolated, dp.Allow, dp.Admin = true, nil, nil
			p.objs[d] = [][]Rule{g.objectRules()}
			continue
		}
		for range g.rnd.IntN(4) {
			p.objs[d] = append(p.objs[d], g.objectRules())
		}
	}
	p.build(t, nil)
	return p
}

// build makes the sets of p's objects, each from the set of the same place in prev
// (the object's previous version) when there is one.
func (p *setsPod) build(t testing.TB, prev *setsPod) {
	t.Helper()
	for d := range p.objs {
		p.sets[d] = make([]*RuleSet, len(p.objs[d]))
		for i, rules := range p.objs[d] {
			var from *RuleSet
			if prev != nil && i < len(prev.sets[d]) {
				from = prev.sets[d][i]
			}
			s, err := NewRuleSet(fmt.Sprintf("object %d", i), Direction(d), rules, from)
			if err != nil {
				t.Fatalf("NewRuleSet: %v", err)
			}
			p.sets[d][i] = s
		}
	}
}

// policy is p as committed: the objects' rules as sets.
func (p *setsPod) policy() PodPolicy {
	q := p.base
	q.Ingress.AllowSets, q.Egress.AllowSets = p.sets[0], p.sets[1]
	return q
}

// flat is p's policy with every rule in Allow: what a full compile and Verdict take
// as the reference.
func (p *setsPod) flat() PodPolicy {
	q := PodPolicy{Ingress: cloneDirection(p.base.Ingress), Egress: cloneDirection(p.base.Egress)}
	for d, dp := range []*DirectionPolicy{&q.Ingress, &q.Egress} {
		for _, rules := range p.objs[d] {
			dp.Allow = append(dp.Allow, rules...)
		}
	}
	return q
}

// mutateSets returns p with a change, mostly the controller's (one object's host
// rules, one to three of them, added, removed or given other ports), else one that
// needs a full compile: a broad rule, an object added or removed, the base changed,
// or a new policy. p is not modified.
func (g *policyGen) mutateSets(t testing.TB, p *setsPod) *setsPod {
	if g.rnd.IntN(12) == 0 {
		return g.setsPod(t)
	}
	q := &setsPod{base: p.base}
	for d := range p.objs {
		q.objs[d] = slices.Clone(p.objs[d])
	}
	d := g.rnd.IntN(2)
	switch k := g.rnd.IntN(10); {
	case k < 7 && len(q.objs[d]) > 0:
		i := g.rnd.IntN(len(q.objs[d]))
		rules := slices.Clone(q.objs[d][i])
		for range 1 + g.rnd.IntN(3) {
			switch g.rnd.IntN(3) {
			case 0:
				rules = append(rules, g.hostRule())
			case 1:
				if len(rules) > 0 {
					j := g.rnd.IntN(len(rules))
					rules = slices.Delete(rules, j, j+1)
				}
			default:
				if len(rules) > 0 {
					j := g.rnd.IntN(len(rules))
					if rules[j].CIDR.Bits() == rules[j].CIDR.Addr().BitLen() && len(rules[j].Except) == 0 {
						rules[j].Ports = g.ports()
					}
				}
			}
		}
		q.objs[d][i] = rules
	case k == 7 && len(q.objs[d]) > 0:
		i := g.rnd.IntN(len(q.objs[d]))
		q.objs[d][i] = append(slices.Clone(q.objs[d][i]), g.rule(g.family()))
	case k == 8:
		if len(q.objs[d]) > 0 && g.rnd.IntN(2) == 0 {
			q.objs[d] = q.objs[d][:len(q.objs[d])-1]
		} else {
			q.objs[d] = append(q.objs[d], g.objectRules())
		}
	default:
		q.base = g.mutate(p.base)
	}
	q.build(t, p)
	return q
}

// fullCompile is the reference: a fresh compile of a direction, as a first commit does.
func fullCompile(d DirectionPolicy) (compiledDirection, error) {
	ns, admin, baseline, err := validateDirection(Ingress, &d)
	if err != nil {
		return compiledDirection{}, err
	}
	return compileDirection(ns, admin, baseline, d.Isolated)
}

// checkFullCompile checks that a pod's committed entries and flags are a fresh full
// compile's of its policy.
func checkFullCompile(t *testing.T, rec *podRecord, p PodPolicy) {
	t.Helper()
	for d, dp := range []DirectionPolicy{p.Ingress, p.Egress} {
		want, err := fullCompile(dp)
		if err != nil {
			t.Fatalf("%s: full compile: %v", Direction(d), err)
		}
		if got := rec.dirs[d].entries(); !got.equal(&want.Entries) {
			t.Fatalf("%s: committed %d entries, not the full compile's %d", Direction(d), got.len(), want.Entries.len())
		}
		if got := wordFlags(rec.state.Dir[d]); got != want.Flags {
			t.Fatalf("%s: flags %#x, the full compile's %#x", Direction(d), got, want.Flags)
		}
	}
}

// TestIncrementalCommitsMatchFullCompile: random policies made of rule sets, changed
// mostly as the controller changes them (a few host rules of one object, on every pod
// the object selects) and sometimes otherwise, committed to the in-memory backend:
// after every commit the committed entries (both entry sets) are a fresh full
// compile's, every packet gets Verdict's answer (of the sets and of the same rules
// as plain Allow rules), and both incremental and full compiles were exercised.
func TestIncrementalCommitsMatchFullCompile(t *testing.T) {
	g := newPolicyGen(17)
	m := NewMemory()
	const pods, steps, packets = 3, 600, 30
	pols := make([]*setsPod, pods)
	for i := range pols {
		pols[i] = g.setsPod(t)
	}
	var incremental, full, fromOther, refused, precompiled int
	for step := range steps {
		i := g.rnd.IntN(pods)
		if g.rnd.IntN(5) == 0 {
			pols[i] = pols[(i+1)%pods] // the same objects as another pod
		}
		next := g.mutateSets(t, pols[i])
		// The change reaches every pod holding the same objects, as reconcile commits
		// it, or sometimes one of them only (another object changed, which selects it
		// alone): the pods' compiles then diverge from a common one.
		cur, alone := pols[i], g.rnd.IntN(6) == 0
		for j := range pods {
			if pols[j] != cur || alone && j != i {
				continue
			}
			ifindex := j + 1
			res, err := m.Commit(ifindex, next.policy())
			if err != nil {
				if !errors.Is(err, ErrInvalidPolicy) {
					t.Fatalf("step %d: commit: %v", step, err)
				}
				_, e0 := fullCompile(next.flat().Ingress)
				_, e1 := fullCompile(next.flat().Egress)
				if e0 == nil && e1 == nil {
					t.Fatalf("step %d: commit refused a policy the full compile takes: %v", step, err)
				}
				refused++
				continue // the pod keeps its policy
			}
			pols[j] = next
			switch {
			case res.Skipped:
			case res.Incremental && j != i && slices.Contains(pols[:j], next):
				fromOther++
			case res.Incremental:
				incremental++
			default:
				full++
			}
		}
		for j := range pods {
			ifindex := j + 1
			rec := m.pods[uint32(ifindex)]
			if rec == nil {
				continue // every commit of it refused so far
			}
			flat := pols[j].flat()
			checkFullCompile(t, rec, flat)
			for d := range rec.dirs {
				if s := rec.dirs[d].shared; s != nil && s.borrowed {
					precompiled++
				}
			}
			checkGroups(t, m.core, m.maps.setEntries)
			for range packets {
				pkt := g.packet()
				for _, d := range []Direction{Ingress, Egress} {
					want := referenceVerdict(flat, d, pkt)
					if got := referenceVerdict(pols[j].policy(), d, pkt); got != want {
						t.Fatalf("step %d: Verdict of the sets %v, of the same rules in Allow %v", step, got, want)
					}
					if got := m.Verdict(ifindex, d, pkt.peer, pkt.proto, pkt.port); got != want {
						t.Fatalf("step %d pod %d %s %v %v/%d: verdict %v, Verdict %v", step, ifindex, d, pkt.peer, pkt.proto, pkt.port, got, want)
					}
				}
			}
		}
		for d := range 2 {
			if n := m.entryCount(Direction(d)); n != m.used[d][0]+m.used[d][1] {
				t.Fatalf("step %d: %s maps hold %d entries, accounted %d", step, Direction(d), n, m.used[d][0]+m.used[d][1])
			}
		}
		checkShared(t, m.core)
	}
	t.Logf("%d steps: %d incremental commits, %d taking another pod's incremental compile, %d full, %d refused; %d pod directions seen holding a set's own compile",
		steps, incremental, fromOther, full, refused, precompiled)
	if incremental < steps/8 || fromOther < steps/60 || full < steps/10 || precompiled < steps/10 {
		t.Fatalf("too few incremental (%d), shared incremental (%d) or full (%d) commits of %d steps to prove anything", incremental, fromOther, full, steps)
	}
}

// hostRules are n /32 rules from 10.0.0.0 on, on TCP port.
func hostRules(n int, port int32) []Rule {
	rs := make([]Rule, n)
	for i := range rs {
		a := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		rs[i] = Rule{CIDR: netip.PrefixFrom(a, 32), Ports: []PortRule{{Protocol: ProtocolTCP, Port: port}}}
	}
	return rs
}

// TestIncrementalFastPath: a change of a few host rules of a set built from the
// committed one is compiled incrementally (and taken as is by a second pod with the
// same policy); every other kind of change is compiled in full. Each result is
// checked against a full compile.
func TestIncrementalFastPath(t *testing.T) {
	m := NewMemory()
	set := func(rules []Rule, prev *RuleSet) *RuleSet {
		t.Helper()
		s, err := NewRuleSet("PolicyEndpoint ns/web", Ingress, rules, prev)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	base := hostRules(1000, 80)
	cur := set(base, nil)
	pol := func(sets ...*RuleSet) PodPolicy {
		return PodPolicy{Ingress: DirectionPolicy{Isolated: true, AllowSets: sets}}
	}
	flat := func(p PodPolicy) PodPolicy {
		d := DirectionPolicy{Isolated: p.Ingress.Isolated, Allow: slices.Clone(p.Ingress.Allow), Admin: p.Ingress.Admin}
		for _, s := range p.Ingress.AllowSets {
			d.Allow = append(d.Allow, s.rules...)
		}
		return PodPolicy{Ingress: d}
	}
	commit := func(ifindex int, p PodPolicy, incremental bool, what string) CommitResult {
		t.Helper()
		res, err := m.Commit(ifindex, p)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if res.Incremental != incremental {
			t.Fatalf("%s: incremental %v, want %v (%+v)", what, res.Incremental, incremental, res)
		}
		checkFullCompile(t, m.pods[uint32(ifindex)], flat(p))
		return res
	}
	commit(1, pol(cur), false, "first commit")
	if !m.pods[1].dirs[Ingress].shared.borrowed {
		t.Fatal("first commit of a set alone: not the set's own compile, made when it was built")
	}
	commit(2, pol(cur), false, "first commit of a second pod")
	commit(1, pol(cur), false, "the same set again") // skipped

	// The controller's change: one pod peer more, then one fewer.
	rules := append(slices.Clone(base), Rule{CIDR: netip.MustParsePrefix("11.0.0.1/32"), Ports: []PortRule{{Protocol: ProtocolTCP, Port: 80}}})
	next := set(rules, cur)
	commit(1, pol(next), true, "one host rule added") // the second entry set is written in full
	commit(2, pol(next), true, "the same change on a second pod")
	cur, next = next, set(slices.Delete(slices.Clone(rules), 5, 6), next)
	// Both pods hold one entry group: the first writes the set no pod names, the
	// second finds it (Shared) and levels the set it left: one entry per set.
	for ifindex := 1; ifindex <= 2; ifindex++ {
		if res := commit(ifindex, pol(next), true, "one host rule removed"); !res.Delta || res.EntriesDeleted != 1 || res.EntriesWritten != 0 || res.Shared != (ifindex == 2) {
			t.Fatalf("one host rule removed: %+v, want a delta of one entry per set", res)
		}
	}
	cur, next = next, set(append(slices.Clone(next.rules), Rule{CIDR: netip.MustParsePrefix("10.0.0.7/32"), Ports: []PortRule{{Protocol: ProtocolUDP, Port: 53}}}), next)
	commit(1, pol(next), true, "a second rule for a host")
	cur = next

	// Everything else compiles in full.
	next = set(append(slices.Clone(cur.rules), Rule{CIDR: netip.MustParsePrefix("10.0.0.0/24"), Except: []netip.Prefix{netip.MustParsePrefix("10.0.0.9/32")}}), cur)
	commit(1, pol(next), false, "a broad rule added")
	cur = next
	next = set(append(slices.Clone(cur.rules), Rule{CIDR: netip.MustParsePrefix("10.0.0.3/32"), Ports: []PortRule{{Protocol: ProtocolTCP, Port: 443}}}), cur)
	commit(1, pol(next), true, "a host rule under a broad one, after a full compile")
	cur = next
	other := set(hostRules(3, 22), nil)
	commit(1, pol(cur, other), false, "a set added")
	next = set(cur.rules[:len(cur.rules)-1], cur)
	commit(1, pol(next, other), true, "a host rule removed with two sets")
	cur = next
	p := pol(cur, other)
	p.Ingress.Admin = []TierRule{{Priority: 1, Action: ActionDeny, Rule: Rule{CIDR: netip.MustParsePrefix("10.0.1.0/24")}}}
	commit(1, p, false, "an admin rule added")
	next = set(cur.rules[:len(cur.rules)-1], nil)
	p.Ingress.AllowSets[0] = next
	commit(1, p, false, "a set not built from the committed one")
	cur = next
	many := slices.Clone(cur.rules)
	for i := range many[:maxSetChanges(len(many))+1] {
		many[i].Ports = []PortRule{{Protocol: ProtocolTCP, Port: 81}}
	}
	next = set(many, cur)
	p.Ingress.AllowSets[0] = next
	commit(1, p, false, "too many host rules changed")
	cur = next

	// A set's own compile stays as built when the pod that took it moves on twice
	// (its second derived compile may reuse the arrays of a dead first one, never
	// the set's): another pod committing the set later gets the set's entries.
	x := set(hostRules(302, 80), nil)
	commit(3, pol(x), false, "a set alone")
	y := set(hostRules(301, 80), x)
	commit(3, pol(y), true, "a set alone, one host rule removed")
	z := slices.Clone(y.rules)
	z[0].Ports = []PortRule{{Protocol: ProtocolUDP, Port: 53}}
	z[1].Ports = z[0].Ports
	commit(3, pol(set(z, y)), true, "a set alone, two host rules' ports changed")
	commit(4, pol(x), false, "the first set on another pod")

	// A bad baseline rule rejects a set alone as it rejects any policy, though an
	// isolated direction does not compile it.
	bad := pol(x)
	bad.Ingress.Baseline = []TierRule{{Action: ActionDeny, Rule: Rule{CIDR: netip.MustParsePrefix("10.0.0.0/8"), Ports: []PortRule{{Protocol: ProtocolTCP, Port: 70000}}}}}
	if _, err := m.Commit(5, bad); !errors.Is(err, ErrInvalidPolicy) {
		t.Fatalf("a set alone with a bad baseline rule: %v, want ErrInvalidPolicy", err)
	}

	// A host rule whose ports, with the others at its address, overflow a value: the
	// incremental compile leaves it to the full one, whose error names the rule.
	crowded := slices.Clone(cur.rules)
	for i := range maxPortRules + 1 {
		crowded = append(crowded, Rule{CIDR: netip.MustParsePrefix("10.0.0.1/32"), Ports: []PortRule{{Protocol: ProtocolUDP, Port: int32(1000 + 2*i)}}})
	}
	p.Ingress.AllowSets[0] = set(crowded, cur)
	_, err := m.Commit(1, p)
	if !errors.Is(err, ErrInvalidPolicy) || !strings.Contains(err.Error(), "of PolicyEndpoint ns/web") {
		t.Fatalf("overflowing host rules: %v, want ErrInvalidPolicy naming the set's rule", err)
	}
}
