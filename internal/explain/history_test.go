package explain

import (
	"fmt"
	"testing"
	"time"

	"github.com/npagent/npagent/internal/report"
)

// TestHistoryBounded: per uid at most maxVersions versions and maxReports reports
// (each with at most maxAttempts attempts), the newest kept; Forget drops the uid.
func TestHistoryBounded(t *testing.T) {
	var l History
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 20 {
		rv, trigger := fmt.Sprint(i), base.Add(time.Duration(i)*time.Second)
		l.Received("u", rv, trigger, true, base.Add(time.Duration(i)*time.Second+time.Millisecond))
		l.Synced("u", rv, trigger, Sync{Outcome: StateProgrammed, Pods: 1, SyncedAt: base.Add(time.Duration(i)*time.Second + 2*time.Millisecond)})
		attempts := make([]report.Attempt, i+1)
		for j := range attempts {
			attempts[j] = report.Attempt{Start: base, End: base.Add(time.Duration(j) * time.Millisecond), Err: fmt.Sprint(j)}
		}
		l.Reported(&report.Record{UID: "u", ResourceVersion: rv, Trigger: trigger, Attempts: attempts})
	}
	versions, reports := l.Snapshot("u")
	if len(versions) != maxVersions || versions[0].ResourceVersion != "12" || versions[maxVersions-1].ResourceVersion != "19" {
		t.Errorf("versions = %d, %s..%s; want the newest %d", len(versions), versions[0].ResourceVersion, versions[len(versions)-1].ResourceVersion, maxVersions)
	}
	if versions[maxVersions-1].Outcome != StateProgrammed {
		t.Errorf("newest version outcome %q", versions[maxVersions-1].Outcome)
	}
	if len(reports) != maxReports || reports[maxReports-1].ResourceVersion != "19" {
		t.Fatalf("reports = %+v; want the newest %d", reports, maxReports)
	}
	last := reports[maxReports-1]
	if len(last.Attempts) != maxAttempts || last.AttemptCount != 20 || last.Attempts[maxAttempts-1].Err != "19" {
		t.Errorf("attempts kept %d of %d, last %q: want the newest %d", len(last.Attempts), last.AttemptCount, last.Attempts[len(last.Attempts)-1].Err, maxAttempts)
	}
	l.Forget("u")
	if v, r := l.Snapshot("u"); v != nil || r != nil || len(l.byUID) != 0 || l.Holds("u") {
		t.Errorf("after Forget: %v %v", v, r)
	}
	var nilLog *History
	nilLog.Received("x", "1", base, false, base) // a loop built in parts: no panic
}

// TestHistoryRefine: the table's state refined by the version's last sync.
func TestHistoryRefine(t *testing.T) {
	var l History
	l.Synced("u", "1", time.Time{}, Sync{Outcome: StateNoLocalWork})
	l.Synced("u", "2", time.Time{}, Sync{Outcome: StateWaiting, Detail: "10.0.0.1"})
	l.Synced("u", "3", time.Time{}, Sync{Outcome: StateRejected, Detail: "bad"})
	for _, tc := range []struct{ rv, state, want, detail string }{
		{"1", StateProgrammed, StateNoLocalWork, ""},
		{"1", StateNotSynced, StateNoLocalWork, ""}, // a stub: the table holds nothing of it
		{"2", StateFailed, StateWaiting, "10.0.0.1"},
		{"3", StateRejected, StateRejected, "bad"},
		{"4", StateNotSynced, StateNotSynced, ""},
	} {
		if got, detail := l.Refine("u", tc.rv, tc.state); got != tc.want || detail != tc.detail {
			t.Errorf("Refine(%s, %s) = %s, %q; want %s, %q", tc.rv, tc.state, got, detail, tc.want, tc.detail)
		}
	}
}

func TestTraceID(t *testing.T) {
	for in, want := range map[string]string{
		"00-4bf92f3577b34da6a3ce929e0e9a0e4f-00f067aa0ba902b7-01": "4bf92f3577b34da6a3ce929e0e9a0e4f",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01": "",
		"00-4BF92F3577B34DA6A3CE929E0E9A0E4F-00f067aa0ba902b7-01": "",
		"garbage": "",
		"":        "",
	} {
		if got := TraceID(in); got != want {
			t.Errorf("TraceID(%q) = %q, want %q", in, got, want)
		}
	}
}
