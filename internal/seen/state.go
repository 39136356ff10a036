package seen

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/npagent/npagent/internal/atomicfile"
)

// State file format, version 1, little endian:
//
//	magic     [6]byte "npseen"
//	version   uint16  1
//	watermark int64   Unix ns (see doc.go)
//	count     uint64  number of entries
//	entries   count × entry
//	crc32c    uint32  Castagnoli CRC of every byte before it
//
//	entry:    kind uint8 (0 uuid, 1 string); flags uint8; consumed int64 (noTime: none);
//	          uuid [16]byte | len uvarint, bytes;
//	          if flags&stateHasPending: n uvarint, n × {trigger, receivedAt, programmedAt int64; failures uint32}
//	          if flags&stateHasAhead:   aheadThrough, aheadAt int64
//
//	flags:    1 guarded, 2 local (a build before the local flag rejects such a file
//	          as damaged: a downgrade starts without state), 64 pending, 128 ahead.
//
// Every uid with work on this node is written (see persistWorthy), pending
// triggers included, so a trigger still pending at shutdown — even one a newer
// version will supersede before the next process lists the object — is reported
// after the restart. The checksum makes a truncated or overwritten file
// detectable, so it is rejected rather than half-restored.

const (
	stateMagic   = "npseen"
	stateVersion = 1
	headerLen    = len(stateMagic) + 2 + 8 + 8
	entryKindID  = 0
	entryKindStr = 1

	// Flag bits of a state entry; flagGuarded is shared with entry.flags.
	stateHasPending = 1 << 6
	stateHasAhead   = 1 << 7
	stateFlagsKnown = flagsPersisted | stateHasPending | stateHasAhead

	minEntryLen   = 1 + 1 + 8 + 1 // string kind, empty uid
	pendingRecLen = 8 + 8 + 8 + 4
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errDamaged is wrapped by every decoding error.
var errDamaged = errors.New("damaged state file")

type restoredEntry struct {
	uid   string
	entry entry
}

type restoredState struct {
	watermark int64
	entries   []restoredEntry
}

// appendState encodes the set's persistent state after buf, locking each
// shard in turn.
func (s *Set) appendState(buf []byte) []byte {
	start := len(buf)
	buf = append(buf, stateMagic...)
	buf = binary.LittleEndian.AppendUint16(buf, stateVersion)
	// The watermark claims every event up to it was resolved; see doc.go.
	// Never below the guard: what was before_start must stay so. It moves only
	// once the caches synced, with the new triggers accepted since, never past the
	// clock, and lags them (events in flight at a stop).
	watermark := s.guard
	if s.synced.Load() {
		through := s.observedThrough.Load()
		if now, ok := unixNano(s.cfg.now()); ok {
			through = min(through, now)
		}
		watermark = max(watermark, through-int64(s.cfg.watermarkLag))
	}
	buf = binary.LittleEndian.AppendUint64(buf, uint64(watermark))
	buf = binary.LittleEndian.AppendUint64(buf, 0) // count, patched below
	count := 0
	// One shard locked at a time: each uid's entry is consistent, which is
	// all a restore needs (entries are independent).
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for id, e := range sh.byUUID {
			if !e.persistWorthy(watermark) {
				continue
			}
			count++
			buf = appendEntryHead(buf, entryKindID, e)
			buf = append(buf, id[:]...)
			buf = appendEntryTail(buf, e)
		}
		for name, e := range sh.byName {
			if !e.persistWorthy(watermark) {
				continue
			}
			count++
			buf = appendEntryHead(buf, entryKindStr, e)
			buf = binary.AppendUvarint(buf, uint64(len(name)))
			buf = append(buf, name...)
			buf = appendEntryTail(buf, e)
		}
		sh.mu.Unlock()
	}
	binary.LittleEndian.PutUint64(buf[start+16:], uint64(count))
	return binary.LittleEndian.AppendUint32(buf, crc32.Checksum(buf[start:], castagnoli))
}

