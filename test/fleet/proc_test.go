package fleet

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/npagent/npagent/internal/testenv"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat: 100 on
// every Linux architecture Go supports.
const clockTicks = 100

// cpuSeconds is a process's user plus system CPU time so far, from /proc/<pid>/stat;
// 0 once the process is gone.
func cpuSeconds(pid int) float64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name (field 2) is in parentheses and may hold spaces: the fields
	// counted from after its closing one start at field 3 (state).
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseFloat(f[11], 64) // field 14
	stime, _ := strconv.ParseFloat(f[12], 64) // field 15
	return (utime + stime) / clockTicks
}

// memStatus reads VmRSS and VmHWM (peak RSS) of a process, bytes; 0 once it is gone.
func memStatus(pid int) (rss, hwm int64) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		for key, to := range map[string]*int64{"VmRSS:": &rss, "VmHWM:": &hwm} {
			if v, ok := strings.CutPrefix(line, key); ok {
				if f := strings.Fields(v); len(f) > 0 {
					kb, _ := strconv.ParseInt(f[0], 10, 64) // "12345 kB"
					*to = kb << 10
				}
			}
		}
	}
	return rss, hwm
}

// childPID finds the child of this test process whose executable is named name:
// envtest starts kube-apiserver and etcd as children of the test, so other
// engineers' control planes on the machine never match.
func childPID(t testing.TB, name string) int {
	t.Helper()
	me := strconv.Itoa(os.Getpid())
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		status, err := os.ReadFile(filepath.Join(d, "status"))
		if err != nil || !strings.Contains(string(status), "\nPPid:\t"+me+"\n") {
			continue
		}
		exe, err := os.Readlink(filepath.Join(d, "exe"))
		if err != nil || filepath.Base(exe) != name && !strings.HasPrefix(filepath.Base(exe), name+"-") {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(d))
		return pid
	}
	t.Fatalf("no child process %s of the test (pid %s)", name, me)
	return 0
}

// apiserverBytes is what the apiserver says it sent for PolicyEndpoints since it
// started: the sizes of the watch events it wrote to every watcher
// (apiserver_watch_events_sizes, per watcher and event) plus those of its list
// responses (apiserver_response_sizes, verb LIST), both before TLS and compression;
// and, for TestRelayTier, who watches it.
type apiserverBytes struct {
	watch, list float64
	lists       float64 // LIST requests served (apiserver_request_total)
	events      float64 // watch events written, one per watcher and event (the sizes' count)
	watches     float64 // watches open now (apiserver_longrunning_requests, verb WATCH)
}

func (b apiserverBytes) total() float64 { return b.watch + b.list }

func scrapeAPIServer(t testing.TB, cs kubernetes.Interface) apiserverBytes {
	t.Helper()
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		t.Fatalf("apiserver /metrics: %v", err)
	}
	text := string(raw)
	return apiserverBytes{
		watch:   testenv.SumSamples(text, "apiserver_watch_events_sizes_sum", `resource="policyendpoints"`),
		list:    testenv.SumSamples(text, "apiserver_response_sizes_sum", `verb="LIST"`, `resource="policyendpoints"`),
		lists:   testenv.SumSamples(text, "apiserver_request_total", `verb="LIST"`, `resource="policyendpoints"`),
		events:  testenv.SumSamples(text, "apiserver_watch_events_sizes_count", `resource="policyendpoints"`),
		watches: testenv.SumSamples(text, "apiserver_longrunning_requests", `verb="WATCH"`, `resource="policyendpoints"`),
	}
}

func clientset(t testing.TB, rc *rest.Config) kubernetes.Interface {
	t.Helper()
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}
