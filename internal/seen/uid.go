package seen

// Kubernetes UIDs are UUIDs in canonical lowercase form (36 bytes of text).
// Keying the set by their 16-byte value instead of the string keeps a tracked
// object within a map slot (no separate string allocation), which is what
// makes ≤128 bytes per object possible. Anything else (uppercase, braces,
// non-UUID test uids) goes to a string-keyed fallback map, so the key
// round-trips to exactly the string the caller used.

// key is a parsed uid: a UUID value when isUUID, else the string itself.
type key struct {
	id     [16]byte
	name   string
	isUUID bool
}

// uuidOffsets are the text offsets of the 16 byte pairs of a canonical UUID.
var uuidOffsets = [16]uint8{0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34}

// hexNibble maps a lowercase hex digit to its value; every other byte is 0xff.
var hexNibble = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xff
	}
	for c := byte('0'); c <= '9'; c++ {
		t[c] = c - '0'
	}
	for c := byte('a'); c <= 'f'; c++ {
		t[c] = c - 'a' + 10
	}
	return t
}()

const hexDigits = "0123456789abcdef"

func makeKey(uid string) (k key) {
	if parseUUID(&k.id, uid) {
		k.isUUID = true
	} else {
		k.name = uid
	}
	return k
}

// parseUUID decodes s into id if s is a UUID in canonical lowercase form
// (only that form, so formatUUID gives back the very same string). On false
// id holds garbage.
func parseUUID(id *[16]byte, s string) bool {
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return false
	}
	// Unrolled with constant offsets so the compiler drops every bounds
	// check: this is on the re-delivery hot path.
	var bad byte
	id[0], bad = hexByte(s[0], s[1], bad)
	id[1], bad = hexByte(s[2], s[3], bad)
	id[2], bad = hexByte(s[4], s[5], bad)
	id[3], bad = hexByte(s[6], s[7], bad)
	id[4], bad = hexByte(s[9], s[10], bad)
	id[5], bad = hexByte(s[11], s[12], bad)
	id[6], bad = hexByte(s[14], s[15], bad)
	id[7], bad = hexByte(s[16], s[17], bad)
	id[8], bad = hexByte(s[19], s[20], bad)
	id[9], bad = hexByte(s[21], s[22], bad)
	id[10], bad = hexByte(s[24], s[25], bad)
	id[11], bad = hexByte(s[26], s[27], bad)
	id[12], bad = hexByte(s[28], s[29], bad)
	id[13], bad = hexByte(s[30], s[31], bad)
	id[14], bad = hexByte(s[32], s[33], bad)
	id[15], bad = hexByte(s[34], s[35], bad)
	return bad <= 0x0f
}

// hexByte decodes two hex digits, or-ing their table values into bad, whose
// high bits end up set if either was not a lowercase hex digit.
func hexByte(hi, lo, bad byte) (byte, byte) {
	h, l := hexNibble[hi], hexNibble[lo]
	return h<<4 | l&0x0f, bad | h | l
}

func formatUUID(id [16]byte) string {
	var b [36]byte
	b[8], b[13], b[18], b[23] = '-', '-', '-', '-'
	for i, off := range uuidOffsets {
		b[off] = hexDigits[id[i]>>4]
		b[off+1] = hexDigits[id[i]&0x0f]
	}
	return string(b[:])
}

func (k key) String() string {
	if k.isUUID {
		return formatUUID(k.id)
	}
	return k.name
}
