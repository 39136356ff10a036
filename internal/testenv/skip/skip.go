// Package skip lets a test step aside when a prerequisite is missing (not root, a
// kernel feature, a tool that could not be built) — and turns that into a failure
// where every prerequisite is promised, so a test never passes by not running.
//
// With NPAGENT_TEST_NO_SKIP=1 in the environment (set by .ci/run, which runs as root
// on a machine where the tools build and the kernel has tcx), Unmet fails the test
// instead of skipping it. Skips for -short are not prerequisites and stay skips.
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
// NPAGENT_TEST_NO_SKIP=1.
func Unmet(tb testing.TB, format string, args ...any) {
	tb.Helper()
	reason := fmt.Sprintf(format, args...)
	if os.Getenv(EnvNoSkip) == "1" {
		tb.Fatalf("prerequisite missing where it is required (%s=1): %s", EnvNoSkip, reason)
		return
	}
	tb.Skip(reason)
}
