package seen

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestParseTrigger(t *testing.T) {
	valid := map[string]time.Time{
		"2026-03-01T12:00:05.123456789Z": time.Date(2026, 3, 1, 12, 0, 5, 123456789, time.UTC),
		"2026-03-01T12:00:05.5Z":         time.Date(2026, 3, 1, 12, 0, 5, 500000000, time.UTC),
		"2026-03-01T12:00:05Z":           time.Date(2026, 3, 1, 12, 0, 5, 0, time.UTC),
		"2026-03-01T14:00:05+02:00":      time.Date(2026, 3, 1, 12, 0, 5, 0, time.UTC),
	}
	for v, want := range valid {
		got, err := ParseTrigger(v)
		if err != nil || !got.Equal(want) {
			t.Errorf("ParseTrigger(%q) = %v, %v; want %v", v, got, err, want)
		}
	}
	invalid := []string{
		"", "yesterday", "1740830405", "2026-03-01 12:00:05Z", "2026-03-01T12:00:05",
		"2026-13-01T12:00:05Z", "0001-01-01T00:00:00Z", "2263-01-01T00:00:00Z",
	}
	for _, v := range invalid {
		_, err := ParseTrigger(v)
		if err == nil {
			t.Errorf("ParseTrigger(%q) succeeded, want an error", v)
			continue
		}
		if !errors.Is(err, ErrInvalidTrigger) || !strings.Contains(err.Error(), strconv.Quote(v)) {
			t.Errorf("ParseTrigger(%q) error %q: want ErrInvalidTrigger quoting the value", v, err)
		}
	}
	long := strings.Repeat("x", 10000)
	if _, err := ParseTrigger(long); err == nil || len(err.Error()) > 300 {
		t.Errorf("error for a 10000-byte value is %d bytes, want it bounded", len(err.Error()))
	}
}

func FuzzParseTrigger(f *testing.F) {
	for _, seed := range []string{
		"2026-03-01T12:00:05.123456789Z", "2026-03-01T12:00:05Z", "2026-03-01T12:00:05.000001-07:00",
		"1678-01-01T00:00:00Z", "2262-04-11T23:47:16.854775807Z", "", "not a time", "2026-02-30T00:00:00Z",
		"2026-03-01T24:00:00Z", "2026-03-01T12:00:05.Z", "\xff\xfe",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, value string) {
		got, err := ParseTrigger(value)
		if err != nil {
			if !errors.Is(err, ErrInvalidTrigger) {
				t.Fatalf("ParseTrigger(%q) error %v does not wrap ErrInvalidTrigger", value, err)
			}
			quoted := value
			if len(quoted) > maxQuotedValue {
				quoted = quoted[:maxQuotedValue]
			}
			if !strings.Contains(err.Error(), strconv.Quote(quoted)) {
				t.Fatalf("ParseTrigger(%q) error %q does not quote the value", value, err)
			}
			return
		}
		if _, ok := unixNano(got); !ok {
			t.Fatalf("ParseTrigger(%q) = %v, outside int64 nanoseconds", value, got)
		}
		// Round trip in the value's own offset and in UTC, as a controller writes it.
		for _, text := range []string{got.Format(time.RFC3339Nano), got.UTC().Format(time.RFC3339Nano)} {
			again, err := ParseTrigger(text)
			if err != nil || !again.Equal(got) {
				t.Fatalf("round trip of %q via %q = %v, %v; want %v", value, text, again, err, got)
			}
		}
	})
}
