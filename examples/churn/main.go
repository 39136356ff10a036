package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	sdkresource "go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/npagent/npagent/api/v1alpha1"
)

type options struct {
	kubeconfig       string
	namespace        string
	prefix           string
	objects          int
	static           int
	rate             float64
	duration         time.Duration
	hostIP           netip.Addr
	localPodIPs      []netip.Addr
	nodeName         string
	newPodIPs        []netip.Addr
	newPodsAt        float64
	remotePods       int
	recreateFraction float64
	triggerKey       string
	traceParentKey   string
	cleanup          bool
	summaryFile      string
	seed             uint64
}

// summary is what churn prints on stdout at the end.
type summary struct {
	TriggersWritten int     `json:"triggers_written"`
	Creates         int     `json:"creates"`
	Updates         int     `json:"updates"`
	Recreates       int     `json:"recreates"`
	Deletes         int     `json:"deletes"` // deletes of recreates and of --cleanup
	Conflicts       int     `json:"conflicts"`
	Retries         int     `json:"retries"` // writes retried while the apiserver was unreachable
	Errors          int     `json:"errors"`
	Objects         int     `json:"objects"`
	Seconds         float64 `json:"seconds"`
	Traced          bool    `json:"traced"`   // spans exported over OTLP
	NewPods         int     `json:"new_pods"` // Pod objects started mid-run (--new-pod-ips)
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	opts, err := parseOptions(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "churn: %v\n", err)
		os.Exit(2)
	}
	sum, err := churn(ctx, opts, log)
	out, _ := json.Marshal(sum)
	fmt.Println(string(out))
	if opts.summaryFile != "" {
		if werr := os.WriteFile(opts.summaryFile, append(out, '\n'), 0o644); werr != nil {
			fmt.Fprintf(os.Stderr, "churn: --summary-file: %v\n", werr)
			os.Exit(1)
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "churn: %v\n", err)
		os.Exit(1)
	}
}

