package main

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/explain"
	"github.com/npagent/npagent/internal/testenv"
)

// podWindowAttempts is how many new pods the window test makes; at least one must
// be pinned sharply by the packets (a window within proberSlack), every one must
// agree with them.
const podWindowAttempts = 3

// TestPodWindowAgainstPackets measures the new-pod enforcement window against
// packets, as TestProberFlipLatency does for triggers: a peer sends the pod a
// datagram every 0.5 ms; a new pod appears (its window starts), then its
// PolicyEndpoint lists it and denies the peer. The first datagram dropped shows
// when the policy reached the kernel, and the window's reported end (explain's
// Window.Programmed, the histogram's point) must lie between the last datagram the
// open pod took and the first one dropped, within proberSlack. A new pod each
// round, on the same interface, as a recreated pod may get it.
func TestPodWindowAgainstPackets(t *testing.T) {
	skipIfShort(t)
	if raceDetector {
		t.Skip("timing test: the race detector stalls the 0.5 ms sender; run without -race (make test and make e2e run it in a plain pass of its own; make e2e-full)")
	}
	l := newNodeLab(t, "npw", 215)
	cp, a := l.startAgent(t, "--pod-condition")
	ctx := context.Background()
	debug := explain.NewClient(l.debugSocket)

	// The policy selects app=web and lists no pod yet: a new pod with the label is
	// Pending (selected, not listed), so its window is measured, not counted.
	proto, port := corev1.ProtocolTCP, int32(80)
	pe := &v1alpha1.PolicyEndpoint{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: v1alpha1.PolicyEndpointSpec{
			PolicyRef:    v1alpha1.PolicyReference{Name: "web", Namespace: "default"},
			PodSelector:  &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			PodIsolation: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			// The peer may reach TCP 80 only: the prober's UDP is denied once in force.
			Ingress: []v1alpha1.EndpointInfo{{CIDR: v1alpha1.NetworkAddress(l.peerIP), Ports: []v1alpha1.Port{{Protocol: &proto, Port: &port}}}},
		},
	}
	if err := cp.Client.Create(ctx, pe); err != nil {
		t.Fatal(err)
	}
	window := func(name string) *explain.PodWindow {
		var ex explain.PodExplain
		if err := debug.Get(ctx, "/v1/pod/default/"+name, &ex); err != nil {
			return nil
		}
		return ex.Window
	}
	list := func(name string) {
		t.Helper()
		if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(pe), pe); err != nil {
			t.Fatal(err)
		}
		pe.Spec.PodSelectorEndpoints = nil
		if name != "" {
			pe.Spec.PodSelectorEndpoints = []v1alpha1.PodEndpoint{{HostIP: v1alpha1.NetworkAddress(l.nodeIP), PodIP: v1alpha1.NetworkAddress(l.podIP), Name: name, Namespace: "default"}}
		}
		if err := cp.Client.Update(ctx, pe); err != nil {
			t.Fatalf("update default/web to list %q: %v", name, err)
		}
	}

	pr := startProber(t, l)
	time.Sleep(proberPeriod) // the first datagrams find the ARP entries made

	type round struct {
		// Just before the policy stopped listing the previous pod (zero in the first
		// round), the pod's status and the listing were written.
		reopened, created, listed time.Time
		win                       explain.PodWindow
		lo, hi                    int
	}
	rounds := make([]round, podWindowAttempts)
	var prev *corev1.Pod
	for i := range rounds {
		r := &rounds[i]
		if prev != nil {
			// The old pod goes and the policy lists no pod: the interface is open again.
			r.reopened = time.Now()
			list("")
			if err := cp.Client.Delete(ctx, prev, client.GracePeriodSeconds(0)); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, 20*time.Second, "the interface's policy removed", func() bool {
				var ex explain.PodExplain
				return debug.Get(ctx, "/v1/podip/"+l.podIP, &ex) == nil && ex.Ifindex == 0 && window(prev.Name) == nil
			})
			time.Sleep(proberPeriod)
		}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("web-%d", i), Labels: map[string]string{"app": "web"}},
			Spec: corev1.PodSpec{NodeName: testNodeName, Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}}}
		if err := cp.Client.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
		pod.Status.PodIP, pod.Status.PodIPs = l.podIP, []corev1.PodIP{{IP: l.podIP}}
		r.created = time.Now()
		if err := cp.Client.Status().Update(ctx, pod); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 20*time.Second, pod.Name+"'s window open", func() bool {
			w := window(pod.Name)
			return w != nil && w.Programmed.IsZero() && !w.Unselected
		})
		time.Sleep(proberPeriod / 2) // open: the datagrams still arrive
		r.listed = time.Now()
		list(pod.Name)
		testenv.Eventually(t, 20*time.Second, pod.Name+"'s window closed", func() bool {
			w := window(pod.Name)
			if w == nil || w.Programmed.IsZero() {
				return false
			}
			r.win = *w
			return true
		})
		time.Sleep(time.Until(r.listed.Add(proberPeriod)))
		prev = pod
	}
	ps := pr.stop(t)

	ms := func(d time.Duration) string { return fmt.Sprintf("%.3f ms", float64(d)/float64(time.Millisecond)) }
	var (
		errs  []string
		sharp int
		sum   float64
		tab   strings.Builder
	)
	fmt.Fprintf(&tab, "round  window        reported end−packets  packets' step\n")
	for i := range rounds {
		r := &rounds[i]
		end := len(ps)
		if i+1 < len(rounds) {
			end = firstAt(ps, rounds[i+1].reopened)
		}
		var err error
		if r.lo, r.hi, err = flipWindow(ps, firstAt(ps, r.listed), end, false); err != nil {
			errs = append(errs, fmt.Sprintf("round %d: %v", i, err))
			continue
		}
		lo, hi := ps[r.lo], ps[r.hi]
		step := hi.written.Sub(lo.sent)
		if step <= proberSlack {
			sharp++
		}
		if r.win.Source != "first_seen_ip" || r.win.NetworkReady.Before(r.created) || !r.win.NetworkReady.Before(r.listed) {
			errs = append(errs, fmt.Sprintf("round %d: network ready %s (%s), want first_seen_ip between the status write %s and the listing %s",
				i, r.win.NetworkReady.Format(time.RFC3339Nano), r.win.Source, r.created.Format(time.RFC3339Nano), r.listed.Format(time.RFC3339Nano)))
		}
		if !r.win.Programmed.After(lo.sent) {
			errs = append(errs, fmt.Sprintf("round %d: window reported closed %s before datagram %d, sent later, still reached the open pod", i, ms(lo.sent.Sub(r.win.Programmed)), r.lo))
		}
		if r.win.Programmed.After(hi.written.Add(proberSlack)) {
			errs = append(errs, fmt.Sprintf("round %d: window reported closed %s after the send of datagram %d, the first the policy dropped, returned (want ≤ %s)",
				i, ms(r.win.Programmed.Sub(hi.written)), r.hi, ms(proberSlack)))
		}
		sum += r.win.Programmed.Sub(r.win.NetworkReady).Seconds()
		fmt.Fprintf(&tab, "%5d  %12s  %20s  %13s\n", i, ms(r.win.Programmed.Sub(r.win.NetworkReady)), ms(r.win.Programmed.Sub(hi.sent)), ms(step))
	}
	t.Logf("%d new pods, %d datagrams every %v; window = network ready (first seen IP) to the policy's switch:\n%s", len(rounds), len(ps), proberInterval, tab.String())
	if len(errs) == 0 && sharp == 0 {
		errs = append(errs, fmt.Sprintf("no round's step was within %s: the sender stalled over every switch, the packets do not pin it", ms(proberSlack)))
	}
	// The histogram holds these windows, each once.
	_, body, err := nsGet(l.node, a.url+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	count := testenv.SumSamples(body, "npagent_pod_enforcement_latency_seconds_count", `npagent_pod_network_ready_source="first_seen_ip"`)
	got := testenv.SumSamples(body, "npagent_pod_enforcement_latency_seconds_sum", `npagent_pod_network_ready_source="first_seen_ip"`)
	if count != float64(len(rounds)) || math.Abs(got-sum) > 1e-6*float64(len(rounds)) {
		errs = append(errs, fmt.Sprintf("npagent_pod_enforcement_latency_seconds: count %v sum %.6f s, want %d windows summing to %.6f s (explain's)", count, got, len(rounds), sum))
	}
	if len(errs) > 0 {
		t.Errorf("new-pod windows disagree with the packets:\n%s", strings.Join(errs, "\n"))
	}
}
