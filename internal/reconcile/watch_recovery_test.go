package reconcile

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/seen"
	"github.com/npagent/npagent/internal/testenv"
)

// TestWatchRecovery restarts the apiserver three times, 15 s apart, compacting etcd
// while it is down, and after each return writes a PolicyEndpoint and a
// ClusterPolicyEndpoint: each informer must deliver its write within 2 s of the
// apiserver being ready again. client-go's reflector backs off more after every
// failure it sees (0.8 s doubling, jittered, reset only after 2 minutes), so without
// a way around it the second or third return is seconds late.
func TestWatchRecovery(t *testing.T) {
	const (
		node    = "192.0.2.40"
		rounds  = 3
		period  = 15 * time.Second
		goal    = 2 * time.Second
		timeout = 45 * time.Second
	)
	cp := testenv.Start(t)
	createNamespace(t, cp, "recovery")
	a := startAgent(t, cp, agentOptions{nodeIP: node, resolver: newLookupTableResolver("10.1.40.1", 401)})
	pods := []v1alpha1.PodEndpoint{pod(node, "10.1.40.1")}
	pe := ingressPE("recovery", "pe", pods, "10.2.0.0/16", 80)
	cpe := &v1alpha1.ClusterPolicyEndpoint{
		ObjectMeta: metav1.ObjectMeta{Name: "recovery-cpe"},
		Spec: v1alpha1.ClusterPolicyEndpointSpec{
			PolicyRef: v1alpha1.ClusterPolicyReference{Name: "recovery"}, Tier: v1alpha1.TierAdmin, Priority: 5,
			Subject:              v1alpha1.ClusterPolicySubject{Namespaces: &metav1.LabelSelector{}},
			PodSelectorEndpoints: pods,
			Ingress:              []v1alpha1.ClusterEndpointInfo{{Action: v1alpha1.ClusterRuleActionDeny, CIDR: "10.2.66.0/24"}},
		},
	}
	create(t, cp, pe)
	create(t, cp, cpe)
	testenv.Eventually(t, 20*time.Second, "both objects reported", func() bool { return a.sink.recordCount() == 2 })

	updates := func(k report.Kind) uint64 { return a.c.Stats().Delivered(k, report.CauseUpdate) }
	var delays [rounds][report.NumKinds]time.Duration
	late := false
	for round := range rounds {
		roundStart := time.Now()
		cp.StopAPIServer(t)
		rev := cp.CompactEtcd(t)
		cp.StartAPIServer(t)
		ready := time.Now()
		before := [report.NumKinds]uint64{updates(report.KindPolicyEndpoint), updates(report.KindClusterPolicyEndpoint)}
		port := int32(81 + round)
		update(t, cp, pe, func(pe *v1alpha1.PolicyEndpoint) { pe.Spec.Ingress[0].Ports[0].Port = &port })
		update(t, cp, cpe, func(cpe *v1alpha1.ClusterPolicyEndpoint) { cpe.Spec.Priority = int32(6 + round) })
		var pending [report.NumKinds]bool
		for k := range pending {
			pending[k] = true
		}
		for deadline := ready.Add(timeout); pending[0] || pending[1]; time.Sleep(5 * time.Millisecond) {
			now := time.Now()
			for k := range report.Kind(report.NumKinds) {
				if pending[k] && updates(k) > before[k] {
					pending[k], delays[round][k] = false, now.Sub(ready)
				}
			}
			if now.After(deadline) {
				for k := range pending {
					if pending[k] {
						delays[round][k] = -1 // never delivered
					}
				}
				break
			}
		}
		t.Logf("round %d (etcd compacted at revision %d): delivered after the apiserver was ready: PolicyEndpoint %v, ClusterPolicyEndpoint %v",
			round+1, rev, delays[round][report.KindPolicyEndpoint].Round(time.Millisecond), delays[round][report.KindClusterPolicyEndpoint].Round(time.Millisecond))
		for _, d := range delays[round] {
			if d < 0 || d > goal {
				late = true
			}
		}
		if round < rounds-1 {
			time.Sleep(time.Until(roundStart.Add(period)))
		}
	}
	// Each return was a 410 (the watch cache starts afresh, etcd compacted) handled in
	// the ListWatch: the reflector's list-and-watch never ended, so it never backed off.
	var c report.Counts
	a.c.Counts(&c)
	for k, w := range c.Watch {
		t.Logf("%s watch: %+v", report.Kind(k), w)
		if w.Relists[report.RelistExpired] < rounds || w.Relists[report.RelistRestart] != 0 {
			t.Errorf("%s: relists %v (expired, restart), want >= %d expired and no reflector restart", report.Kind(k), w.Relists, rounds)
		}
	}
	// Established soon after: a watch reopened at the list's resourceVersion may
	// still be refused once by a restarted apiserver's watch cache that has not caught
	// up to it (too large: listed again in place), and this check may land in between.
	testenv.Eventually(t, 10*time.Second, "both watches established and not stalled after recovery", func() bool {
		a.c.Counts(&c)
		for _, w := range c.Watch {
			if !w.Established || w.Stalled {
				return false
			}
		}
		return true
	})
	if late {
		var b strings.Builder
		for round, ds := range delays {
			fmt.Fprintf(&b, "\n  round %d: PolicyEndpoint %v, ClusterPolicyEndpoint %v", round+1, fmtDelay(ds[0]), fmtDelay(ds[1]))
		}
		t.Errorf("an informer delivered later than %v after the apiserver was ready again:%s", goal, b.String())
	}
}

