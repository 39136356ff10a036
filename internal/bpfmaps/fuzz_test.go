package bpfmaps

import (
	"encoding/binary"
	"hash/fnv"
	"math/rand/v2"
	"testing"
)

// FuzzCompiledEntriesMatchVerdict is TestCompiledEntriesMatchVerdict with the
// fuzzer choosing: every draw of the policy generator (CIDRs, excepts, ports,
// tiers, priorities, packets) reads the fuzz input, so coverage guidance steers
// toward policies whose compiled entries the random seeds did not reach. Delta and
// full commits alternate on the same pods, as the rounds change each pod's policy.
func FuzzCompiledEntriesMatchVerdict(f *testing.F) {
	for _, seed := range []string{"", "\x00", "npagent", "\xff\xff\xff\xff\xff\xff\xff\xff\x01\x02\x03"} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		g := (&policyGen{rnd: rand.New(newByteSource(data)), anyMix: true}).withNode()
		m := NewMemory()
		checkAgainstReference(t, g, m, []int{1, 2}, 4, 64, func(ifindex int, d Direction, pkt packet) bool {
			return m.Verdict(ifindex, d, pkt.peer, pkt.proto, pkt.port)
		})
	})
}

// byteSource is a rand.Source that reads the fuzz input 8 bytes at a time, then a
// PCG seeded from the input: a constant once the input is spent would make
// rand.IntN's rejection loop spin for ever.
type byteSource struct {
	data []byte
	rest *rand.PCG
}

func newByteSource(data []byte) *byteSource {
	h := fnv.New64a()
	h.Write(data)
	sum := h.Sum64()
	return &byteSource{data: data, rest: rand.NewPCG(sum, sum^0x9e3779b97f4a7c15)}
}

func (s *byteSource) Uint64() uint64 {
	if len(s.data) == 0 {
		return s.rest.Uint64()
	}
	var b [8]byte
	n := copy(b[:], s.data)
	s.data = s.data[n:]
	return binary.LittleEndian.Uint64(b[:])
}
