package seen

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"testing"

	"github.com/npagent/npagent/internal/report"
)

// FuzzDecodeState feeds arbitrary state-file bodies to the decoder, with a valid
// checksum appended so the fuzzer gets past it into the entries. A body is either
// rejected as damaged (and the agent starts as on a first start) or decodes to entries
// the encoder writes back to the same bytes, and restores into a Set that persists a
// file the decoder reads again. Seeds are files a Set wrote, with guarded, pending and
// plain-name entries.
func FuzzDecodeState(f *testing.F) {
	for _, body := range seedStateBodies(f) {
		f.Add(body)
	}
	f.Add([]byte(stateMagic + "\x01\x00"))
	f.Fuzz(func(t *testing.T, body []byte) {
		file := binary.LittleEndian.AppendUint32(bytes.Clone(body), crc32.Checksum(body, castagnoli))
		st, err := decodeState(file)
		if err != nil {
			if !errors.Is(err, errDamaged) {
				t.Fatalf("decode error %v does not wrap errDamaged", err)
			}
			return
		}
		again, err := decodeState(encodeRestored(st))
		if err != nil {
			t.Fatalf("re-encoded state does not decode: %v", err)
		}
		if a, b := encodeRestored(st), encodeRestored(again); !bytes.Equal(a, b) {
			t.Fatalf("encode(decode(x)) is not stable:\n%x\n%x", a, b)
		}

		path := statePath(t)
		if err := os.WriteFile(path, file, 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := New(at(1e6), WithStatePath(path))
		if err != nil {
			t.Fatalf("restore of a decodable file: %v", err)
		}
		if err := s.Persist(); err != nil {
			t.Fatal(err)
		}
		written, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := decodeState(written); err != nil {
			t.Fatalf("the restored set wrote a file it cannot read: %v", err)
		}
	})
}

// encodeRestored writes decoded entries back in the file format, every uid as a
// string entry (the decoder formats uuid entries as strings).
func encodeRestored(st *restoredState) []byte {
	buf := append([]byte(stateMagic), 0, 0)
	binary.LittleEndian.PutUint16(buf[len(stateMagic):], stateVersion)
	buf = binary.LittleEndian.AppendUint64(buf, uint64(st.watermark))
	buf = binary.LittleEndian.AppendUint64(buf, uint64(len(st.entries)))
	for _, e := range st.entries {
		buf = appendEntryHead(buf, entryKindStr, e.entry)
		buf = binary.AppendUvarint(buf, uint64(len(e.uid)))
		buf = append(buf, e.uid...)
		buf = appendEntryTail(buf, e.entry)
	}
	return binary.LittleEndian.AppendUint32(buf, crc32.Checksum(buf, castagnoli))
}

// seedStateBodies returns bodies (checksum cut off) of files real Sets wrote.
func seedStateBodies(f *testing.F) [][]byte {
	var out [][]byte
	persist := func(build func(s *Set)) {
		path := f.TempDir() + "/seen.state"
		s, err := New(at(0), WithStatePath(path))
		if err != nil {
			f.Fatal(err)
		}
		build(s)
		if err := s.Persist(); err != nil {
			f.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		out = append(out, b[:len(b)-4])
	}
	persist(func(*Set) {})
	persist(func(s *Set) {
		s.Observe(uidA, at(-5), at(1))  // before the start: guarded
		s.Observe(uidB, at(2), at(2.5)) // pending
		s.Observe(uidB, at(3), at(3.5))
		s.Observe("plain-name", at(4), at(4.5))
		if _, err := s.Committed("plain-name", at(4.7), report.Attempt{Start: at(4.6), End: at(4.7)}); err != nil {
			f.Fatal(err)
		}
	})
	return out
}
