package telemetry

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/npagent/npagent/internal/report"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploggrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploghttp"
	otellog "go.opentelemetry.io/otel/log"
	"go.opentelemetry.io/otel/metric"
	sdklog "go.opentelemetry.io/otel/sdk/log"
	"go.opentelemetry.io/otel/sdk/resource"
)

// Flow events: the dataplane's denials (and, when asked, new allowed flows), named
// by the reconcile loop (report.FlowEvent), emitted as OpenTelemetry log records
// (event name FlowLogEvent) through the Logs SDK's batch processor: its queue is
// bounded and drops the oldest record when full, so a dead collector never blocks
// the caller. Attribute names follow the semantic conventions where they exist;
// the rest share the verdict counters' npagent.* names, so a log record and the
// counter series it belongs to join on the same attributes.
const (
	// FlowLogEvent is every flow record's event name (not an instrument).
	FlowLogEvent = "npagent.flow"

	// FlowEventsEmittedName counts flow events named and handed to the log
	// records (and the file, when configured).
	FlowEventsEmittedName = "npagent.flow.events"
	// FlowEventsSuppressedName counts flow events the datapath did not report,
	// by reason: rate_limited (the pod's rate limit), buffer_full (the ring
	// buffer was full: the agent fell behind).
	FlowEventsSuppressedName = "npagent.flow.events.suppressed"
	// FlowEventsDroppedName counts flow events read from the datapath and
	// dropped before naming, by reason: queue_full.
	FlowEventsDroppedName = "npagent.flow.events.dropped"
	// FlowLogRecordsFailedName counts flow log records whose OTLP export failed.
	FlowLogRecordsFailedName = "npagent.flow.log_records.failed"
)

// Flow record attributes: semantic conventions first, then npagent's own (with
// the spans' PolicyNameKey, PolicyUIDKey, PolicyResourceVersionKey and
// TriggerTimeKey, and the verdict counters' keys).
const (
	SourceAddressKey      = attribute.Key("source.address")
	SourcePortKey         = attribute.Key("source.port")
	DestinationAddressKey = attribute.Key("destination.address")
	DestinationPortKey    = attribute.Key("destination.port")
	NetworkTransportKey   = attribute.Key("network.transport")
	NetworkTypeKey        = attribute.Key("network.type")
	NodeKey               = attribute.Key("k8s.node.name")

	FlowKindKey        = attribute.Key("npagent.flow.kind") // deny or new_flow
	PodAddressKey      = attribute.Key("npagent.pod.address")
	ICMPIDKey          = attribute.Key("npagent.icmp.id")
	PacketBytesKey     = attribute.Key("npagent.packet.bytes")
	PolicyNamespaceKey = attribute.Key("npagent.policy.namespace")
	PoliciesKey        = attribute.Key("npagent.policy.names")
	PolicyTierKey      = attribute.Key("npagent.policy.tier")
	AttributedKey      = attribute.Key("npagent.policy.attributed")
)

// FlowAttributes are the attributes of a flow record, in a fixed order; the JSON
// file uses the same names. Empty values are left out.
func FlowAttributes(ev *report.FlowEvent) []attribute.KeyValue {
	out := make([]attribute.KeyValue, 0, 28)
	str := func(k attribute.Key, v string) {
		if v != "" {
			out = append(out, k.String(v))
		}
	}
	str(NodeKey, ev.Node)
	str(NamespaceKey, ev.Namespace)
	str(PodKey, ev.Pod)
	if ev.PodIP.IsValid() {
		out = append(out, PodAddressKey.String(ev.PodIP.String()))
	}
	str(FlowKindKey, ev.Kind)
	str(VerdictKey, ev.Verdict)
	str(DirectionKey, ev.Direction)
	str(VerdictReasonKy, ev.Reason)
	if ev.Src.IsValid() {
		out = append(out, SourceAddressKey.String(ev.Src.String()), DestinationAddressKey.String(ev.Dst.String()))
		if ev.Src.Is4() {
			out = append(out, NetworkTypeKey.String("ipv4"))
		} else {
			out = append(out, NetworkTypeKey.String("ipv6"))
		}
		out = append(out, NetworkTransportKey.String(report.ProtocolName(ev.Protocol)))
	}
	if ev.SrcPort != 0 || ev.DstPort != 0 {
		out = append(out, SourcePortKey.Int(int(ev.SrcPort)), DestinationPortKey.Int(int(ev.DstPort)))
	}
	if ev.ICMPID != 0 {
		out = append(out, ICMPIDKey.Int(int(ev.ICMPID)))
	}
	out = append(out, PacketBytesKey.Int64(int64(ev.Length)))
	str(KindKey, ev.PolicyKind)
	str(PolicyNamespaceKey, ev.PolicyNamespace)
	str(PolicyNameKey, ev.PolicyName)
	str(PolicyUIDKey, ev.PolicyUID)
	if len(ev.Policies) > 1 {
		out = append(out, PoliciesKey.StringSlice(ev.Policies))
	}
	str(PolicyTierKey, ev.Tier)
	if ev.PolicyName != "" {
		out = append(out, RuleKey.Int(ev.RuleIndex))
	}
	str(PolicyResourceVersionKey, ev.ResourceVersion)
	if !ev.TriggerTime.IsZero() {
		out = append(out, TriggerTimeKey.String(ev.TriggerTime.UTC().Format(time.RFC3339Nano)))
	}
	out = append(out, AttributedKey.Bool(ev.Attributed))
	return out
}

