package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/reconcile"
	"github.com/npagent/npagent/internal/testenv"
)

// The liveness rule is pure logic over a reconcile.Progress snapshot, so these tests
// build snapshots by hand and move a fake clock; the recording itself runs in every
// agent test (TestAgentLifecycle checks /livez on a healthy agent).

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

func TestStalled(t *testing.T) {
	const bound = 2 * time.Minute
	started := t0
	tests := []struct {
		name string
		p    reconcile.Progress
		now  time.Time
		want string // substring of the error; "" for alive
	}{
		{"before the workers start, a full queue is not stalled",
			reconcile.Progress{Queued: 100, InFlight: make([]time.Time, 2)}, t0.Add(time.Hour), ""},
		{"idle with an empty queue, long after the last sync",
			reconcile.Progress{WorkersStarted: started, LastSyncDone: t0.Add(time.Second), InFlight: make([]time.Time, 2)}, t0.Add(24 * time.Hour), ""},
		{"a sync in flight within the bound",
			reconcile.Progress{WorkersStarted: started, InFlight: []time.Time{{}, t0.Add(time.Minute)}}, t0.Add(time.Minute + bound), ""},
		{"a sync in flight beyond the bound",
			reconcile.Progress{WorkersStarted: started, InFlight: []time.Time{{}, t0.Add(time.Minute)}}, t0.Add(time.Minute + bound + time.Second), "worker slot 1: one sync in flight for 2m1s"},
		{"a stuck sync is caught even while other syncs finish",
			reconcile.Progress{WorkersStarted: started, LastSyncDone: t0.Add(10 * time.Minute), Queued: 3, InFlight: []time.Time{t0, {}}}, t0.Add(10 * time.Minute), "worker slot 0"},
		{"queued keys, syncs finishing",
			reconcile.Progress{WorkersStarted: started, LastSyncDone: t0.Add(5 * time.Minute), Queued: 7, InFlight: make([]time.Time, 2)}, t0.Add(6 * time.Minute), ""},
		{"queued keys, no sync finished within the bound",
			reconcile.Progress{WorkersStarted: started, LastSyncDone: t0.Add(5 * time.Minute), Queued: 7, InFlight: make([]time.Time, 2)}, t0.Add(8 * time.Minute), "loop wedged: 7 keys queued and no sync finished for 3m0s"},
		{"queued keys, no sync ever, counted from the workers' start",
			reconcile.Progress{WorkersStarted: started, Queued: 1, InFlight: make([]time.Time, 2)}, t0.Add(bound + time.Second), "loop wedged"},
		{"queued keys, no sync ever, within the bound of the start",
			reconcile.Progress{WorkersStarted: started, Queued: 1, InFlight: make([]time.Time, 2)}, t0.Add(bound), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := stalled(tt.p, tt.now, bound)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("stalled = %v, want alive", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("stalled = %v, want an error with %q", err, tt.want)
			}
		})
	}
}

// fakeLoop is a test double for the reconcile loop: a fixed Progress and sync state.
type fakeLoop struct {
	p            reconcile.Progress
	synced       bool
	localPending int
	watchStall   error
}

func (f *fakeLoop) Progress() reconcile.Progress { return f.p }
func (f *fakeLoop) HasSynced() bool              { return f.synced }
func (f *fakeLoop) LocalPending() int            { return f.localPending }
func (f *fakeLoop) WatchProblem(time.Time) error { return f.watchStall }

// TestReadyWaitsForLocalPods: with the caches synced and the dataplane ready,
// /readyz says not ready while objects selecting pods here are not programmed.
func TestReadyWaitsForLocalPods(t *testing.T) {
	h := newAgentHealth(time.Minute)
	h.now = func() time.Time { return t0 }
	loop := &fakeLoop{p: reconcile.Progress{WorkersStarted: t0, InFlight: make([]time.Time, 2)}, synced: true, localPending: 3}
	h.setLoop(loop, func() error { return nil })
	if _, err := h.ready(); err == nil || !strings.Contains(err.Error(), "3 objects selecting pods on this node not programmed") {
		t.Errorf("ready with 3 local objects not programmed = %v, want them named", err)
	}
	loop.localPending = 0
	if _, err := h.ready(); err != nil {
		t.Errorf("ready with every local object programmed = %v, want ready", err)
	}
}