func parseOptions(args []string) (options, error) {
	var o options
	var hostIP, podIPs, newPodIPs string
	fs := flag.NewFlagSet("churn", flag.ContinueOnError)
	fs.StringVar(&o.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file [$KUBECONFIG]")
	fs.StringVar(&o.namespace, "namespace", "default", "namespace of the PolicyEndpoints")
	fs.StringVar(&o.prefix, "prefix", "churn-", "name prefix of the PolicyEndpoints")
	fs.IntVar(&o.objects, "objects", 20, "how many PolicyEndpoints to create and then change")
	fs.IntVar(&o.static, "static-objects", 0, "how many more to create and never change (a relist re-delivers them unchanged)")
	fs.Float64Var(&o.rate, "rate", 10, "writes per second (creates included)")
	fs.DurationVar(&o.duration, "duration", 30*time.Second, "how long to write, from the start (the creates always complete)")
	fs.StringVar(&hostIP, "host-ip", "", "hostIP of the local pods: the node IP of the npagent under test (required)")
	fs.StringVar(&podIPs, "local-pod-ips", "", "comma-separated pod IPs on --host-ip, assigned to objects in turn (required)")
	fs.StringVar(&o.nodeName, "node-name", "", "node of the new pods (spec.nodeName): the npagent under test's --node-name (required with --new-pod-ips)")
	fs.StringVar(&newPodIPs, "new-pod-ips", "", "comma-separated IPs on --host-ip of pods that start mid-run: a Pod object each, then listed by the objects as the controller lists a new pod")
	fs.Float64Var(&o.newPodsAt, "new-pods-at", 0.3, "when the first new pod starts, as a fraction of --duration; the others follow one by one, evenly, until 0.9 of it")
	fs.IntVar(&o.remotePods, "remote-pods", 2, "pods per object on other nodes (198.51.100.0/24), which the agent must ignore")
	fs.Float64Var(&o.recreateFraction, "recreate-fraction", 0.1, "fraction of the changes that delete and recreate the object (new UID)")
	fs.StringVar(&o.triggerKey, "trigger-annotation", v1alpha1.AnnotationLastChangeTriggerTime, "trigger time annotation")
	fs.StringVar(&o.traceParentKey, "traceparent-annotation", v1alpha1.AnnotationTraceParent, "traceparent annotation; empty: none")
	fs.BoolVar(&o.cleanup, "cleanup", false, "delete the objects at the end")
	fs.StringVar(&o.summaryFile, "summary-file", "", "also write the JSON summary to this file")
	fs.Uint64Var(&o.seed, "seed", 0, "random seed for the choice of objects; 0: random")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	var errs []error
	ip, err := netip.ParseAddr(hostIP)
	if err != nil {
		errs = append(errs, fmt.Errorf("--host-ip: %q is not an IP address", hostIP))
	}
	o.hostIP = ip
	var ipErrs []error
	o.localPodIPs, ipErrs = parseIPs("--local-pod-ips", podIPs)
	errs = append(errs, ipErrs...)
	o.newPodIPs, ipErrs = parseIPs("--new-pod-ips", newPodIPs)
	errs = append(errs, ipErrs...)
	if len(o.newPodIPs) > 0 && o.nodeName == "" {
		errs = append(errs, errors.New("--new-pod-ips needs --node-name (the pods' spec.nodeName)"))
	}
	if !(o.newPodsAt >= 0 && o.newPodsAt <= 0.9) {
		errs = append(errs, fmt.Errorf("--new-pods-at: %v is outside 0..0.9", o.newPodsAt))
	}
	if len(o.localPodIPs) == 0 {
		errs = append(errs, errors.New("--local-pod-ips: need at least one IP"))
	}
	if o.kubeconfig == "" {
		errs = append(errs, errors.New("--kubeconfig (or $KUBECONFIG) is required"))
	}
	if o.objects < 1 {
		errs = append(errs, fmt.Errorf("--objects: %d, need at least 1", o.objects))
	}
	if o.static < 0 {
		errs = append(errs, fmt.Errorf("--static-objects: %d is negative", o.static))
	}
	if !(o.rate > 0) {
		errs = append(errs, fmt.Errorf("--rate: %v, need a positive number", o.rate))
	}
	if o.remotePods < 0 || o.remotePods > 250 {
		errs = append(errs, fmt.Errorf("--remote-pods: %d, need 0..250", o.remotePods))
	}
	if !(o.recreateFraction >= 0 && o.recreateFraction <= 1) {
		errs = append(errs, fmt.Errorf("--recreate-fraction: %v is outside 0..1", o.recreateFraction))
	}
	if o.seed == 0 {
		o.seed = mrand.Uint64()
	}
	return o, errors.Join(errs...)
}

// parseIPs reads a comma-separated list of IP addresses (blanks skipped), naming
// the flag in the error of each one that is not.
func parseIPs(flagName, list string) (ips []netip.Addr, errs []error) {
	for s := range strings.SplitSeq(list, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		ip, err := netip.ParseAddr(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %q is not an IP address", flagName, s))
			continue
		}
		ips = append(ips, ip)
	}
	return ips, errs
}

// driver holds what the writes share.
type driver struct {
	opts   options
	c      client.Client
	tracer trace.Tracer // nil: traceparents with random ids
	log    *slog.Logger
	sum    summary
	// newPodsStarted counts the new pods started (one by one, in order): the
	// objects' writes list those.
	newPodsStarted int
}

// newPodLabel labels each new pod with its name; the changing objects that will
// list new pod j select it by that label, so it is selected (its condition
// Pending) before they list it, and programmed once every one of them does.
const newPodLabel = "churn.npagent.io/new-pod"

func churn(ctx context.Context, o options, log *slog.Logger) (summary, error) {
	start := time.Now()
	rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{Precedence: filepath.SplitList(o.kubeconfig)}, nil).ClientConfig()
	if err != nil {
		return summary{}, fmt.Errorf("--kubeconfig %s: %w", o.kubeconfig, err)
	}
	// client-go's default client-side limit (5 QPS) would cap the write rate far
	// below --rate: an update is a get and a put.
	rc.QPS, rc.Burst = float32(max(4*o.rate, 50)), int(max(4*o.rate, 100))
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return summary{}, err
	}
	if err := corev1.AddToScheme(scheme); err != nil {
		return summary{}, err
	}
	c, err := client.New(rc, client.Options{Scheme: scheme})
	if err != nil {
		return summary{}, fmt.Errorf("client for %s: %w", rc.Host, err)
	}
	d := &driver{opts: o, c: c, log: log}

	if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" {
		tp, err := newTracerProvider(ctx)
		if err != nil {
			return summary{}, err
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := tp.Shutdown(sctx); err != nil {
				log.Warn("flush spans", "err", err)
			}
		}()
		d.tracer = tp.Tracer("github.com/npagent/npagent/examples/churn")
		d.sum.Traced = true
	}

	rng := mrand.New(mrand.NewPCG(o.seed, o.seed^0x9e3779b97f4a7c15))
	tick := time.NewTicker(time.Duration(float64(time.Second) / o.rate))
	defer tick.Stop()
	wait := func() bool {
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
			return true
		}
	}

	log.Info("churn: creating", "objects", o.objects, "static_objects", o.static, "namespace", o.namespace, "rate", o.rate, "seed", o.seed)
	// Objects o.objects.. are the static ones: created, never changed.
	for i := range o.objects + o.static {
		if !wait() {
			break
		}
		d.create(ctx, i, "create")
	}
	log.Info("churn: changing", "until", start.Add(o.duration).Format(time.RFC3339))
	for time.Since(start) < o.duration && wait() {
		if j := d.newPodsStarted; j < len(o.newPodIPs) && time.Since(start) >= d.newPodStart(j) {
			d.startNewPod(ctx, j)
		}
		i := rng.IntN(o.objects)
		if rng.Float64() < o.recreateFraction {
			d.recreate(ctx, i)
		} else {
			d.update(ctx, i, rng.IntN(1000))
		}
	}
	if o.cleanup {
		for i := range o.objects + o.static {
			d.delete(context.WithoutCancel(ctx), i)
		}
		for j := range d.sum.NewPods {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: newPodName(j), Namespace: o.namespace}}
			if err := d.c.Delete(context.WithoutCancel(ctx), pod, client.GracePeriodSeconds(0)); err != nil && !apierrors.IsNotFound(err) {
				d.sum.Errors++
				d.log.Error("delete Pod", "name", o.namespace+"/"+pod.Name, "err", err)
			}
		}
	}
	d.sum.Objects = o.objects + o.static
	d.sum.Seconds = time.Since(start).Seconds()
	log.Info("churn: done", "triggers_written", d.sum.TriggersWritten, "creates", d.sum.Creates,
		"updates", d.sum.Updates, "recreates", d.sum.Recreates, "errors", d.sum.Errors)
	if d.sum.Errors > 0 {
		return d.sum, fmt.Errorf("%d writes failed (see the log)", d.sum.Errors)
	}
	return d.sum, nil
}

