package main

import (
	"net/netip"
	"testing"

	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/report"
)

// The dataplane's map use reaches report.Counts as the backend counts it, with
// the capacities the flags asked for.
func TestMapUsageFillsCounts(t *testing.T) {
	dp := bpfmaps.NewMemoryWithLimits(mapLimits(config{MapEntriesV4: 1000, MapEntriesV6: 500}))
	pol := bpfmaps.PodPolicy{Egress: bpfmaps.DirectionPolicy{Isolated: true, Allow: []bpfmaps.Rule{
		{CIDR: netip.MustParsePrefix("10.1.0.0/16")}, {CIDR: netip.MustParsePrefix("fd00::/64")}}}}
	if _, err := dp.Commit(7, pol); err != nil {
		t.Fatal(err)
	}
	got := mapUsage(dp)
	u, _ := dp.Usage()
	if got.Entries[1][0] != (report.MapUse{Used: int64(u.Entries[1][0].Used), Max: 1000}) || got.Entries[1][0].Used == 0 ||
		got.Entries[1][1] != (report.MapUse{Used: int64(u.Entries[1][1].Used), Max: 500}) || got.Entries[1][1].Used == 0 ||
		got.Entries[0][0] != (report.MapUse{Max: 1000}) || got.Pods != (report.MapUse{Used: 1, Max: bpfmaps.DefaultPods}) ||
		got.Conntrack != (report.MapUse{}) {
		t.Fatalf("map use %+v (backend %+v)", got, u)
	}
}