// TestAgentHealthFollowsTheStart walks the probes through a start: waiting for the
// apiserver (alive, not ready, saying why), caches syncing, ready, a worker stuck
// (neither alive nor ready), shutting down.
func TestAgentHealthFollowsTheStart(t *testing.T) {
	h := newAgentHealth(time.Minute)
	now := t0
	h.now = func() time.Time { return now } // fake clock

	if err := h.live(); err != nil {
		t.Errorf("live while starting = %v, want alive", err)
	}
	h.setWaiting(errors.New("apiserver unreachable: https://10.0.0.1:6443: connection refused"))
	if err := h.live(); err != nil {
		t.Errorf("live while the apiserver is unreachable = %v, want alive", err)
	}
	if _, err := h.ready(); err == nil || !strings.Contains(err.Error(), "apiserver unreachable") {
		t.Errorf("ready while the apiserver is unreachable = %v, want it named", err)
	}

	loop := &fakeLoop{p: reconcile.Progress{InFlight: make([]time.Time, 2)}}
	dpErr := errors.New("dataplane ebpf not ready: attaching")
	h.setLoop(loop, func() error { return dpErr })
	if _, err := h.ready(); err == nil || !strings.Contains(err.Error(), "informer caches not synced") {
		t.Errorf("ready before sync = %v", err)
	}
	loop.synced = true
	if _, err := h.ready(); !errors.Is(err, dpErr) {
		t.Errorf("ready with the dataplane not ready = %v", err)
	}
	dpErr = nil
	loop.p.WorkersStarted = now
	if _, err := h.ready(); err != nil {
		t.Errorf("ready = %v, want ready", err)
	}
	h.addDegraded("telemetry: OTLP export off")
	if notes, err := h.ready(); err != nil || len(notes) != 1 {
		t.Errorf("ready degraded = %v %v, want ready with one note", notes, err)
	}

	// A failing check (the node's addresses do not fit): not ready, alive; its
	// note is listed either way.
	var checkErr error
	h.addCheck(func() (string, error) { return "node addresses: Node n not found", checkErr })
	if notes, err := h.ready(); err != nil || len(notes) != 2 {
		t.Errorf("ready with a passing check = %v %v, want ready with its note", notes, err)
	}
	checkErr = errors.New("node addresses: 77 do not fit")
	if _, err := h.ready(); err == nil || !strings.Contains(err.Error(), "do not fit") {
		t.Errorf("ready with a failing check = %v, want it named", err)
	}
	if err := h.live(); err != nil {
		t.Errorf("live with a failing check = %v, want alive", err)
	}
	checkErr = nil

	// A stalled watch: /readyz fails naming it, /livez does not.
	loop.watchStall = errors.New("ClusterPolicyEndpoint watch stalled: down, nothing received for 2m1s")
	if _, err := h.ready(); err == nil || !strings.Contains(err.Error(), "ClusterPolicyEndpoint watch stalled") {
		t.Errorf("ready with a stalled watch = %v, want it named", err)
	}
	if err := h.live(); err != nil {
		t.Errorf("live with a stalled watch = %v, want alive", err)
	}
	loop.watchStall = nil

	loop.p.InFlight[1] = now
	now = now.Add(time.Minute + time.Second)
	if err := h.live(); err == nil || !strings.Contains(err.Error(), "worker slot 1") {
		t.Errorf("live with a sync in flight for 61s (bound 1m) = %v, want not alive", err)
	}
	if _, err := h.ready(); err == nil || !strings.Contains(err.Error(), "stalled") {
		t.Errorf("ready with a stuck worker = %v, want stalled", err)
	}
	loop.p.InFlight[1], loop.p.LastSyncDone = time.Time{}, now
	if err := h.live(); err != nil {
		t.Errorf("live after the sync finished = %v", err)
	}

	h.setStopping()
	if _, err := h.ready(); err == nil || !strings.Contains(err.Error(), "shutting down") {
		t.Errorf("ready while stopping = %v", err)
	}
}

// TestUnsupportedKernelStaysUpNotReady: on a kernel without a feature npagent needs
// (bpfmaps.ErrKernelFeature; the error is made here — these machines have tcx — pure
// logic), the agent stays alive and never ready, /readyz naming the feature and the
// kernel, the log saying why, until it is told to stop, when it exits cleanly: no
// CrashLoopBackOff whose restarts cannot help.
func TestUnsupportedKernelStaysUpNotReady(t *testing.T) {
	h := newAgentHealth(time.Minute)
	var logs testenv.LogBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	kernelErr := fmt.Errorf("%w: tcx program attachment (Linux 6.6 or later), not in kernel 6.1.0", bpfmaps.ErrKernelFeature)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- unsupportedKernel(ctx, kernelErr, h, log, make(chan error)) }()

	testenv.Eventually(t, 5*time.Second, "readyz names the missing feature", func() bool {
		_, err := h.ready()
		return err != nil && strings.Contains(err.Error(), "not enforcing") && strings.Contains(err.Error(), "tcx") && strings.Contains(err.Error(), "6.1.0")
	})
	if err := h.live(); err != nil {
		t.Errorf("live on an unsupported kernel = %v, want alive (a restart cannot help)", err)
	}
	select {
	case err := <-done:
		t.Fatalf("returned %v before being told to stop", err)
	case <-time.After(100 * time.Millisecond):
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("stopping on an unsupported kernel: %v, want a clean exit", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("did not stop when told to")
	}
	if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "Linux 6.6") {
		t.Errorf("log %q: want an error naming the feature", logs.String())
	}
}
