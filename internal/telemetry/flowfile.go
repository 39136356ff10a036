package telemetry

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/npagent/npagent/internal/report"
	"gopkg.in/natefinch/lumberjack.v2"
)

// FlowFile writes flow events as JSON lines to a node-local file, rotated by size:
// what the AWS agent's users collect from its policy event logs, with the same
// names as the log records (FlowAttributes) plus "time", "severity" and "body".
// One object per line, keys in a fixed order. It implements report.FlowSink; a
// write that fails is counted (Failed), never retried.
type FlowFile struct {
	mu     sync.Mutex
	w      *lumberjack.Logger
	buf    []byte
	failed atomic.Uint64
}

var _ report.FlowSink = (*FlowFile)(nil)

// FlowFileOptions configures NewFlowFile.
type FlowFileOptions struct {
	// Path is the file; its directory must exist. Rotated files sit beside it,
	// named with their rotation time.
	Path string
	// MaxSizeMB is the size in megabytes past which the file is rotated. Default 10.
	MaxSizeMB int
	// MaxFiles is how many rotated files are kept besides the current one (older
	// ones are removed). Default 5.
	MaxFiles int
}

// NewFlowFile opens (creating or appending to) the flow log file.
func NewFlowFile(o FlowFileOptions) (*FlowFile, error) {
	if o.Path == "" || !filepath.IsAbs(o.Path) {
		return nil, fmt.Errorf("flow log file %q: want an absolute path", o.Path)
	}
	if o.MaxSizeMB <= 0 {
		o.MaxSizeMB = 10
	}
	if o.MaxFiles <= 0 {
		o.MaxFiles = 5
	}
	w := &lumberjack.Logger{Filename: o.Path, MaxSize: o.MaxSizeMB, MaxBackups: o.MaxFiles}
	// Open now, so a path that cannot be written fails at start, naming it.
	if _, err := w.Write(nil); err != nil {
		return nil, fmt.Errorf("flow log file %s: %w", o.Path, err)
	}
	return &FlowFile{w: w}, nil
}

// Flow writes one line (report.FlowSink). Called from one goroutine (the flow
// pipeline's), which the disk write may hold up; never the packet path.
func (f *FlowFile) Flow(ev *report.FlowEvent) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.buf = appendFlowJSON(f.buf[:0], ev)
	if _, err := f.w.Write(f.buf); err != nil {
		f.failed.Add(1)
	}
}

// Failed counts lines that could not be written.
func (f *FlowFile) Failed() uint64 { return f.failed.Load() }

// Close closes the file.
func (f *FlowFile) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.w.Close()
}

// appendFlowJSON appends ev as one JSON object and a newline.
func appendFlowJSON(b []byte, ev *report.FlowEvent) []byte {
	severity := "INFO"
	if ev.Verdict == "deny" {
		severity = "WARN"
	}
	b = append(b, `{"time":`...)
	b = appendJSON(b, ev.Time.UTC().Format(time.RFC3339Nano))
	b = append(b, `,"severity":`...)
	b = appendJSON(b, severity)
	b = append(b, `,"body":`...)
	b = appendJSON(b, FlowMessage(ev))
	for _, kv := range FlowAttributes(ev) {
		b = append(b, ',')
		b = appendJSON(b, string(kv.Key))
		b = append(b, ':')
		b = appendJSON(b, kv.Value.AsInterface())
	}
	return append(b, "}\n"...)
}

func appendJSON(b []byte, v any) []byte {
	j, err := json.Marshal(v)
	if err != nil {
		return append(b, "null"...)
	}
	return append(b, j...)
}

// flowFileBackupTime is the time in a rotated flow log file's name: lumberjack's
// (v2) backup name is the file's name with "-" and this before its extension, and
// ".gz" after it when compressed.
const flowFileBackupTime = "2006-01-02T15-04-05.000"

// FlowFileNames returns the flow log file at path and its rotated copies beside it
// (NewFlowFile's), those that exist: what to remove to leave no flow log behind.
// Other files in the directory are not named.
func FlowFileNames(path string) ([]string, error) {
	dir, base := filepath.Split(path)
	ext := filepath.Ext(base)
	prefix := strings.TrimSuffix(base, ext) + "-"
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("flow log files of %s: %w", path, err)
	}
	var names []string
	for _, e := range entries {
		name := e.Name()
		if name == base {
			names = append(names, path)
			continue
		}
		if !e.IsDir() && (isBackup(name, prefix, ext) || isBackup(name, prefix, ext+".gz")) {
			names = append(names, filepath.Join(dir, name))
		}
	}
	return names, nil
}

// isBackup reports whether name is prefix, a rotation time and ext.
func isBackup(name, prefix, ext string) bool {
	stamp, prefixed := strings.CutPrefix(name, prefix)
	stamp, suffixed := strings.CutSuffix(stamp, ext)
	if !prefixed || !suffixed {
		return false
	}
	_, err := time.Parse(flowFileBackupTime, stamp)
	return err == nil
}
