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

func TestUnmetSkipsByDefault(t *testing.T) {
	t.Setenv(EnvNoSkip, "")
	var r recordingTB
	Unmet(&r, "needs %s", "root")
	if r.skipped != "needs root" || r.failed != "" {
		t.Fatalf("skipped %q failed %q; want a skip saying why", r.skipped, r.failed)
	}
}

func TestUnmetFailsWhenRequired(t *testing.T) {
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