// FlowMessage is a flow record's body: one line an operator reads.
func FlowMessage(ev *report.FlowEvent) string {
	what := ev.Verdict
	if ev.Kind == "new_flow" {
		what = "new flow allowed"
	}
	s := fmt.Sprintf("%s %s", ev.Direction, what)
	if ev.Pod != "" {
		s += fmt.Sprintf(" pod %s/%s", ev.Namespace, ev.Pod)
	}
	if ev.Src.IsValid() {
		s += fmt.Sprintf(" %s %s", report.ProtocolName(ev.Protocol), endpoint(ev.Src, ev.SrcPort))
		s += " -> " + endpoint(ev.Dst, ev.DstPort)
	}
	s += ": " + ev.Reason
	if ev.PolicyName != "" {
		name := ev.PolicyName
		if ev.PolicyNamespace != "" {
			name = ev.PolicyNamespace + "/" + name
		}
		s += fmt.Sprintf(" by %s %s", ev.PolicyKind, name)
		if ev.RuleIndex >= 0 {
			s += fmt.Sprintf(" rule %d", ev.RuleIndex)
		}
	}
	return s
}

func endpoint(a netip.Addr, port uint16) string {
	if port == 0 {
		return a.String()
	}
	return netip.AddrPortFrom(a, port).String()
}

// flowLogs is the flow records' provider and its counters.
type flowLogs struct {
	lp     *sdklog.LoggerProvider // nil: no log exporter (OTLP logs off)
	logger otellog.Logger
	failed atomic.Uint64 // records whose export failed

	mu   sync.Mutex
	fill func(*report.FlowCounts)
}

// buildLogs makes the logger provider when OTLP logs are on or a test exporter is
// given.
func (t *Telemetry) buildLogs(ctx context.Context, res *resource.Resource) error {
	exporters := t.cfg.logExporters
	if t.cfg.otlpLogs() {
		exp, err := newLogExporter(ctx)
		if err != nil {
			return fmt.Errorf("telemetry: otlp log exporter: %w", err)
		}
		exporters = append(exporters, exp)
	}
	if len(exporters) == 0 {
		return nil
	}
	opts := []sdklog.LoggerProviderOption{sdklog.WithResource(res)}
	for _, exp := range exporters {
		health := &exportHealth{signal: "logs", effect: "flow records dropped and counted", logger: t.cfg.logger}
		opts = append(opts, sdklog.WithProcessor(sdklog.NewBatchProcessor(
			&countingLogExporter{Exporter: exp, failed: &t.flows.failed, health: health},
			sdklog.WithMaxQueueSize(t.cfg.logQueueSize))))
	}
	t.flows.lp = sdklog.NewLoggerProvider(opts...)
	t.flows.logger = t.flows.lp.Logger(ScopeName)
	return nil
}

// newLogExporter is newTraceExporter for logs.
func newLogExporter(ctx context.Context) (sdklog.Exporter, error) {
	protocol, err := otlpProtocol("LOGS")
	if err == nil {
		err = checkEndpoints("LOGS")
	}
	if err != nil {
		return nil, err
	}
	if protocol == protocolHTTPProtobuf {
		return otlploghttp.New(ctx)
	}
	return otlploggrpc.New(ctx, otlploggrpc.WithDialOption(collectorReconnect))
}

