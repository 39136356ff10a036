package bpfmaps

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"

	"github.com/npagent/npagent/internal/testenv/netlab"
)

// passAllProgram is another tcx program, as a CNI would attach: it ends the chain
// with TCX_PASS for every packet, so whatever runs after it never sees one.
func passAllProgram(t *testing.T) *ebpf.Program {
	t.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "foreign_pass", Type: ebpf.SchedCLS, License: "MIT",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}, // TCX_PASS
	})
	if err != nil {
		t.Fatalf("load the foreign program: %v", err)
	}
	t.Cleanup(func() { _ = prog.Close() })
	return prog
}

// attachForeign attaches prog to both hooks of the interface as a program that names
// no anchor (appended at the tail), detached at cleanup.
func attachForeign(t *testing.T, ifindex int, prog *ebpf.Program) {
	t.Helper()
	for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
		l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: at})
		if err != nil {
			t.Fatalf("attach the foreign program at %v: %v", at, err)
		}
		t.Cleanup(func() { _ = l.Close() })
	}
}

func programID(t *testing.T, prog *ebpf.Program) ebpf.ProgramID {
	t.Helper()
	info, err := prog.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, ok := info.ID()
	if !ok {
		t.Fatal("program info has no id")
	}
	return id
}

// TestAttachRunsFirst: npagent attaches at the head of the tcx chain. With real
// packets: a foreign program that passes every packet (TCX_PASS ends the chain) is
// attached to the pod's interface before the pod's first commit, and another after
// it; npagent's programs are first at both hooks (tcx query), so the policy still
// drops the port it does not allow and the allowed port passes.
func TestAttachRunsFirst(t *testing.T) {
	lab := newTrafficLab(t)
	netlab.ServeEcho(t, lab.pod, "tcp4", labPod4+":8080")
	netlab.ServeEcho(t, lab.pod, "tcp4", labPod4+":8081")
	lab.enterNode(t) // attaching happens in the caller's network namespace

	before, after := passAllProgram(t), passAllProgram(t)
	attachForeign(t, lab.hostIfindex, before)
	e := openTestEBPF(t, EBPFOptions{})
	pol := PodPolicy{Ingress: DirectionPolicy{Isolated: true, Allow: []Rule{{CIDR: netip.MustParsePrefix("10.201.2.0/24"),
		Ports: []PortRule{{Protocol: ProtocolTCP, Port: 8080}}}}}}
	if _, err := e.Commit(lab.hostIfindex, pol); err != nil {
		t.Fatal(err)
	}
	attachForeign(t, lab.hostIfindex, after)

	for _, hook := range []struct {
		at   ebpf.AttachType
		prog *ebpf.Program
	}{{ebpf.AttachTCXIngress, e.objs.FromPod}, {ebpf.AttachTCXEgress, e.objs.ToPod}} {
		res, err := link.QueryPrograms(link.QueryOptions{Target: lab.hostIfindex, Attach: hook.at})
		if err != nil {
			t.Fatal(err)
		}
		var got []ebpf.ProgramID
		for _, p := range res.Programs {
			got = append(got, p.ID)
		}
		want := []ebpf.ProgramID{programID(t, hook.prog), programID(t, before), programID(t, after)}
		if len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
			t.Errorf("%v chain: program ids %v, want npagent's first: %v", hook.at, got, want)
		}
	}
	for port, allowed := range map[string]bool{"8080": true, "8081": false} {
		err := netlab.Exchange(lab.peer, "tcp4", labPod4+":"+port, trafficTimeout)
		if (err == nil) != allowed {
			t.Errorf("peer → pod tcp %s with a pass-all program attached before npagent's: exchange error %v, want allowed=%v", port, err, allowed)
		}
	}
}