func fmtDelay(d time.Duration) string {
	if d < 0 {
		return "never"
	}
	return d.Round(time.Millisecond).String()
}

// TestWatchStallReported: with the apiserver down for longer than the stall bound,
// both informers' watches are reported stalled and down (WatchStalled, for /readyz,
// and Counts, for npagent.watch.stalled); once it is back they are open and not
// stalled. The bound is 3 s here; an open, quiet watch is judged against its own
// timeout plus the bound (TestQuietWatchNotStalled, TestWatchStalled).
func TestWatchStallReported(t *testing.T) {
	cp := testenv.Start(t)
	a := startAgent(t, cp, agentOptions{nodeIP: "192.0.2.41", watchStall: 3 * time.Second})
	if err := a.c.WatchProblem(time.Now()); err != nil {
		t.Errorf("stalled right after the initial list: %v", err)
	}
	cp.StopAPIServer(t)
	stopped := time.Now()
	var c report.Counts
	testenv.Eventually(t, 30*time.Second, "both watches stalled, down", func() bool {
		err := a.c.WatchProblem(time.Now())
		return err != nil && strings.Count(err.Error(), "watch stalled: down") == 2
	})
	t.Logf("reported stalled %v after the apiserver stopped: %v", time.Since(stopped).Round(100*time.Millisecond), a.c.WatchProblem(time.Now()))
	a.c.Counts(&c)
	for k, w := range c.Watch {
		if !w.Stalled || w.Established || w.Age < 3*time.Second {
			t.Errorf("%s while down: %+v, want stalled, not established, age > 3s", report.Kind(k), w)
		}
	}
	cp.StartAPIServer(t)
	testenv.Eventually(t, 15*time.Second, "watches open and not stalled", func() bool {
		var c report.Counts
		a.c.Counts(&c)
		return c.Watch[0].Established && c.Watch[1].Established && a.c.WatchProblem(time.Now()) == nil
	})
}

// TestQuietWatchNotStalled: an idle apiserver sends an open watch nothing — no
// event, and no bookmark while the resourceVersion it can vouch for does not move —
// yet the watch is healthy until its timeout: with a 3 s bound it is not reported
// stalled after 10 s of silence (while a watch down for 3 s is: TestWatchStallReported).
func TestQuietWatchNotStalled(t *testing.T) {
	cp := testenv.Start(t)
	a := startAgent(t, cp, agentOptions{nodeIP: "192.0.2.42", watchStall: 3 * time.Second})
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		if err := a.c.WatchProblem(time.Now()); err != nil {
			t.Fatalf("a quiet, open watch reported stalled: %v", err)
		}
	}
	var c report.Counts
	a.c.Counts(&c)
	for k, w := range c.Watch {
		t.Logf("%s after 10 s idle: %+v", report.Kind(k), w)
		if !w.Established || w.Stalled {
			t.Errorf("%s: established %v, stalled %v; want open, not stalled", report.Kind(k), w.Established, w.Stalled)
		}
	}
}

// TestWatchRefusedNamedInReadyz: an agent whose rights to PolicyEndpoints are
// withdrawn while it runs finds out when its watch is next opened (here: after an
// apiserver restart). /readyz (WatchProblem) then names the refusal at once, with the
// apiserver's reason — not a stall after --watch-stall-timeout, not an outage — and
// clears once the rights are back.
func TestWatchRefusedNamedInReadyz(t *testing.T) {
	cp := testenv.Start(t)
	ctx := context.Background()
	const user = "agent-rights-withdrawn"
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: user}, Rules: []rbacv1.PolicyRule{{
		APIGroups: []string{"networking.k8s.aws"}, Resources: []string{"policyendpoints", "clusterpolicyendpoints"}, Verbs: []string{"get", "list", "watch"}}}}
	binding := func() *rbacv1.ClusterRoleBinding {
		return &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: user},
			Subjects: []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: user}}}
	}
	for _, o := range []client.Object{role, binding()} {
		if err := cp.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	restConfig := rest.CopyConfig(cp.Config)
	restConfig.Impersonate = rest.ImpersonationConfig{UserName: user}
	set, err := seen.New(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(restConfig, Config{NodeName: "node-192.0.2.43", NodeIP: netip.MustParseAddr("192.0.2.43"), Dataplane: bpfmaps.NewMemory(),
		Seen: set, Logger: testLogger(t), WatchStallTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	t.Cleanup(func() { cancel(); <-done })
	testenv.Eventually(t, 30*time.Second, "synced with its rights", c.HasSynced)
	if err := c.WatchProblem(time.Now()); err != nil {
		t.Fatalf("watch problem while granted: %v", err)
	}

	if err := cp.Client.Delete(ctx, binding()); err != nil {
		t.Fatal(err)
	}
	cp.RestartAPIServer(t) // the watches are opened again, now without the rights
	var problem error
	testenv.Eventually(t, 30*time.Second, "readyz names the refusal", func() bool {
		problem = c.WatchProblem(time.Now())
		return problem != nil && strings.Contains(problem.Error(), "refused by the apiserver") && strings.Contains(problem.Error(), "forbidden")
	})
	t.Logf("readyz: %v", problem)

	if err := cp.Client.Create(ctx, binding()); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "the refusal cleared once the rights are back", func() bool {
		return c.WatchProblem(time.Now()) == nil
	})
}