// countingLogExporter counts the records of failed exports.
type countingLogExporter struct {
	sdklog.Exporter
	failed *atomic.Uint64
	health *exportHealth
}

func (e *countingLogExporter) Export(ctx context.Context, records []sdklog.Record) error {
	err := e.Exporter.Export(ctx, records)
	if err != nil {
		e.failed.Add(uint64(len(records)))
	}
	e.health.observe(err)
	return err
}

var _ report.FlowSink = (*Telemetry)(nil)

// FlowsExported reports whether Flow exports anything: a log exporter is
// configured (OTLP logs on, or WithLogExporter).
func (t *Telemetry) FlowsExported() bool { return t.flows.logger != nil }

// Flow emits a flow event as a log record (report.FlowSink): severity WARN for a
// denial, INFO for a would-be denial and a new flow. Without a log exporter it
// does nothing. Never blocks.
func (t *Telemetry) Flow(ev *report.FlowEvent) {
	if t.flows.logger == nil {
		return
	}
	var r otellog.Record
	r.SetEventName(FlowLogEvent)
	r.SetTimestamp(ev.Time)
	r.SetObservedTimestamp(time.Now())
	sev, text := otellog.SeverityInfo, "INFO"
	if ev.Verdict == "deny" {
		sev, text = otellog.SeverityWarn, "WARN"
	}
	r.SetSeverity(sev)
	r.SetSeverityText(text)
	r.SetBody(attribute.StringValue(FlowMessage(ev)))
	r.AddAttributes(FlowAttributes(ev)...)
	t.flows.logger.Emit(context.Background(), r)
}

// ObserveFlows registers fill, which copies the flow events' counters (the
// datapath's suppressed events, the pipeline's emitted and dropped ones) at each
// collection. A later call replaces fill.
func (t *Telemetry) ObserveFlows(fill func(*report.FlowCounts)) error {
	f := &t.flows
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fill != nil {
		f.fill = fill
		return nil
	}
	f.fill = fill
	m := t.mp.Meter(ScopeName)
	emitted, err := m.Int64ObservableCounter(FlowEventsEmittedName, metric.WithUnit("{event}"),
		metric.WithDescription("Flow events (denied packets; new allowed flows with --flow-events=all) named and emitted as log records, and to the flow log file when configured."))
	if err != nil {
		return err
	}
	suppressed, err := m.Int64ObservableCounter(FlowEventsSuppressedName, metric.WithUnit("{event}"),
		metric.WithDescription("Flow events the datapath did not report, by reason: rate_limited (the pod's rate limit, --flow-events-rate and --flow-events-burst), buffer_full (the ring buffer was full: the agent fell behind)."))
	if err != nil {
		return err
	}
	dropped, err := m.Int64ObservableCounter(FlowEventsDroppedName, metric.WithUnit("{event}"),
		metric.WithDescription("Flow events read from the datapath and dropped before naming, by reason: queue_full (the agent fell behind)."))
	if err != nil {
		return err
	}
	failed, err := m.Int64ObservableCounter(FlowLogRecordsFailedName, metric.WithUnit("{record}"),
		metric.WithDescription("Flow log records whose OTLP export failed (the collector unreachable or refusing them)."))
	if err != nil {
		return err
	}
	rateLimited, bufferFull := metric.WithAttributes(ReasonKey.String("rate_limited")), metric.WithAttributes(ReasonKey.String("buffer_full"))
	queueFull := metric.WithAttributes(ReasonKey.String("queue_full"))
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		f.mu.Lock()
		fill := f.fill
		f.mu.Unlock()
		var c report.FlowCounts
		fill(&c)
		o.ObserveInt64(emitted, int64(c.Emitted))
		o.ObserveInt64(suppressed, int64(c.RateLimited), rateLimited)
		o.ObserveInt64(suppressed, int64(c.BufferFull), bufferFull)
		o.ObserveInt64(dropped, int64(c.QueueFull), queueFull)
		o.ObserveInt64(failed, int64(f.failed.Load()))
		return nil
	}, emitted, suppressed, dropped, failed)
	return err
}
