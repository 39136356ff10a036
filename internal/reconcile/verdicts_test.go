package reconcile

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/translate"
)

// The verdict counters' pods are named by their interface: the pod table's
// programmed pods, with the name an object selecting them gives; a pod no object
// names keeps its address alone.
func TestVerdictPods(t *testing.T) {
	web, lone := netip.MustParseAddr("10.1.0.5"), netip.MustParseAddr("10.1.0.6")
	pt := newPodTable(bpfmaps.NewMemory(), newLookupTableResolver(), &counters{}, testLogger(t), nil, 0)
	key := translate.Key{Kind: report.KindPolicyEndpoint, Namespace: "shop", Name: "web"}
	pt.objects[key] = &objectState{compiled: &translate.Compiled{Key: key, Pods: []netip.Addr{web},
		PodNames: map[netip.Addr]translate.PodName{web: {Namespace: "shop", Name: "web-1"}}}}
	pt.podIndex[web] = map[translate.Key]struct{}{key: {}}
	pt.programmed[web], pt.programmed[lone] = 7, 8
	got := pt.verdictPods()
	want := map[int]VerdictPod{7: {IP: web, Namespace: "shop", Name: "web-1"}, 8: {IP: lone}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("verdict pods %+v, want %+v", got, want)
	}
}