func (d *driver) name(i int) string { return fmt.Sprintf("%s%03d", d.opts.prefix, i) }

func newPodName(j int) string { return fmt.Sprintf("new-%d", j) }

// newPodStart is when, from the start, new pod j starts: the first at
// --new-pods-at of the run, the others evenly until 0.9 of it, so the new-pod
// window's histogram keeps growing (a rate over it has points) and one may start
// while the apiserver restarts.
func (d *driver) newPodStart(j int) time.Duration {
	o := d.opts
	step := (0.9 - o.newPodsAt) / float64(len(o.newPodIPs))
	return time.Duration((o.newPodsAt + float64(j)*step) * float64(o.duration))
}

// startNewPod starts new pod j as a kubelet does, minus the containers: a Pod
// object on --node-name, then its IP in the status (the network is usable: the
// agent's new-pod window starts). Then every object selecting it lists it, as the
// controller does once it sees the pod; the window ends at the commit that has
// them all programmed.
func (d *driver) startNewPod(ctx context.Context, j int) {
	o := d.opts
	ip := o.newPodIPs[j]
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: newPodName(j), Namespace: o.namespace, Labels: map[string]string{newPodLabel: newPodName(j)}},
		Spec:       corev1.PodSpec{NodeName: o.nodeName, Containers: []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10"}}},
	}
	d.newPodsStarted++
	err := d.retry(ctx, func() error {
		if err := d.c.Create(ctx, pod); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, HostIP: o.hostIP.String(), PodIP: ip.String(), PodIPs: []corev1.PodIP{{IP: ip.String()}}}
		return d.c.Status().Update(ctx, pod)
	})
	if err != nil {
		d.sum.Errors++
		d.log.Error("start Pod", "name", o.namespace+"/"+pod.Name, "ip", ip, "err", err)
		return
	}
	d.sum.NewPods++
	for i := j; i < o.objects; i += len(o.newPodIPs) {
		d.update(ctx, i, 0)
	}
	d.log.Info("churn: new pod started and listed", "pod", o.namespace+"/"+pod.Name, "ip", ip, "node", o.nodeName)
}

