package otlptest

import (
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	collogspb "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	colmetricspb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Sink is an OTLP/HTTP server inside the test: a collector's otlp_http exporter
// delivers to URL. It serves metrics also where Prometheus's OTLP receiver
// listens (/api/v1/otlp/v1/metrics), for configs that export there.
type Sink struct {
	URL string

	mu     sync.Mutex
	onLogs func(*collogspb.ExportLogsServiceRequest)
}

// OnLogs sets what each decoded logs request (/v1/logs) is passed to; until it is
// set, logs requests are answered and dropped.
func (s *Sink) OnLogs(fn func(*collogspb.ExportLogsServiceRequest)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onLogs = fn
}

// NewSink starts a sink that passes each decoded request to onTraces or
// onMetrics (either may be nil: the request is answered and dropped). A body
// that does not decode fails the test and is answered 400. The server is closed
// at cleanup.
func NewSink(tb testing.TB, onTraces func(*coltracepb.ExportTraceServiceRequest), onMetrics func(*colmetricspb.ExportMetricsServiceRequest)) *Sink {
	s := &Sink{}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", func(w http.ResponseWriter, r *http.Request) {
		var req coltracepb.ExportTraceServiceRequest
		if !decode(tb, w, r, &req) {
			return
		}
		if onTraces != nil {
			onTraces(&req)
		}
		write(w, &coltracepb.ExportTraceServiceResponse{})
	})
	metrics := func(w http.ResponseWriter, r *http.Request) {
		var req colmetricspb.ExportMetricsServiceRequest
		if !decode(tb, w, r, &req) {
			return
		}
		if onMetrics != nil {
			onMetrics(&req)
		}
		write(w, &colmetricspb.ExportMetricsServiceResponse{})
	}
	mux.HandleFunc("POST /v1/metrics", metrics)
	mux.HandleFunc("POST /api/v1/otlp/v1/metrics", metrics)
	mux.HandleFunc("POST /v1/logs", func(w http.ResponseWriter, r *http.Request) {
		var req collogspb.ExportLogsServiceRequest
		if !decode(tb, w, r, &req) {
			return
		}
		s.mu.Lock()
		fn := s.onLogs
		s.mu.Unlock()
		if fn != nil {
			fn(&req)
		}
		write(w, &collogspb.ExportLogsServiceResponse{})
	})
	srv := httptest.NewServer(mux)
	tb.Cleanup(srv.Close)
	s.URL = srv.URL
	return s
}

func decode(tb testing.TB, w http.ResponseWriter, r *http.Request, msg proto.Message) bool {
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			tb.Errorf("OTLP sink: gzip: %v", err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return false
		}
		body = zr
	}
	raw, err := io.ReadAll(body)
	if err == nil {
		err = proto.Unmarshal(raw, msg)
	}
	if err != nil {
		tb.Errorf("OTLP sink: decoding %s: %v", r.URL.Path, err)
		http.Error(w, err.Error(), http.StatusBadRequest)
		return false
	}
	return true
}

func write(w http.ResponseWriter, msg proto.Message) {
	raw, _ := proto.Marshal(msg)
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(raw)
}
