package bpfmaps

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// exitLocked is the open child's exit code when the pin directory is locked.
const exitLocked = 3

// runOpenChild opens the dataplane on the pin path it is given and exits: 0 if it
// could, exitLocked if the pin directory is locked, 1 on another error.
func runOpenChild() int {
	e, err := OpenEBPF(EBPFOptions{PinPath: os.Getenv(childPinEnv)})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		if errors.Is(err, ErrPinDirLocked) {
			return exitLocked
		}
		return 1
	}
	_ = e.Close()
	return 0
}

// TestPinDirLockKeepsASecondProcessOut: while one process has the dataplane open, a
// second process opening the same pin directory gets ErrPinDirLocked with an error
// naming the directory; once the first closes (or exits), the second opens it. A
// second open in the same process is refused alike.
func TestPinDirLockKeepsASecondProcessOut(t *testing.T) {
	first := openTestEBPF(t, EBPFOptions{})
	pin := first.pinPath
	child := func() (int, string) {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"=open-and-exit", childPinEnv+"="+pin)
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return exit.ExitCode(), string(out)
		}
		if err != nil {
			t.Fatalf("child: %v\n%s", err, out)
		}
		return 0, string(out)
	}
	if code, out := child(); code != exitLocked || !strings.Contains(out, pin) || !strings.Contains(out, "another npagent") {
		t.Errorf("second process while the first holds the pins: exit %d, %q; want %d and an error naming %s", code, out, exitLocked, pin)
	}
	if again, err := OpenEBPF(EBPFOptions{PinPath: pin}); !errors.Is(err, ErrPinDirLocked) {
		t.Errorf("second open in the same process: %v, want ErrPinDirLocked", err)
		if again != nil {
			_ = again.Close()
		}
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	if code, out := child(); code != 0 {
		t.Errorf("second process after the first closed: exit %d\n%s", code, out)
	}
}