// stamp starts the change's span (when tracing) and returns the annotations of a
// write made now: the trigger time and the traceparent.
func (d *driver) stamp(ctx context.Context, op string, i int) (map[string]string, func(error)) {
	now := time.Now()
	ann := map[string]string{d.opts.triggerKey: now.UTC().Format(time.RFC3339Nano)}
	end := func(error) {}
	var tp string
	if d.tracer != nil {
		sctx, span := d.tracer.Start(ctx, "policy.change", trace.WithTimestamp(now), trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(
				attribute.String("k8s.namespace.name", d.opts.namespace),
				attribute.String("npagent.policy.name", d.name(i)),
				attribute.String("churn.operation", op),
			))
		carrier := propagation.MapCarrier{}
		propagation.TraceContext{}.Inject(sctx, carrier)
		tp = carrier.Get("traceparent")
		end = func(err error) {
			if err != nil {
				span.RecordError(err)
			}
			span.End()
		}
	} else {
		tp = randomTraceParent()
	}
	if d.opts.traceParentKey != "" && tp != "" {
		ann[d.opts.traceParentKey] = tp
	}
	return ann, end
}

func (d *driver) spec(i, variant int) v1alpha1.PolicyEndpointSpec {
	o := d.opts
	pods := []v1alpha1.PodEndpoint{{
		HostIP: v1alpha1.NetworkAddress(o.hostIP.String()), PodIP: v1alpha1.NetworkAddress(o.localPodIPs[i%len(o.localPodIPs)].String()),
		Name: fmt.Sprintf("local-%d", i%len(o.localPodIPs)), Namespace: o.namespace,
	}}
	var selector *metav1.LabelSelector
	if len(o.newPodIPs) > 0 && i < o.objects { // the static objects never list new pods
		selector = &metav1.LabelSelector{MatchLabels: map[string]string{newPodLabel: newPodName(i % len(o.newPodIPs))}}
	}
	if j := i % max(1, len(o.newPodIPs)); selector != nil && j < d.newPodsStarted {
		pods = append(pods, v1alpha1.PodEndpoint{
			HostIP: v1alpha1.NetworkAddress(o.hostIP.String()), PodIP: v1alpha1.NetworkAddress(o.newPodIPs[j].String()),
			Name: newPodName(j), Namespace: o.namespace,
		})
	}
	for r := range o.remotePods {
		pods = append(pods, v1alpha1.PodEndpoint{
			HostIP: "198.51.100.1", PodIP: v1alpha1.NetworkAddress(fmt.Sprintf("198.51.100.%d", r+2)),
			Name: fmt.Sprintf("remote-%d", r), Namespace: o.namespace,
		})
	}
	tcp := corev1.ProtocolTCP
	port := int32(1024 + variant)
	return v1alpha1.PolicyEndpointSpec{
		PolicyRef:            v1alpha1.PolicyReference{Name: d.name(i), Namespace: o.namespace},
		PodSelector:          selector,
		PodIsolation:         []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		PodSelectorEndpoints: pods,
		Ingress: []v1alpha1.EndpointInfo{
			{CIDR: "10.0.0.0/8", Except: []v1alpha1.NetworkAddress{"10.66.0.0/16"}, Ports: []v1alpha1.Port{{Protocol: &tcp, Port: &port}}},
			{CIDR: v1alpha1.NetworkAddress(fmt.Sprintf("172.16.%d.0/24", variant%256))},
		},
	}
}

