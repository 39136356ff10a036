package main

import (
	"context"
	"log/slog"

	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/reconcile"
	"github.com/npagent/npagent/internal/report"
	"github.com/npagent/npagent/internal/telemetry"
)

// startFlows starts the flow event pipeline (--flow-events) when the dataplane
// reports events and something receives them: telemetry's log records (when OTLP
// logs are on), and --flow-log-file; the counters are exported then. stop waits for it to hand over what it read (ctx
// done first) and closes the file. A failure to start is logged: flow events are
// telemetry, never a reason to stop enforcing.
func startFlows(ctx context.Context, cfg config, ctrl *reconcile.Controller, dp bpfmaps.Dataplane, tel *telemetry.Telemetry, log *slog.Logger) (stop func()) {
	stop = func() {}
	if cfg.FlowEvents == bpfmaps.FlowEventsOff {
		return stop
	}
	src, ok := dp.(bpfmaps.FlowEventSource)
	if !ok {
		log.Info("flow events off: the dataplane polices no packet", "dataplane", cfg.Dataplane)
		return stop
	}
	var sinks []report.FlowSink
	if tel != nil && tel.FlowsExported() {
		sinks = append(sinks, tel)
	}
	var file *telemetry.FlowFile
	if cfg.FlowLogFile != "" {
		var err error
		file, err = telemetry.NewFlowFile(telemetry.FlowFileOptions{Path: cfg.FlowLogFile, MaxSizeMB: cfg.FlowLogMaxSize, MaxFiles: cfg.FlowLogMaxFiles})
		if err != nil {
			log.Error("--flow-log-file: flow events not written to a file", "err", err)
		} else {
			sinks = append(sinks, file)
		}
	}
	if len(sinks) == 0 {
		log.Info("flow events off: nothing receives them (no OTLP logs endpoint: OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_LOGS_ENDPOINT; no --flow-log-file)",
			"flow_events", cfg.FlowEvents.String())
		return stop
	}
	flows, err := ctrl.StartFlows(ctx, src, reconcile.FlowOptions{Node: cfg.NodeName, Sinks: sinks,
		Events: bpfmaps.FlowEventConfig{Mode: cfg.FlowEvents, Rate: cfg.FlowEventsRate, Burst: cfg.FlowEventsBurst}})
	if err != nil {
		log.Error("flow events not started", "err", err)
		if file != nil {
			_ = file.Close()
		}
		return stop
	}
	if tel != nil {
		if err := tel.ObserveFlows(flows.Counts); err != nil {
			log.Error("flow event counters not exported", "err", err)
		}
	}
	log.Info("flow events on", "flow_events", cfg.FlowEvents.String(), "rate", cfg.FlowEventsRate, "burst", cfg.FlowEventsBurst,
		"file", cfg.FlowLogFile)
	return func() {
		flows.Wait()
		if file != nil {
			if err := file.Close(); err != nil {
				log.Warn("close --flow-log-file", "err", err)
			}
		}
	}
}