// persistWorthy reports whether the state file needs e, written with watermark:
// when something is pending or was committed ahead (to be reported after a
// restart), when a trigger of it was reported and its versions since had work
// here (flagLocal: after a restart its re-delivery answers redelivered, never
// before_start), or when it consumed a trigger newer than the watermark (the guard
// does not cover it after a restart). Any other uid — an object with nothing on
// this node whose triggers are all older than the watermark — answers
// before_start after a restart, without a report, as it would from its entry.
func (e entry) persistWorthy(watermark int64) bool {
	return e.pend != nil || e.flags&flagLocal != 0 || e.consumed > watermark
}

func appendEntryHead(buf []byte, kind uint8, e entry) []byte {
	flags := e.flags & flagsPersisted
	if e.pend != nil && len(e.pend.triggers) > 0 {
		flags |= stateHasPending
	}
	if e.pend != nil && e.pend.aheadThrough != noTime {
		flags |= stateHasAhead
	}
	buf = append(buf, kind, flags)
	return binary.LittleEndian.AppendUint64(buf, uint64(e.consumed))
}

func appendEntryTail(buf []byte, e entry) []byte {
	if e.pend == nil {
		return buf
	}
	if n := len(e.pend.triggers); n > 0 {
		buf = binary.AppendUvarint(buf, uint64(n))
		for _, q := range e.pend.triggers {
			buf = binary.LittleEndian.AppendUint64(buf, uint64(q.trigger))
			buf = binary.LittleEndian.AppendUint64(buf, uint64(q.receivedAt))
			buf = binary.LittleEndian.AppendUint64(buf, uint64(q.programmedAt))
			buf = binary.LittleEndian.AppendUint32(buf, q.failures)
		}
	}
	if e.pend.aheadThrough != noTime {
		buf = binary.LittleEndian.AppendUint64(buf, uint64(e.pend.aheadThrough))
		buf = binary.LittleEndian.AppendUint64(buf, uint64(e.pend.aheadAt))
	}
	return buf
}

// stateReader decodes with bounds checks; the first failure sticks.
type stateReader struct {
	b   []byte
	err error
}