func (d *driver) create(ctx context.Context, i int, op string) bool {
	err := d.retry(ctx, func() error {
		ann, end := d.stamp(ctx, op, i)
		pe := &v1alpha1.PolicyEndpoint{
			ObjectMeta: metav1.ObjectMeta{Name: d.name(i), Namespace: d.opts.namespace, Annotations: ann},
			Spec:       d.spec(i, 0),
		}
		err := d.c.Create(ctx, pe)
		end(err)
		return err
	})
	if err != nil {
		d.sum.Errors++
		d.log.Error("create PolicyEndpoint", "name", d.opts.namespace+"/"+d.name(i), "err", err)
		return false
	}
	d.sum.TriggersWritten++
	if op == "create" {
		d.sum.Creates++
	}
	return true
}

// retry runs write until it succeeds, fails for a reason a retry cannot fix, or
// the apiserver has been unreachable for a minute (the demo restarts it: writes
// during the restart wait for it). Each try stamps a new trigger: a write that
// failed never happened.
func (d *driver) retry(ctx context.Context, write func() error) error {
	deadline := time.Now().Add(time.Minute)
	for {
		err := write()
		if err == nil || apierrors.IsConflict(err) || apierrors.IsNotFound(err) || apierrors.IsAlreadyExists(err) ||
			apierrors.IsInvalid(err) || apierrors.IsForbidden(err) || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		d.sum.Retries++
		d.log.Warn("write failed; retrying", "err", err)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// update changes the object's spec under a new trigger; a conflict (someone else
// wrote it) is retried on a fresh copy.
func (d *driver) update(ctx context.Context, i, variant int) {
	key := client.ObjectKey{Namespace: d.opts.namespace, Name: d.name(i)}
	for try := 0; try < 3; try++ {
		var pe v1alpha1.PolicyEndpoint
		if err := d.retry(ctx, func() error { return d.c.Get(ctx, key, &pe) }); err != nil {
			if apierrors.IsNotFound(err) { // a recreate lost its create: make it again
				d.create(ctx, i, "create")
				return
			}
			d.sum.Errors++
			d.log.Error("get PolicyEndpoint", "name", key.String(), "err", err)
			return
		}
		pe.Spec = d.spec(i, variant)
		err := d.retry(ctx, func() error {
			ann, end := d.stamp(ctx, "update", i)
			if pe.Annotations == nil {
				pe.Annotations = map[string]string{}
			}
			for k, v := range ann {
				pe.Annotations[k] = v
			}
			err := d.c.Update(ctx, &pe)
			end(err)
			return err
		})
		switch {
		case err == nil:
			d.sum.TriggersWritten++
			d.sum.Updates++
			return
		case apierrors.IsConflict(err):
			d.sum.Conflicts++
			continue
		default:
			d.sum.Errors++
			d.log.Error("update PolicyEndpoint", "name", key.String(), "err", err)
			return
		}
	}
}

func (d *driver) recreate(ctx context.Context, i int) {
	if !d.delete(ctx, i) {
		return
	}
	if d.create(ctx, i, "recreate") {
		d.sum.Recreates++
	}
}

func (d *driver) delete(ctx context.Context, i int) bool {
	pe := &v1alpha1.PolicyEndpoint{ObjectMeta: metav1.ObjectMeta{Name: d.name(i), Namespace: d.opts.namespace}}
	if err := d.retry(ctx, func() error { return d.c.Delete(ctx, pe) }); err != nil && !apierrors.IsNotFound(err) {
		d.sum.Errors++
		d.log.Error("delete PolicyEndpoint", "name", d.opts.namespace+"/"+pe.Name, "err", err)
		return false
	}
	d.sum.Deletes++
	return true
}

func newTracerProvider(ctx context.Context) (*sdktrace.TracerProvider, error) {
	exp, err := otlptracegrpc.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("otlp trace exporter: %w", err)
	}
	res, err := sdkresource.Merge(sdkresource.Default(),
		sdkresource.NewSchemaless(semconv.ServiceName("churn")))
	if err != nil {
		return nil, fmt.Errorf("resource: %w", err)
	}
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)), nil
}

// randomTraceParent is a valid, sampled W3C traceparent with random ids.
func randomTraceParent() string {
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		return ""
	}
	return "00-" + hex.EncodeToString(b[:16]) + "-" + hex.EncodeToString(b[16:]) + "-01"
}
