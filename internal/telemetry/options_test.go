package telemetry

import (
	"testing"
	"time"
)

func TestOTLPEnabledFromEnvironment(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		env                  map[string]string
		opts                 []Option
		wantTraces, wantMetr bool
	}{
		{"nothing set", nil, nil, false, false},
		{"generic endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, nil, true, true},
		{"traces endpoint only", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4317"}, nil, true, false},
		{"metrics endpoint only", map[string]string{"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://c:4317"}, nil, false, true},
		{"traces exporter none", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_TRACES_EXPORTER": "none"}, nil, false, true},
		{"option off wins", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, []Option{WithOTLP(false)}, false, false},
		{"option on wins", nil, []Option{WithOTLP(true)}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
				"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER"} {
				t.Setenv(k, tc.env[k])
			}
			cfg := defaultConfig()
			for _, o := range tc.opts {
				o(&cfg)
			}
			if got := cfg.otlpTraces(); got != tc.wantTraces {
				t.Errorf("traces exported = %v, want %v", got, tc.wantTraces)
			}
			if got := cfg.otlpMetrics(); got != tc.wantMetr {
				t.Errorf("metrics exported = %v, want %v", got, tc.wantMetr)
			}
		})
	}
}

func TestDefaultsFromEnvironment(t *testing.T) {
	t.Setenv("OTEL_METRIC_EXPORT_INTERVAL", "")
	t.Setenv("OTEL_BSP_MAX_QUEUE_SIZE", "")
	cfg := defaultConfig()
	if cfg.meterInterval != 10*time.Second || cfg.spanQueueSize != 2048 || cfg.fastFraction != 1 || cfg.slowThreshold != 0 {
		t.Errorf("defaults: interval %v, queue %d, sampling %v/%v; want 10s, 2048, keep all",
			cfg.meterInterval, cfg.spanQueueSize, cfg.slowThreshold, cfg.fastFraction)
	}
	t.Setenv("OTEL_METRIC_EXPORT_INTERVAL", "2500")
	t.Setenv("OTEL_BSP_MAX_QUEUE_SIZE", "100")
	cfg = defaultConfig()
	if cfg.meterInterval != 2500*time.Millisecond || cfg.spanQueueSize != 100 {
		t.Errorf("from environment: interval %v, queue %d; want 2.5s, 100", cfg.meterInterval, cfg.spanQueueSize)
	}
	WithMeterExportInterval(time.Second)(&cfg)
	WithSampling(-time.Second, 7)(&cfg)
	if cfg.meterInterval != time.Second || cfg.slowThreshold != 0 || cfg.fastFraction != 1 {
		t.Errorf("options: interval %v, sampling %v/%v; want 1s and clamped 0/1", cfg.meterInterval, cfg.slowThreshold, cfg.fastFraction)
	}
}

func TestResourceHonoursEnvironment(t *testing.T) {
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=staging,service.instance.id=pod-xyz,service.version=env")
	t.Setenv("OTEL_SERVICE_NAME", "npagent-staging")
	tel := newInMemory(t) // sets WithServiceVersion("v0.0.0-test")
	tel.Report(record(base, "pe-res", 10*time.Millisecond))
	spans := tel.endedSpans(t)
	if len(spans) == 0 {
		t.Fatal("no spans")
	}
	res := attrMap(spans[0].Resource.Attributes())
	if got := res["deployment.environment.name"].AsString(); got != "staging" {
		t.Errorf("deployment.environment.name = %q, want staging (from OTEL_RESOURCE_ATTRIBUTES)", got)
	}
	if got := res["service.instance.id"].AsString(); got != "pod-xyz" {
		t.Errorf("service.instance.id = %q, want the environment's pod-xyz over the random default", got)
	}
	if got := res["service.name"].AsString(); got != "npagent-staging" {
		t.Errorf("service.name = %q, want OTEL_SERVICE_NAME's npagent-staging over the default", got)
	}
	if got := res["service.version"].AsString(); got != "v0.0.0-test" {
		t.Errorf("service.version = %q, want the option's v0.0.0-test over the environment", got)
	}

	t.Setenv("OTEL_SERVICE_NAME", "")
	tel = newInMemory(t, WithInstanceID("from-option"))
	tel.Report(record(base, "pe-res", 10*time.Millisecond))
	res = attrMap(tel.endedSpans(t)[0].Resource.Attributes())
	if got := res["service.instance.id"].AsString(); got != "from-option" {
		t.Errorf("service.instance.id = %q, want the option's over the environment", got)
	}
}
