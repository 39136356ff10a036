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

func makeKey(uid string) key {
	if id, ok := parseUUID(uid); ok {
		return key{id: id, isUUID: true}
	}
	return key{name: uid}
}

// parseUUID accepts only the canonical lowercase form, so formatUUID gives
// back the very same string.
func parseUUID(s string) (id [16]byte, ok bool) {
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return id, false
	}
	for i, off := range uuidOffsets {
		hi, lo := hexNibble[s[off]], hexNibble[s[off+1]]
		if hi|lo > 0x0f {
			return id, false
		}
		id[i] = hi<<4 | lo
	}
	return id, true
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
