package seen

import "testing"

func TestUUIDKeyRoundTrip(t *testing.T) {
	for _, uid := range []string{uidA, uidB, "00000000-0000-0000-0000-000000000000", "ffffffff-ffff-ffff-ffff-ffffffffffff"} {
		var id [16]byte
		if !parseUUID(&id, uid) {
			t.Fatalf("parseUUID(%q) rejected a canonical UUID", uid)
		}
		if got := formatUUID(id); got != uid {
			t.Fatalf("formatUUID(parseUUID(%q)) = %q", uid, got)
		}
	}
	// Anything that would not format back to the same string stays a string key.
	for _, uid := range []string{
		"", "plain-name", "6F1C2A9E-3B7D-4C1E-9A2F-0D4B5E6F7A81", "{6f1c2a9e-3b7d-4c1e-9a2f-0d4b5e6f7a81}",
		"6f1c2a9e3b7d4c1e9a2f0d4b5e6f7a81", "6f1c2a9e-3b7d-4c1e-9a2f-0d4b5e6f7a8g", "6f1c2a9e-3b7d-4c1e-9a2f_0d4b5e6f7a81",
		"6f1c2a9e-3b7d-4c1e-9a2f-0d4b5e6f7a8", "6f1c2a9e-3b7d-4c1e-9a2f-0d4b5e6f7a811",
	} {
		if k := makeKey(uid); k.isUUID || k.String() != uid {
			t.Errorf("makeKey(%q) = %+v, want the string key", uid, k)
		}
	}
}
