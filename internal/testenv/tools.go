package testenv

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/npagent/npagent/internal/testenv/skip"
)

// RepoRoot is the root of the npagent checkout this package was compiled from.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

var (
	toolMu    sync.Mutex
	toolPaths = map[string]string{}
)

// ToolPath returns the path of a tool built by hack/tools.sh ("kube-apiserver", "etcd",
// "otelcol", "prometheus", "promtool", "jaeger"), building it first when it is not cached. A failed
// build skips the test with the build's output as the reason (a failure under
// NPAGENT_TEST_NO_SKIP=1); -short skips every test that needs a tool.
func ToolPath(tb testing.TB, name string) string {
	tb.Helper()
	if testing.Short() {
		tb.Skipf("-short: needs %s (a real process built from source)", name)
	}
	path, err := toolPath(name)
	if err != nil {
		skip.Unmet(tb, "testenv: %s is not available and could not be built: %v", name, err)
	}
	return path
}

func toolPath(name string) (string, error) {
	toolMu.Lock()
	defer toolMu.Unlock()
	if p, ok := toolPaths[name]; ok {
		return p, nil
	}
	cmd := exec.Command("bash", filepath.Join(RepoRoot(), "hack", "tools.sh"), name)
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	// Progress of a first build goes to the test's stderr, so a slow start is explained.
	cmd.Stderr = &stderr
	if testing.Verbose() {
		cmd.Stderr = os.Stderr
	}
	if err := cmd.Run(); err != nil {
		return "", &toolError{name: name, err: err, output: stderr.String()}
	}
	lines := strings.Fields(strings.TrimSpace(stdout.String()))
	if len(lines) == 0 {
		return "", &toolError{name: name, output: "hack/tools.sh printed no path"}
	}
	p := lines[len(lines)-1]
	toolPaths[name] = p
	return p, nil
}

type toolError struct {
	name   string
	err    error
	output string
}

func (e *toolError) Error() string {
	msg := "build " + e.name
	if e.err != nil {
		msg += ": " + e.err.Error()
	}
	if out := strings.TrimSpace(e.output); out != "" {
		msg += "\n" + out
	}
	return msg
}

func (e *toolError) Unwrap() error { return e.err }
