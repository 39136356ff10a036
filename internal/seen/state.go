package seen

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
)

// State file format, version 1, little endian:
//
//	magic     [6]byte "npseen"
//	version   uint16  1
//	watermark int64   Unix ns (see doc.go)
//	count     uint64  number of entries
//	entries   count × { kind uint8 (0 uuid, 1 string); flags uint8;
//	                    consumed int64; uuid [16]byte | len uvarint, bytes }
//	crc32c    uint32  Castagnoli CRC of every byte before it
//
// Only entries with a consumed trigger are written. The checksum makes a
// truncated or overwritten file detectable, so it is rejected rather than
// half-restored.

const (
	stateMagic   = "npseen"
	stateVersion = 1
	headerLen    = len(stateMagic) + 2 + 8 + 8
	entryKindID  = 0
	entryKindStr = 1
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errDamaged is wrapped by every decoding error.
var errDamaged = errors.New("damaged state file")

type restoredEntry struct {
	uid      string
	consumed int64
	flags    uint8
}

type restoredState struct {
	watermark int64
	entries   []restoredEntry
}

// appendState encodes the set's persistent state after buf. s.mu is held.
func (s *Set) appendState(buf []byte) []byte {
	start := len(buf)
	buf = append(buf, stateMagic...)
	buf = binary.LittleEndian.AppendUint16(buf, stateVersion)
	buf = binary.LittleEndian.AppendUint64(buf, 0) // watermark, patched below
	buf = binary.LittleEndian.AppendUint64(buf, 0) // count, patched below

	// The watermark claims every event up to it was resolved. Triggers still
	// pending (or committed ahead of their event) for uids with nothing to
	// persist must stay above it so the next process accepts them again.
	lowest := noTime + 1
	if now, ok := unixNano(s.cfg.now().Add(-s.cfg.watermarkLag)); ok {
		lowest = now
	}
	var count uint64
	pinWatermark := func(e entry) {
		if e.pend == nil {
			return
		}
		if len(e.pend.triggers) > 0 {
			lowest = min(lowest, e.pend.triggers[0].trigger-1)
		}
		if e.pend.aheadThrough != noTime {
			lowest = min(lowest, e.pend.aheadThrough-1)
		}
	}
	for id, e := range s.byUUID {
		if e.consumed == noTime {
			pinWatermark(e)
			continue
		}
		buf = append(buf, entryKindID, e.flags)
		buf = binary.LittleEndian.AppendUint64(buf, uint64(e.consumed))
		buf = append(buf, id[:]...)
		count++
	}
	for name, e := range s.byName {
		if e.consumed == noTime {
			pinWatermark(e)
			continue
		}
		buf = append(buf, entryKindStr, e.flags)
		buf = binary.LittleEndian.AppendUint64(buf, uint64(e.consumed))
		buf = binary.AppendUvarint(buf, uint64(len(name)))
		buf = append(buf, name...)
		count++
	}
	// Never below the guard: triggers at or below it were before_start for
	// every uid this process did not accept, and must stay so.
	watermark := max(s.guard, lowest)
	binary.LittleEndian.PutUint64(buf[start+8:], uint64(watermark))
	binary.LittleEndian.PutUint64(buf[start+16:], count)
	return binary.LittleEndian.AppendUint32(buf, crc32.Checksum(buf[start:], castagnoli))
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
	rest := body[headerLen:]
	// The smallest entry is 11 bytes, which bounds a lying count.
	if count > uint64(len(rest))/11 {
		return nil, fmt.Errorf("%w: count %d does not fit %d bytes", errDamaged, count, len(rest))
	}
	st.entries = make([]restoredEntry, 0, count)
	for i := uint64(0); i < count; i++ {
		if len(rest) < 10 {
			return nil, fmt.Errorf("%w: entry %d truncated", errDamaged, i)
		}
		kind, flags := rest[0], rest[1]
		consumed := int64(binary.LittleEndian.Uint64(rest[2:]))
		rest = rest[10:]
		if consumed == noTime {
			return nil, fmt.Errorf("%w: entry %d has no consumed time", errDamaged, i)
		}
		var uid string
		switch kind {
		case entryKindID:
			if len(rest) < 16 {
				return nil, fmt.Errorf("%w: entry %d truncated", errDamaged, i)
			}
			uid = formatUUID([16]byte(rest[:16]))
			rest = rest[16:]
		case entryKindStr:
			n, w := binary.Uvarint(rest)
			if w <= 0 || n > uint64(len(rest)-w) {
				return nil, fmt.Errorf("%w: entry %d truncated", errDamaged, i)
			}
			uid = string(rest[w : w+int(n)])
			rest = rest[w+int(n):]
		default:
			return nil, fmt.Errorf("%w: entry %d has kind %d", errDamaged, i, kind)
		}
		st.entries = append(st.entries, restoredEntry{uid: uid, consumed: consumed, flags: flags & flagGuarded})
	}
	if len(rest) != 0 {
		return nil, fmt.Errorf("%w: %d bytes after the last entry", errDamaged, len(rest))
	}
	return st, nil
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
	s.mu.Lock()
	snapSeq := s.changeSeq
	s.encodeBuf = s.appendState(s.encodeBuf[:0])
	s.mu.Unlock()

	err := writeFileAtomic(s.cfg.statePath, s.encodeBuf)
	s.mu.Lock()
	if err != nil {
		s.stats.PersistErrors++
	} else {
		s.stats.Persists++
	}
	s.mu.Unlock()
	if err != nil {
		return err
	}
	s.durableSeq = snapSeq
	return nil
}

// writeFileAtomic replaces path with data: write a sibling temp file, fsync
// it, rename it over path, fsync the directory so the rename is durable.
// A crash leaves either the old file or the new one, never a mix.
func writeFileAtomic(path string, data []byte) (err error) {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("persist seen-set state: %w", err)
	}
	defer func() {
		if err != nil {
			os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("persist seen-set state: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("persist seen-set state: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("persist seen-set state: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("persist seen-set state: %w", err)
	}
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("persist seen-set state: sync directory: %w", err)
	}
	defer dir.Close()
	if err := dir.Sync(); err != nil {
		return fmt.Errorf("persist seen-set state: sync directory: %w", err)
	}
	return nil
}
