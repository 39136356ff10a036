package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/explain"
	"github.com/npagent/npagent/internal/testenv"
	"github.com/npagent/npagent/internal/testenv/netlab"
)

// TestExplainVerdictAgainstTraffic runs the agent (eBPF dataplane) with a
// PolicyEndpoint isolating a pod's ingress and allowing a peer on TCP 80 and UDP
// 5353, and asks `npagent explain verdict` (the binary, over the debug socket)
// about packets from the peer: for each, the answer is what the kernel did with a
// real packet — delivered or not — and names the counter the packet moved (its
// reason and object, in `explain pod`'s counters). The pod's egress (no policy) and
// the peer (no pod this agent knows) are explained as such; an unknown pod is exit
// 1, a bad --port exit 2.
func TestExplainVerdictAgainstTraffic(t *testing.T) {
	skipIfShort(t)
	l := newNodeLab(t, "npv", 221)
	for _, a := range []struct{ network, port string }{{"tcp4", "80"}, {"tcp4", "81"}, {"udp4", "5353"}, {"udp4", "5354"}} {
		netlab.ServeEcho(t, l.pod, a.network, net.JoinHostPort(l.podIP, a.port))
	}
	cp, a := l.startAgent(t)
	ctx := context.Background()
	tcp, udp, p80, p5353 := corev1.ProtocolTCP, corev1.ProtocolUDP, int32(80), int32(5353)
	pe := &v1alpha1.PolicyEndpoint{
		ObjectMeta: metav1.ObjectMeta{Name: "web-abc12", Namespace: "default",
			Annotations: map[string]string{v1alpha1.AnnotationLastChangeTriggerTime: time.Now().UTC().Format(time.RFC3339Nano)}},
		Spec: v1alpha1.PolicyEndpointSpec{
			PolicyRef:            v1alpha1.PolicyReference{Name: "web", Namespace: "default"},
			PodIsolation:         []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			PodSelectorEndpoints: []v1alpha1.PodEndpoint{{HostIP: v1alpha1.NetworkAddress(l.nodeIP), PodIP: v1alpha1.NetworkAddress(l.podIP), Name: "web-0", Namespace: "default"}},
			Ingress: []v1alpha1.EndpointInfo{{CIDR: v1alpha1.NetworkAddress(l.peerIP),
				Ports: []v1alpha1.Port{{Protocol: &tcp, Port: &p80}, {Protocol: &udp, Port: &p5353}}}},
		},
	}
	if err := cp.Client.Create(ctx, pe); err != nil {
		t.Fatalf("create PolicyEndpoint default/web-abc12: %v", err)
	}
	reach := func(network string, port int) error {
		return netlab.Exchange(l.peer, network, net.JoinHostPort(l.podIP, fmt.Sprint(port)), 400*time.Millisecond)
	}
	testenv.Eventually(t, 30*time.Second, "default/web-abc12 programmed: peer reaches TCP 80, not 81", func() bool {
		return reach("tcp4", 80) == nil && reach("tcp4", 81) != nil
	})
	testenv.Eventually(t, 60*time.Second, "the debug API answers (caches synced)", func() bool {
		var pod explain.PodExplain
		return explain.NewClient(l.debugSocket).Get(ctx, "/v1/pod/default/web-0", &pod) == nil
	})
	socket := "--debug-socket=" + l.debugSocket
	verdict := func(args ...string) (int, explain.VerdictExplain, string) {
		t.Helper()
		code, out, errOut := runSubcommand(t, 20*time.Second, append([]string{"explain", "verdict", socket, "--json"}, args...)...)
		var v explain.VerdictExplain
		if code <= 1 && errOut == "" {
			if err := json.Unmarshal([]byte(out), &v); err != nil {
				t.Fatalf("explain verdict %v --json: %v\n%s", args, err, out)
			}
		}
		return code, v, errOut
	}
	for _, c := range []struct {
		network, port string
		reason        string
	}{{"tcp4", "80", "policy_allow"}, {"tcp4", "81", "default_deny"}, {"udp4", "5353", "policy_allow"}, {"udp4", "5354", "default_deny"}} {
		proto := strings.TrimSuffix(c.network, "4")
		var port int
		fmt.Sscan(c.port, &port)
		delivered := reach(c.network, port) == nil
		code, v, errOut := verdict("--from", l.peerIP, "--to", "pod/default/web-0", "--port", c.port+"/"+proto)
		if errOut != "" || len(v.Checks) != 1 {
			t.Fatalf("%s %s: exit %d, %+v, stderr %q; want one check", c.network, c.port, code, v, errOut)
		}
		ch := v.Checks[0]
		if (v.Verdict == explain.VerdictAllow) != delivered || (code == 0) != delivered {
			t.Errorf("%s %s: the kernel delivered=%v; explain says %s (exit %d): %+v", c.network, c.port, delivered, v.Verdict, code, ch)
		}
		if ch.Direction != "ingress" || ch.Reason != c.reason || len(ch.Objects) != 1 || ch.Objects[0].Name != "web-abc12" ||
			ch.Objects[0].UID != string(pe.UID) || ch.Objects[0].Policy != "web" || !ch.Attributed || !v.To.Local || v.From.Pod {
			t.Errorf("%s %s: %+v; want ingress %s credited to pe/default/web-abc12 (policy web)", c.network, c.port, v, c.reason)
		}
		// The counter the real packet moved is the one explain named.
		var pod explain.PodExplain
		if err := explain.NewClient(l.debugSocket).Get(ctx, "/v1/pod/default/web-0", &pod); err != nil {
			t.Fatal(err)
		}
		moved := false
		for _, pv := range pod.Verdicts {
			moved = moved || pv.Direction == "ingress" && pv.Reason == ch.Reason && pv.Policy == "web" && pv.Packets > 0
		}
		if !moved {
			t.Errorf("%s %s: no ingress %s counter credited to web moved: %+v", c.network, c.port, ch.Reason, pod.Verdicts)
		}
	}
	// The printed form names the verdict, the reason and the object.
	code, out, _ := runSubcommand(t, 20*time.Second, "explain", "verdict", socket, "--from", l.peerIP, "--to", "pod/default/web-0", "--port", "81/tcp")
	if code != 1 || !strings.Contains(out, "DENY") || !strings.Contains(out, "default_deny") || !strings.Contains(out, "pe/default/web-abc12") {
		t.Errorf("explain verdict 81/tcp: exit %d\n%s\nwant exit 1, DENY, default_deny, pe/default/web-abc12", code, out)
	}
	// The pod's egress has no policy; the peer is no pod this agent knows.
	code, v, _ := verdict("--from", "pod/default/web-0", "--to", l.peerIP, "--port", "80/tcp")
	if code != 0 || v.Verdict != explain.VerdictAllow || len(v.Checks) != 1 || v.Checks[0].Direction != "egress" || v.Checks[0].Reason != "no_policy" ||
		!strings.Contains(strings.Join(v.Notes, "\n"), "not a pod this agent knows") {
		t.Errorf("egress of the pod: exit %d, %+v; want allow, no_policy, a note on the peer", code, v)
	}
	if code, _, errOut := runSubcommand(t, 20*time.Second, "explain", "verdict", socket, "--from", "pod/default/nope", "--to", l.podIP, "--port", "80/tcp"); code != 1 || !strings.Contains(errOut, "default/nope") {
		t.Errorf("unknown pod: exit %d, stderr %q; want 1 naming it", code, errOut)
	}
	if code, _, errOut := runSubcommand(t, 20*time.Second, "explain", "verdict", socket, "--from", l.peerIP, "--to", l.podIP, "--port", "80"); code != exitUsage || !strings.Contains(errOut, "--port") {
		t.Errorf("--port without a protocol: exit %d, stderr %q; want 2", code, errOut)
	}
	if code := a.stop(t); code != 0 {
		t.Fatalf("exit code after SIGTERM = %d, want 0", code)
	}
}
