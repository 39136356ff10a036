package skip

import (
	"fmt"
	"strings"
	"testing"
)

// recordingTB is a fake testing.TB for this unit test of pure logic: it records
// whether Skip or Fatalf was called instead of stopping the goroutine.
type recordingTB struct {
	testing.TB
	skipped, failed string
}

func (r *recordingTB) Helper()                        {}
func (r *recordingTB) Skip(args ...any)               { r.skipped = args[0].(string) }
func (r *recordingTB) Fatalf(format string, a ...any) { r.failed = fmt.Sprintf(format, a...) }

// notShort runs the test as outside -short, whatever the run's flag.
func notShort(t *testing.T) {
	t.Cleanup(func() { short = testing.Short })
	short = func() bool { return false }
}

func TestUnmetSkipsByDefault(t *testing.T) {
	notShort(t)
	t.Setenv(EnvNoSkip, "")
	var r recordingTB
	Unmet(&r, "needs %s", "root")
	if r.skipped != "needs root" || r.failed != "" {
		t.Fatalf("skipped %q failed %q; want a skip saying why", r.skipped, r.failed)
	}
}

func TestUnmetFailsWhenRequired(t *testing.T) {
	notShort(t)
	t.Setenv(EnvNoSkip, "1")
	var r recordingTB
	Unmet(&r, "needs %s", "root")
	if r.failed == "" || r.skipped != "" {
		t.Fatalf("skipped %q failed %q; want a failure", r.skipped, r.failed)
	}
	if !strings.Contains(r.failed, EnvNoSkip) {
		t.Errorf("failure %q does not name %s", r.failed, EnvNoSkip)
	}
}

// TestUnmetSkipsInTheUnitTier: under -short (make unit) a missing prerequisite is a
// skip even where NPAGENT_TEST_NO_SKIP=1 promises every prerequisite, and Root is
// false for root too: the unit tier needs none.
func TestUnmetSkipsInTheUnitTier(t *testing.T) {
	t.Cleanup(func() { short = testing.Short })
	short = func() bool { return true }
	t.Setenv(EnvNoSkip, "1")
	var r recordingTB
	Unmet(&r, "needs %s", "root")
	if r.failed != "" || !strings.Contains(r.skipped, "needs root") || !strings.Contains(r.skipped, "-short") {
		t.Fatalf("skipped %q failed %q; want a skip naming -short and the reason", r.skipped, r.failed)
	}
	if Root() {
		t.Error("Root() under -short: true, want false")
	}
}
