package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/telemetry"
)

// runCleanup is `npagent cleanup`: end npagent's enforcement on this node and remove
// what it keeps there, so that an uninstalled agent leaves no frozen policy behind.
// Pins and tcx links outlive the agent by design (enforcement survives a restart), so
// helm uninstall alone leaves every pod policed as it last was. It refuses while an
// agent runs on the node (it holds the pin directory). With --wait it then blocks
// until stopped, for a DaemonSet whose pods must stay up once they have cleaned.
func runCleanup(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	flags := flag.NewFlagSet("npagent cleanup", flag.ContinueOnError)
	flags.SetOutput(stderr)
	envOr := func(name, def string) string {
		if v := getenv(flagEnv[name]); v != "" {
			return v
		}
		return def
	}
	pinPath := flags.String("bpffs-path", envOr("bpffs-path", bpfmaps.DefaultPinPath), "the agent's bpffs directory [$"+flagEnv["bpffs-path"]+"]")
	stateFile := flags.String("state-file", envOr("state-file", defaultStateFile), "the agent's state file; its last-valid/ directory beside it goes too [$"+flagEnv["state-file"]+"]")
	socket := flags.String("debug-socket", debugSocketDefault(getenv), "the agent's debug socket [$"+flagEnv["debug-socket"]+"]")
	flowLog := flags.String("flow-log-file", envOr("flow-log-file", ""), "the agent's flow log file; its rotated copies beside it go too. Empty: none [$"+flagEnv["flow-log-file"]+"]")
	wait := flags.Bool("wait", false, "after cleaning, block until SIGTERM (for a cleanup DaemonSet)")
	flags.Usage = func() {
		fmt.Fprint(stderr, `Usage: npagent cleanup [--bpffs-path DIR] [--state-file FILE] [--debug-socket PATH] [--flow-log-file FILE] [--wait]

Ends npagent's enforcement on this node: detaches every program it attached to
pods' interfaces and removes its pins, its state file and last-valid versions, its
debug socket, and its flow log files when named. Every pod of the node is then
unpoliced. Refused while an agent runs on the node. Run it after stopping the agent
(the chart's cleanup value runs it on every node: docs in the chart's README).

Exit: 0 cleaned (or nothing to clean), 1 refused or failed, 2 usage.

Flags:
`)
		flags.PrintDefaults()
	}
	pos, err := parseInterspersed(flags, args)
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	if err == nil && len(pos) > 0 {
		err = fmt.Errorf("cleanup: unexpected argument %q", pos[0])
	}
	if err == nil && *flowLog != "" && !filepath.IsAbs(*flowLog) {
		err = fmt.Errorf("cleanup: --flow-log-file %q: want an absolute path, as the agent's", *flowLog)
	}
	if err != nil {
		return exitError{exitUsage, err}
	}

	cleaned, err := bpfmaps.Cleanup(*pinPath)
	if errors.Is(err, bpfmaps.ErrPinDirLocked) {
		return exitError{1, fmt.Errorf("cleanup: %w: stop the agent on this node first (helm uninstall, or the chart's cleanup value, which replaces it)", err)}
	}
	if err != nil {
		return exitError{1, err}
	}
	if cleaned.Pins == 0 {
		fmt.Fprintf(stdout, "nothing pinned under %s\n", *pinPath)
	} else {
		fmt.Fprintf(stdout, "detached npagent's programs from %d interfaces %v; removed %d pins and %s\n", len(cleaned.Detached), cleaned.Detached, cleaned.Pins, *pinPath)
	}
	var removed []string
	remove := func(path string, all bool) error {
		if path == "" {
			return nil
		}
		rm := os.Remove
		if all {
			rm = os.RemoveAll
		}
		if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err := rm(path); err != nil {
			return err
		}
		removed = append(removed, path)
		return nil
	}
	type step struct {
		path string
		all  bool
	}
	steps := []step{{*stateFile, false}, {lastValidDir(*stateFile), true}, {*socket, false}}
	if *flowLog != "" {
		flowFiles, err := telemetry.FlowFileNames(*flowLog)
		if err != nil {
			return exitError{1, fmt.Errorf("cleanup: %w", err)}
		}
		for _, f := range flowFiles {
			steps = append(steps, step{f, false})
		}
	}
	for _, step := range steps {
		if err := remove(step.path, step.all); err != nil {
			return exitError{1, fmt.Errorf("cleanup: %w", err)}
		}
	}
	if len(removed) > 0 {
		fmt.Fprintf(stdout, "removed %s\n", strings.Join(removed, ", "))
	} else {
		fmt.Fprintln(stdout, "no state file, last-valid versions, debug socket or flow log to remove")
	}
	if *wait {
		fmt.Fprintln(stdout, "cleaned; waiting for SIGTERM")
		<-ctx.Done()
	}
	return nil
}

// lastValidDir is where the agent keeps each object's last valid version: beside the
// seen-set's state file (both must outlive its container); "" without one.
func lastValidDir(stateFile string) string {
	if stateFile == "" {
		return ""
	}
	return filepath.Join(filepath.Dir(stateFile), "last-valid")
}
