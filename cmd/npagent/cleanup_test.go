package main

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/npagent/npagent/internal/bpfmaps"
)

// TestCleanupCommand: `npagent cleanup` (the real binary) refuses while an agent
// holds the node's pins and removes nothing; once the agent is gone it detaches the
// programs the agent left enforcing, removes the pins, the state file, the
// last-valid directory and the debug socket, and says so; a second run has nothing
// to do.
func TestCleanupCommand(t *testing.T) {
	pin, ifindex := openDataplaneLab(t)
	bin := buildAgent(t)
	dir := t.TempDir()
	state := filepath.Join(dir, "seen.state")
	socket := filepath.Join(dir, "debug.sock")
	// The flow log, one rotated copy (lumberjack's name), and a file not npagent's.
	flowLog, flowRotated, notOurs := filepath.Join(dir, "log", "flows.log"), filepath.Join(dir, "log", "flows-2026-12-06T01-02-03.000.log.gz"), filepath.Join(dir, "log", "notes.log")
	for _, f := range []string{state, socket, filepath.Join(dir, "last-valid", "pe-ns-name"), flowLog, flowRotated, notOurs} {
		if err := os.MkdirAll(filepath.Dir(f), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cleanup := func() (string, error) {
		cmd := exec.Command(bin, "cleanup", "--bpffs-path", pin, "--state-file", state, "--debug-socket", socket, "--flow-log-file", flowLog)
		cmd.Env = []string{} // no NPAGENT_* from the test's environment
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	attached := func() int {
		n := 0
		for _, a := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
			res, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: a})
			if err != nil {
				t.Fatal(err)
			}
			n += len(res.Programs)
		}
		return n
	}

	dp, err := bpfmaps.OpenEBPF(bpfmaps.EBPFOptions{PinPath: pin})
	if err != nil {
		t.Fatal(err)
	}
	pol := bpfmaps.PodPolicy{Ingress: bpfmaps.DirectionPolicy{Isolated: true, Allow: []bpfmaps.Rule{{CIDR: netip.MustParsePrefix("10.1.0.0/16")}}}}
	if _, err := dp.Commit(ifindex, pol); err != nil {
		t.Fatal(err)
	}
	out, err := cleanup()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(out, "stop the agent on this node first") {
		t.Fatalf("cleanup while an agent holds the pins: %v\n%s\nwant exit 1 saying to stop the agent", err, out)
	}
	if _, err := os.Stat(state); err != nil || attached() != 2 {
		t.Fatalf("a refused cleanup removed something: state %v, %d programs attached", err, attached())
	}
	if err := dp.Close(); err != nil {
		t.Fatal(err)
	}

	out, err = cleanup()
	if err != nil {
		t.Fatalf("cleanup: %v\n%s", err, out)
	}
	if want := fmt.Sprintf("from 1 interfaces [%d]", ifindex); !strings.Contains(out, want) {
		t.Errorf("cleanup output does not say %q:\n%s", want, out)
	}
	if n := attached(); n != 0 {
		t.Errorf("%d programs attached after cleanup", n)
	}
	for _, p := range []string{pin, state, filepath.Join(dir, "last-valid"), socket, flowLog, flowRotated} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after cleanup: %v, want it gone", p, err)
		}
	}
	if _, err := os.Stat(notOurs); err != nil {
		t.Errorf("cleanup removed a file beside the flow log that is not npagent's: %v", err)
	}
	if out, err := cleanup(); err != nil || !strings.Contains(out, "nothing pinned under") || strings.Contains(out, "removed /") {
		t.Errorf("second cleanup: %v\n%s\nwant nothing to do", err, out)
	}
}

// TestCleanupFlowLogRelative: a relative --flow-log-file is a usage error, said before
// anything is cleaned (the agent refuses one too); pure logic, no bpffs touched.
func TestCleanupFlowLogRelative(t *testing.T) {
	var stdout, stderr strings.Builder
	pins := filepath.Join(t.TempDir(), "pins") // never created: nothing is cleaned
	err := runCleanup(t.Context(), []string{"--bpffs-path", pins, "--flow-log-file", "flows.log"}, func(string) string { return "" }, &stdout, &stderr)
	var exit exitError
	if !errors.As(err, &exit) || exit.code != exitUsage || !strings.Contains(err.Error(), `--flow-log-file "flows.log": want an absolute path`) {
		t.Errorf("cleanup --flow-log-file flows.log: %v, want a usage error naming the flag", err)
	}
	if stdout.Len() != 0 {
		t.Errorf("cleanup printed %q before refusing its arguments", stdout.String())
	}
}
