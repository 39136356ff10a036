// Package skip lets a test step aside when a prerequisite is missing (not root, a
// kernel feature, a tool that could not be built) — and turns that into a failure
// where every prerequisite is promised, so a test never passes by not running.
//
// With NPAGENT_TEST_NO_SKIP=1 in the environment (set by .ci/run, which runs as root
// on a machine where the tools build and the kernel has tcx), Unmet fails the test
// instead of skipping it. Skips for -short are not prerequisites and stay skips:
// -short is the unit tier (make unit), where a test that needs root, the kernel, a
// real apiserver or a built tool steps aside whoever runs it (Root, Unmet).
//
// Standard library only, so packages that must not import Kubernetes can use it.
package skip

import (
	"fmt"
	"os"
	"testing"
)

// EnvNoSkip is the environment variable that makes Unmet fail instead of skip.
const EnvNoSkip = "NPAGENT_TEST_NO_SKIP"

// Unmet skips the test, saying which prerequisite is missing — or fails it when
// NPAGENT_TEST_NO_SKIP=1, unless the run is -short (the unit tier, which promises
// no prerequisite).
func Unmet(tb testing.TB, format string, args ...any) {
	tb.Helper()
	reason := fmt.Sprintf(format, args...)
	if short() {
		tb.Skip("-short (unit tier): " + reason)
		return
	}
	if os.Getenv(EnvNoSkip) == "1" {
		tb.Fatalf("prerequisite missing where it is required (%s=1): %s", EnvNoSkip, reason)
		return
	}
	tb.Skip(reason)
}

// Root reports whether the test may act as root: the process runs as root and the
// run is not -short (make unit runs -short and uses no root even when root runs
// it, so that it stays fast and touches nothing of the host). A test gated on it
// calls Unmet when it is false.
func Root() bool { return os.Geteuid() == 0 && !short() }

// short is testing.Short; this package's own tests replace it.
var short = testing.Short
