package reconcile

import (
	"testing"
	"time"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/explain"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/testenv"
)

// TestExplainEBPF: on the kernel dataplane (a pod in a network namespace, found by
// the route resolver), the report ExplainObject keeps carries the dataplane's own
// phases of the first commit to a new pod — attach, compile, write, switch — and
// ExplainPod names the interface holding the pod's state.
func TestExplainEBPF(t *testing.T) {
	l := newPodLab(t)
	dp := openKernelDataplane(t, "explain")
	cp := sharedCP(t)
	const node = "192.0.2.41"
	createNamespace(t, cp, "explain-ebpf")
	a := startAgent(t, cp, agentOptions{nodeIP: node, dp: dp}) // nil resolver: podif.NewRouteResolver
	pe := ingressPE("explain-ebpf", "web", []v1alpha1.PodEndpoint{pod(node, l.podIP)}, l.hostIP+"/32", 8080)
	create(t, cp, pe)
	var ex explain.ObjectExplain
	testenv.Eventually(t, 20*time.Second, "web programmed with a report", func() bool {
		ex = a.c.ExplainObject(report.KindPolicyEndpoint, "explain-ebpf", "web")
		return ex.Programmed && len(ex.Reports) == 1
	})
	r := ex.Reports[0]
	last := r.Attempts[len(r.Attempts)-1]
	if p := last.Phases; p.Attach <= 0 || p.Compile <= 0 || p.Write <= 0 || p.Switch <= 0 || p.Merge <= 0 {
		t.Errorf("phases of the first commit to a new pod = %+v: want merge, compile, attach, write and switch measured", p)
	}
	if sum := last.Phases.Merge + last.Phases.Compile + last.Phases.Attach + last.Phases.Write + last.Phases.Switch + last.Phases.Cleanup; sum > last.Duration {
		t.Errorf("phases sum to %v, more than the attempt's %v under the lock", sum, last.Duration)
	}
	if pod := a.c.ExplainPod(explain.PodQuery{IP: addr(l.podIP)}); !pod.Programmed || pod.Ifindex != l.hostIndex {
		t.Errorf("pod = %+v, want programmed on ifindex %d (%s)", pod, l.hostIndex, l.hostIf)
	}
}
