package reconcile

import (
	"net/netip"
	"reflect"
	"testing"
)

func TestUnion(t *testing.T) {
	a, b, c := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3")
	if got := union([]netip.Addr{c, a}, nil, []netip.Addr{b, a}); !reflect.DeepEqual(got, []netip.Addr{a, b, c}) {
		t.Errorf("union = %v", got)
	}
}
