package bpfmaps

import (
	"net/netip"
	"os"
	"slices"
	"strconv"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/npagent/npagent/internal/testenv/netlab"
)

// TestReusedIfindexNotInherited: with real packets, a pod is committed (its
// ingress allows port 8080 only) and the agent stops without removing it; while
// no agent runs the pod's veth is deleted and a new pod's veth is created with the
// same index (as a CNI may, or the kernel reusing it) and the same name. The next
// OpenEBPF drops the old pod's state instead of attaching it to the new interface:
// Adoption names the index as replaced, no program is attached, the old pod's
// connection table and identity record are gone, and the new pod is open (no
// object selects it yet) — port 8081 answers.
func TestReusedIfindexNotInherited(t *testing.T) {
	lab := newTrafficLab(t)
	netlab.ServeEcho(t, lab.pod, "tcp4", labPod4+":8080")
	netlab.ServeEcho(t, lab.pod, "tcp4", labPod4+":8081")
	lab.enterNode(t) // attaching and listing interfaces happen in the caller's network namespace

	check := func(stage string, want map[string]bool) {
		t.Helper()
		for _, port := range []string{"8080", "8081"} {
			err := netlab.Exchange(lab.peer, "tcp4", labPod4+":"+port, trafficTimeout)
			if (err == nil) != want[port] {
				t.Errorf("%s: peer → pod tcp %s: exchange error %v, want allowed=%v", stage, port, err, want[port])
			}
		}
	}
	pin := testPinPath(t)
	prev := openTestEBPF(t, EBPFOptions{PinPath: pin})
	pol := PodPolicy{Ingress: DirectionPolicy{Isolated: true, Allow: []Rule{{CIDR: netip.MustParsePrefix("10.201.2.0/24"),
		Ports: []PortRule{{Protocol: ProtocolTCP, Port: 8080}}}}}}
	if _, err := prev.Commit(lab.hostIfindex, pol); err != nil {
		t.Fatal(err)
	}
	check("committed", map[string]bool{"8080": true, "8081": false})
	if err := prev.Close(); err != nil {
		t.Fatal(err)
	}
	var ctPins []string
	for _, k := range ctKinds {
		ctPins = append(ctPins, ctPinPath(pin, ctRefOf(uint32(lab.hostIfindex), k)))
	}
	for _, p := range ctPins {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("the pod's connection table is not pinned: %v", err)
		}
	}

	// The old pod goes, a new one comes on the same index, while no agent runs.
	idx := strconv.Itoa(lab.hostIfindex)
	netlab.Run(t, "ip", "-n", lab.node, "link", "del", "h1")
	netlab.Run(t, "ip", "-n", lab.node, "link", "add", "h1", "index", idx, "type", "veth", "peer", "name", "eth0", "netns", lab.pod)
	netlab.Run(t, "ip", "-n", lab.node, "addr", "add", "10.201.1.1/24", "dev", "h1")
	netlab.Run(t, "ip", "-n", lab.node, "link", "set", "h1", "up")
	netlab.Run(t, "ip", "-n", lab.pod, "addr", "add", labPod4+"/24", "dev", "eth0")
	netlab.Run(t, "ip", "-n", lab.pod, "link", "set", "eth0", "up")
	netlab.Run(t, "ip", "-n", lab.pod, "route", "add", "default", "via", "10.201.1.1")

	e := openTestEBPF(t, EBPFOptions{PinPath: pin})
	if got := e.Pods(); len(got) != 0 {
		t.Errorf("adopted pods %v: the new interface inherited the old pod's state", got)
	}
	if a := e.Adoption(); !slices.Equal(a.Replaced, []int{lab.hostIfindex}) || len(a.Reattached) != 0 || len(a.Vanished) != 0 || a.Pods != 0 {
		t.Errorf("Adoption %+v, want Pods 0 and Replaced [%d] only", a, lab.hostIfindex)
	}
	for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
		if n := len(attachedPrograms(t, lab.hostIfindex, at)); n != 0 {
			t.Errorf("%d programs attached to the new interface at %v, want 0", n, at)
		}
	}
	for _, p := range ctPins {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("the old pod's connection table is still pinned: %v", err)
		}
	}
	if _, ok := e.idents.lookup(uint32(lab.hostIfindex)); ok {
		t.Errorf("the old pod's interface identity is still recorded")
	}
	check("new pod on the reused index", map[string]bool{"8080": true, "8081": true})

	// Its first commit attaches afresh and records the new interface.
	if _, err := e.Commit(lab.hostIfindex, pol); err != nil {
		t.Fatal(err)
	}
	check("new pod committed", map[string]bool{"8080": true, "8081": false})
	if _, ok := e.idents.lookup(uint32(lab.hostIfindex)); !ok {
		t.Errorf("the new interface's identity is not recorded")
	}
}
