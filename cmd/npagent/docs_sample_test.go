package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/npagent/npagent/internal/explain"
)

// checkBlock compares the fenced block after marker in path with want (or, under
// make docs, writes want there): the block is the lines between the fence after
// the marker line and its closing fence.
func checkBlock(t *testing.T, path, marker, want string) {
	t.Helper()
	b, err := os.ReadFile(repoFile(path))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, marker+"\n")
	if i < 0 {
		t.Fatalf("%s has no %q line", path, marker)
	}
	open := i + len(marker) + 1
	bodyStart := strings.Index(s[open:], "\n")
	if bodyStart < 0 || !strings.HasPrefix(s[open:], "```") {
		t.Fatalf("%s: no fenced block right after %q", path, marker)
	}
	bodyStart += open + 1
	end := strings.Index(s[bodyStart:], "```\n")
	if end < 0 {
		t.Fatalf("%s: the block after %q is not closed", path, marker)
	}
	end += bodyStart
	if got := s[bodyStart:end]; got != want {
		if updateDocs {
			if err := os.WriteFile(repoFile(path), []byte(s[:bodyStart]+want+s[end:]), 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
		t.Errorf("%s: the block after %q is stale: run make docs\ngot:\n%s\nwant:\n%s", path, marker, got, want)
	}
}

// TestExplainSampleInDocs: the explain sample in docs/reference/cli.md is what
// printObject prints for it, so the document cannot drift from the output.
func TestExplainSampleInDocs(t *testing.T) {
	at := time.Date(2026, 12, 1, 2, 50, 40, 0, time.UTC)
	trigger := at.Add(111764507 * time.Nanosecond)
	received := trigger.Add(10750 * time.Microsecond)
	yes := true
	a := explain.AttemptInfo{Start: received.Add(13400 * time.Nanosecond), LockWait: 300 * time.Nanosecond, Duration: 185100 * time.Nanosecond}
	a.Phases.Merge, a.Phases.Compile, a.Phases.Write, a.Phases.Switch, a.Phases.Cleanup =
		1900*time.Nanosecond, 18800*time.Nanosecond, 2200*time.Nanosecond, 2*time.Microsecond, 1200*time.Nanosecond
	const writer = "0af7651916cd43dd8448eb211c80319c"
	ex := explain.ObjectExplain{
		Node: "ip-10-0-1-7", At: at.Add(time.Second), Kind: "PolicyEndpoint", Namespace: "shop", Name: "web-abc12",
		UID: "76d8634b-5b1e-4c2a-9f4e-2d1c3a0b9e11", ResourceVersion: "224", PolicyRef: "web", Trigger: trigger,
		WriterTraceID: writer, State: explain.StateProgrammed, Programmed: true, LocalPods: []string{"10.0.1.23"},
		Versions: []explain.VersionInfo{{ResourceVersion: "224", Trigger: trigger, Received: received,
			Outcome: explain.StateProgrammed, SyncedAt: received.Add(300 * time.Microsecond), Pods: 1, LocalWork: &yes}},
		Consumed: trigger,
		Reports: []explain.ReportInfo{{UID: "76d8634b-5b1e-4c2a-9f4e-2d1c3a0b9e11", ResourceVersion: "224", Trigger: trigger,
			Latency: 11030 * time.Microsecond, Delivery: 10750 * time.Microsecond, Queue: 13400 * time.Nanosecond,
			Compute: 18300 * time.Nanosecond, Attempts: []explain.AttemptInfo{a}, AttemptCount: 1, Pods: 1, Entries: 1,
			WriterTraceID: writer}},
	}
	var b bytes.Buffer
	printObject(&b, &ex)
	checkBlock(t, "docs/reference/cli.md", "<!-- explain-object-sample -->", b.String())
}

// TestCommandUsageInDocs: docs/reference/cli.md shows each subcommand's --help as
// the command prints it (make docs rewrites it), so a new or changed flag of
// explain, wait or cleanup reaches the reference.
func TestCommandUsageInDocs(t *testing.T) {
	noEnv := func(string) string { return "" }
	for _, c := range []struct {
		marker string
		run    func(stderr *bytes.Buffer)
	}{
		{"<!-- explain-usage -->", func(stderr *bytes.Buffer) {
			_ = runExplain(context.Background(), []string{"-h"}, noEnv, io.Discard, stderr)
		}},
		{"<!-- explain-verdict-usage -->", func(stderr *bytes.Buffer) {
			_ = runExplain(context.Background(), []string{"verdict", "-h"}, noEnv, io.Discard, stderr)
		}},
		{"<!-- wait-usage -->", func(stderr *bytes.Buffer) { _, _ = parseWaitArgs([]string{"-h"}, noEnv, stderr) }},
		{"<!-- cleanup-usage -->", func(stderr *bytes.Buffer) {
			_ = runCleanup(context.Background(), []string{"-h"}, noEnv, io.Discard, stderr)
		}},
		{"<!-- relay-usage -->", func(stderr *bytes.Buffer) {
			_ = runRelay(context.Background(), []string{"-h"}, noEnv, stderr)
		}},
	} {
		var stderr bytes.Buffer
		c.run(&stderr)
		if !strings.HasPrefix(stderr.String(), "Usage: npagent ") {
			t.Fatalf("%s: --help printed %q", c.marker, stderr.String())
		}
		checkBlock(t, "docs/reference/cli.md", c.marker, stderr.String())
	}
}

// TestExplainVerdictSampleInDocs: the explain verdict sample in docs/reference/cli.md
// is what printVerdict prints for it.
func TestExplainVerdictSampleInDocs(t *testing.T) {
	v := explain.VerdictExplain{Node: "ip-10-0-1-7", At: time.Date(2026, 12, 1, 2, 50, 41, 0, time.UTC),
		From:     explain.VerdictEnd{Query: "pod/shop/web-0", IP: "10.0.1.23", Namespace: "shop", Name: "web-0", Pod: true, Local: true, Ifindex: 14},
		To:       explain.VerdictEnd{Query: "pod/shop/db-0", IP: "10.0.1.31", Namespace: "shop", Name: "db-0", Pod: true, Local: true, Ifindex: 17},
		Protocol: "TCP", Port: 5432, Verdict: explain.VerdictDeny,
		Checks: []explain.VerdictCheck{
			{Direction: "egress", Pod: "shop/web-0", Ifindex: 14, Managed: true, Verdict: "allow", Reason: "policy_allow", Generation: 41, Isolated: true,
				Objects: []explain.VerdictObject{{Kind: "PolicyEndpoint", Namespace: "shop", Name: "web-abc12", UID: "76d8634b-5b1e-4c2a-9f4e-2d1c3a0b9e11", Policy: "web", Rule: -1}},
				Match:   "TCP 5432", Attributed: true, Why: "allowed by the namespaced policy of pe/shop/web-abc12 (entry TCP 5432)"},
			{Direction: "ingress", Pod: "shop/db-0", Ifindex: 17, Managed: true, Verdict: "deny", Reason: "default_deny", Generation: 73, Isolated: true,
				Objects:    []explain.VerdictObject{{Kind: "PolicyEndpoint", Namespace: "shop", Name: "db-x7k2p", UID: "0c1f3e52-9d4b-4f7a-8a61-5b2e9c7d1f08", Policy: "db", Rule: -1}},
				Attributed: true, Why: "default deny: isolated by pe/shop/db-x7k2p, and no allow rule matches"},
		},
		Notes: []string{"judged as a new flow's first packet (TCP SYN, UDP datagram, ICMP echo request): packets of a connection one direction allowed pass the other as replies (conntrack_reply)"},
	}
	var b bytes.Buffer
	printVerdict(&b, &v)
	checkBlock(t, "docs/reference/cli.md", "<!-- explain-verdict-sample -->", b.String())
}