func (r *stateReader) take(n int) []byte {
	if r.err != nil || n < 0 || len(r.b) < n {
		if r.err == nil {
			r.err = fmt.Errorf("%w: truncated entry", errDamaged)
		}
		return make([]byte, max(n, 0))
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func (r *stateReader) int64() int64 { return int64(binary.LittleEndian.Uint64(r.take(8))) }

func (r *stateReader) uvarint(limit uint64) int {
	if r.err != nil {
		return 0
	}
	n, w := binary.Uvarint(r.b)
	if w <= 0 || n > limit {
		r.err = fmt.Errorf("%w: bad length", errDamaged)
		return 0
	}
	r.b = r.b[w:]
	return int(n)
}

func decodeState(b []byte) (*restoredState, error) {
	if len(b) < headerLen+4 {
		return nil, fmt.Errorf("%w: %d bytes, shorter than a header", errDamaged, len(b))
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if string(body[:len(stateMagic)]) != stateMagic {
		return nil, fmt.Errorf("%w: bad magic %q", errDamaged, body[:len(stateMagic)])
	}
	if got := crc32.Checksum(body, castagnoli); got != sum {
		return nil, fmt.Errorf("%w: checksum %08x, want %08x", errDamaged, got, sum)
	}
	if v := binary.LittleEndian.Uint16(body[6:]); v != stateVersion {
		return nil, fmt.Errorf("%w: version %d, want %d", errDamaged, v, stateVersion)
	}
	st := &restoredState{watermark: int64(binary.LittleEndian.Uint64(body[8:]))}
	count := binary.LittleEndian.Uint64(body[16:])
	r := &stateReader{b: body[headerLen:]}
	if count > uint64(len(r.b))/minEntryLen { // bounds a lying count before allocating
		return nil, fmt.Errorf("%w: count %d does not fit %d bytes", errDamaged, count, len(r.b))
	}
	st.entries = make([]restoredEntry, 0, count)
	for i := uint64(0); i < count && r.err == nil; i++ {
		head := r.take(2)
		kind, flags := head[0], head[1]
		e := entry{consumed: r.int64(), flags: flags & flagsPersisted}
		var uid string
		switch kind {
		case entryKindID:
			uid = formatUUID([16]byte(r.take(16)))
		case entryKindStr:
			uid = string(r.take(r.uvarint(uint64(len(r.b)))))
		default:
			return nil, fmt.Errorf("%w: entry %d has kind %d", errDamaged, i, kind)
		}
		if flags&^stateFlagsKnown != 0 {
			return nil, fmt.Errorf("%w: entry %d has flags %#x", errDamaged, i, flags)
		}
		if flags&(stateHasPending|stateHasAhead) != 0 {
			e.pend = newPendingState()
		}
		if flags&stateHasPending != 0 {
			n := r.uvarint(uint64(len(r.b)) / pendingRecLen)
			for range n {
				e.pend.triggers = append(e.pend.triggers, pendingTrigger{
					trigger:      r.int64(),
					receivedAt:   r.int64(),
					programmedAt: r.int64(),
					failures:     binary.LittleEndian.Uint32(r.take(4)),
				})
			}
		}
		if flags&stateHasAhead != 0 {
			e.pend.aheadThrough, e.pend.aheadAt = r.int64(), r.int64()
		}
		if r.err != nil {
			break
		}
		if err := validEntry(e); err != nil {
			return nil, fmt.Errorf("%w: entry %d (%s): %w", errDamaged, i, uid, err)
		}
		st.entries = append(st.entries, restoredEntry{uid: uid, entry: e})
	}
	if r.err != nil {
		return nil, r.err
	}
	if len(r.b) != 0 {
		return nil, fmt.Errorf("%w: %d bytes after the last entry", errDamaged, len(r.b))
	}
	return st, nil
}

// validEntry checks what the set relies on: pending triggers sorted, unique
// and newer than consumed; something worth tracking.
func validEntry(e entry) error {
	if e.pend == nil {
		if e.consumed == noTime {
			return errors.New("nothing consumed or pending")
		}
		return nil
	}
	prev := e.consumed
	for _, q := range e.pend.triggers {
		if q.trigger <= prev {
			return errors.New("pending triggers out of order")
		}
		prev = q.trigger
	}
	return nil
}

// removeStaleTemps removes the temporaries a process stopped mid-write left beside
// the state file: this build's and an older build's fixed path+".tmp". Failing to
// is harmless (a temporary is never read, and writes never reuse a name), so it is
// not reported.
func removeStaleTemps(path string) {
	_, _ = atomicfile.RemoveStale(filepath.Dir(path))
	_ = os.Remove(path + ".tmp") // the symlink itself if it is one, never its target
}

// readState returns nil, nil when the file does not exist.
func readState(path string) (*restoredState, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("restore seen-set state: %w", err)
	}
	st, err := decodeState(b)
	if err != nil {
		return nil, fmt.Errorf("restore seen-set state %s: %w", path, err)
	}
	return st, nil
}

// persistThrough makes the state durable up to change seq. Writers queue on
// writeMu; whoever gets it snapshots everything changed so far, so the
// callers queued behind one write are all covered by the next (group
// commit): N concurrent commits cost about two writes, not N. force writes
// even when seq is already durable (the watermark still moves).
func (s *Set) persistThrough(seq uint64, force bool) error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if !force && s.durableSeq >= seq {
		return nil
	}
	// Every change numbered ≤ snapSeq finished inside its shard's lock
	// before this load, so the encoding, which takes each lock after it,
	// includes them all.
	snapSeq := s.changeSeq.Load()
	s.encodeBuf = s.appendState(s.encodeBuf[:0])
	if err := atomicfile.Write(s.cfg.statePath, s.encodeBuf, 0o600); err != nil {
		err = fmt.Errorf("persist seen-set state: %w", err)
		s.persistErrors.Add(1)
		return err
	}
	s.persists.Add(1)
	s.durableSeq = snapSeq
	return nil
}
