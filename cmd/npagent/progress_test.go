package main

import (
	"context"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/reconcile"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/seen"
	"github.com/npagent/npagent/internal/testenv"
)

// blockingDataplane is a test double: the in-memory dataplane whose Commit waits
// until release is closed, as a commit that hangs in the kernel would.
type blockingDataplane struct {
	bpfmaps.Dataplane
	entered chan struct{}
	release chan struct{}
}

func (d *blockingDataplane) Commit(ifindex int, p bpfmaps.PodPolicy) (bpfmaps.CommitResult, error) {
	select {
	case d.entered <- struct{}{}:
	default:
	}
	<-d.release
	return d.Dataplane.Commit(ifindex, p)
}

// fakeResolver is a test double: every pod IP is interface 7.
type fakeResolver struct{}

func (fakeResolver) Resolve(netip.Addr) (int, error) { return 7, nil }

// TestStuckWorkerFailsLiveness runs the real reconcile loop against a real apiserver
// with a commit that hangs: the loop's Progress shows the sync in flight, and the
// liveness rule fails it once the bound has passed (the clock is moved, not waited
// for); when the commit returns, the slot is idle and the loop alive again.
func TestStuckWorkerFailsLiveness(t *testing.T) {
	cp, _, _ := startControlPlane(t)
	dp := &blockingDataplane{Dataplane: bpfmaps.NewMemory(), entered: make(chan struct{}, 1), release: make(chan struct{})}
	set, err := seen.New(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ctrl, err := reconcile.New(cp.Config, reconcile.Config{
		NodeIP: netip.MustParseAddr(testNodeIP), Dataplane: dp, Seen: set, Sink: report.Discard{},
		Resolver: fakeResolver{}, Workers: 2, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ctrl.Run(ctx) }()
	released := false
	t.Cleanup(func() {
		if !released {
			close(dp.release)
		}
		cancel()
		<-done
	})
	testenv.Eventually(t, 30*time.Second, "caches synced", ctrl.HasSynced)

	const bound = 2 * time.Minute
	if err := stalled(ctrl.Progress(), time.Now().Add(time.Hour), bound); err != nil {
		t.Fatalf("an idle loop is stalled: %v", err)
	}
	before := time.Now()
	if err := cp.Client.Create(context.Background(), policyEndpoint("stuck", "10.250.0.1", time.Now())); err != nil {
		t.Fatal(err)
	}
	select {
	case <-dp.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("no commit began")
	}
	p := ctrl.Progress()
	var took time.Time
	for _, at := range p.InFlight {
		if !at.IsZero() {
			took = at
		}
	}
	if took.Before(before) || p.WorkersStarted.IsZero() {
		t.Fatalf("progress during the commit = %+v; want a sync in flight since %v", p, before)
	}
	if err := stalled(p, took.Add(bound/2), bound); err != nil {
		t.Errorf("within the bound: %v", err)
	}
	if err := stalled(p, took.Add(bound+time.Second), bound); err == nil || !strings.Contains(err.Error(), "one sync in flight") {
		t.Errorf("past the bound: stalled = %v, want the sync in flight named", err)
	}

	close(dp.release)
	released = true
	testenv.Eventually(t, 10*time.Second, "the sync to finish", func() bool {
		p := ctrl.Progress()
		for _, at := range p.InFlight {
			if !at.IsZero() {
				return false
			}
		}
		return !p.LastSyncDone.Before(took)
	})
	if err := stalled(ctrl.Progress(), time.Now().Add(time.Hour), bound); err != nil {
		t.Errorf("after the commit returned: %v", err)
	}
}
