#!/usr/bin/env bash
# npagent end to end, on this machine, with no Docker and no internet:
#
#   etcd + kube-apiserver (CRDs installed) ─▶ npagent ─OTLP─▶ otel-collector ─▶ Prometheus
#        ▲                                     (eBPF as root,                 └▶ Jaeger
#        └── churn driver (PolicyEndpoints      on veth "pods")
#            with trigger + traceparent)
#
# The churn driver writes PolicyEndpoints selecting pods on this node; mid-run the
# apiserver is restarted, so every informer relists (the re-delivery storm). Then
# examples/demo/verify follows the chain: triggers written, reported, suppressed as
# redelivered, p50/p99 from Prometheus, an exemplar's trace from Jaeger as a span
# tree, and the churn driver's trace its span link (or, with
# DEMO_TRACE_PARENTING=child, its parent) leads to; Prometheus evaluates the SLO
# rules of deploy/prometheus (verify prints the cluster p50/p90/p99 they record)
# and verify runs every query of the Grafana dashboard deploy/grafana/npagent.json
# against it; then npagent explain shows, from the agent's debug socket, the slowest
# exemplar's object: its versions, pending triggers and last reports with their
# phases. Exit status non-zero when a link of that chain is broken, a dashboard
# query answers nothing, or explain cannot answer.
#
# Needs root: the pods are network namespaces with veth pairs and /32 routes, which
# is what npagent's route resolver maps pod IPs to; eBPF enforcement is used when it
# loads (else the in-memory dataplane, with a warning). Everything binds to
# 127.0.0.1 on free ports and writes under one temp dir; every process, netns,
# link and bpffs pin made here is removed on exit (DEMO_KEEP=1 keeps the temp dir
# with the logs).
#
# Knobs (environment): DEMO_OBJECTS (20), DEMO_STATIC_OBJECTS (10), DEMO_RATE writes/s (20), DEMO_DURATION s (40),
# DEMO_PODS (3), DEMO_NEW_PODS (2: pods that start mid-run, for the new-pod window), DEMO_DATAPLANE (auto|ebpf|memory), DEMO_RESTART_APISERVER (1; 0: no
# restart, and then every written trigger must be accounted for), DEMO_KEEP (0),
# DEMO_TRACE_PARENTING (link: npagent's default, a span link to the writer's trace; child).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OBJECTS=${DEMO_OBJECTS:-20}
STATIC=${DEMO_STATIC_OBJECTS:-10} # created once: the relist re-delivers them unchanged
RATE=${DEMO_RATE:-20}
DURATION=${DEMO_DURATION:-40} # seconds
PODS=${DEMO_PODS:-3}
NEW_PODS=${DEMO_NEW_PODS:-2} # their networks exist from the start; their Pod objects start mid-run
DATAPLANE=${DEMO_DATAPLANE:-auto}
RESTART=${DEMO_RESTART_APISERVER:-1}
KEEP=${DEMO_KEEP:-0}
PARENTING=${DEMO_TRACE_PARENTING:-link}
NODE_NAME=demo-node
NODE_IP=192.0.2.1 # the demo node's IP (TEST-NET-1): pods with this hostIP are local
SUFFIX=$(($$ % 10000))
BPFFS=/sys/fs/bpf/npagent-demo-$SUFFIX

log() { printf '[demo %s] %s\n' "$(date +%T)" "$*" >&2; }
die() {
	log "FAILED: $*"
	exit 1
}

[[ $EUID -eq 0 ]] || die "run as root: the demo's pods are network namespaces with veths and host routes (CAP_NET_ADMIN), and eBPF needs CAP_BPF"
for cmd in go ip curl; do
	command -v "$cmd" >/dev/null || die "$cmd not found in PATH"
done

WORK="$(mktemp -d "${TMPDIR:-/tmp}/npagent-demo.XXXXXX")"
LOGS="$WORK/logs"
mkdir -p "$LOGS" "$WORK/bin" "$WORK/prometheus" "$WORK/npagent"

declare -A PID=()
ORDER=()
NETNS=()
HOSTLINKS=()

# start NAME CMD...: runs CMD in the background, output in $LOGS/NAME.log.
start() {
	local name=$1
	shift
	"$@" >"$LOGS/$name.log" 2>&1 &
	PID[$name]=$!
	ORDER+=("$name")
}

# stop NAME: SIGTERM, then SIGKILL after 20s.
stop() {
	local name=$1 pid=${PID[$1]:-}
	[[ -n $pid ]] || return 0
	if kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null || true
		for _ in $(seq 200); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$pid" 2>/dev/null || true
	fi
	wait "$pid" 2>/dev/null || true
	unset "PID[$name]"
}

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	for ((i = ${#ORDER[@]} - 1; i >= 0; i--)); do
		stop "${ORDER[$i]}"
	done
	for l in "${HOSTLINKS[@]}"; do ip link del "$l" 2>/dev/null || true; done
	for n in "${NETNS[@]}"; do ip netns del "$n" 2>/dev/null || true; done
	rm -rf "$BPFFS" 2>/dev/null || true
	if [[ $rc -ne 0 ]]; then
		for f in "$LOGS"/*.log; do
			[[ -s $f ]] || continue
			log "--- last lines of $(basename "$f") ---"
			tail -n 15 "$f" >&2
		done
	fi
	if [[ $KEEP == 1 ]]; then
		log "kept $WORK (logs in $LOGS)"
	else
		rm -rf "$WORK"
	fi
	log "cleaned up (exit $rc)"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# free_port: a 127.0.0.1 TCP port nothing listens on and not handed out before.
USED_PORTS=" "
free_port() {
	local p
	while :; do
		p=$((20000 + RANDOM % 40000))
		[[ $USED_PORTS == *" $p "* ]] && continue
		if ! (: <"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			USED_PORTS+="$p "
			echo "$p"
			return
		fi
	done
}

# wait_until WHAT SECONDS CMD...: polls CMD every 0.5s.
wait_until() {
	local what=$1 secs=$2
	shift 2
	local deadline=$((SECONDS + secs))
	until "$@" >/dev/null 2>&1; do
		((SECONDS < deadline)) || die "timed out after ${secs}s waiting for $what"
		sleep 0.5
	done
}
alive() { kill -0 "${PID[$1]}" 2>/dev/null; }
http_ok() { curl -fs -o /dev/null --max-time 2 "$1"; }
port_open() { (: <"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# --- tools -------------------------------------------------------------------------
log "tools: kube-apiserver, etcd, otelcol, prometheus, jaeger (cached after the first run;"
log "       a cold build takes ~15 min for the first three, prometheus ~9 min, jaeger ~8 min)"
declare -A TOOL=()
for t in kube-apiserver etcd otelcol prometheus jaeger; do
	TOOL[$t]="$("$ROOT/hack/tools.sh" "$t" | tail -n 1)"
done

log "building npagent, churn, controlplane and verify"
VERSION="$(git -C "$ROOT" describe --tags --always --dirty 2>/dev/null || echo dev)"
(cd "$ROOT" && go build -ldflags "-X main.version=$VERSION" -o "$WORK/bin/npagent" ./cmd/npagent &&
	go build -o "$WORK/bin/" ./examples/churn ./examples/demo/controlplane ./examples/demo/verify)

# --- control plane -----------------------------------------------------------------
KUBECONFIG_FILE="$WORK/kubeconfig"
# No controller runs here, so the demo installs npagent's config/crd: schema-compatible
# with the controller's (api/v1alpha1's tests check it). In a cluster the controller
# installs its own CRDs.
log "starting etcd + kube-apiserver with the CRDs from config/crd (upstream-compatible)"
mkdir -p "$WORK/certs"
start controlplane "$WORK/bin/controlplane" --apiserver="${TOOL[kube-apiserver]}" --etcd="${TOOL[etcd]}" \
	--crd-dir="$ROOT/config/crd" --kubeconfig="$KUBECONFIG_FILE" --cert-dir="$WORK/certs"
wait_until "the control plane (see $LOGS/controlplane.log)" 180 test -s "$KUBECONFIG_FILE"
log "control plane up: $(grep -o 'apiserver=[^ ]*' "$LOGS/controlplane.log" | head -n 1)"

# --- Jaeger, Prometheus, collector --------------------------------------------------
JAEGER_OTLP=$(free_port) JAEGER_QUERY=$(free_port) JAEGER_QUERY_GRPC=$(free_port)
PROM=$(free_port) COL_GRPC=$(free_port) COL_HTTP=$(free_port) AGENT=$(free_port) AGENT_HEALTH=$(free_port)

log "starting Jaeger (memory storage; OTLP gRPC 127.0.0.1:$JAEGER_OTLP, query API 127.0.0.1:$JAEGER_QUERY)"
JAEGER_OTLP_GRPC_PORT=$JAEGER_OTLP JAEGER_QUERY_HTTP_PORT=$JAEGER_QUERY JAEGER_QUERY_GRPC_PORT=$JAEGER_QUERY_GRPC \
	start jaeger "${TOOL[jaeger]}" --config "$ROOT/examples/demo/jaeger.yaml"
wait_until "Jaeger's query API (see $LOGS/jaeger.log)" 60 http_ok "http://127.0.0.1:$JAEGER_QUERY/api/services"

log "starting Prometheus (OTLP receiver, exemplar storage, the SLO rules of deploy/prometheus; API 127.0.0.1:$PROM)"
start prometheus "${TOOL[prometheus]}" --config.file="$ROOT/examples/demo/prometheus.yml" \
	--storage.tsdb.path="$WORK/prometheus" --web.listen-address="127.0.0.1:$PROM" \
	--web.enable-otlp-receiver --enable-feature=exemplar-storage
wait_until "Prometheus (see $LOGS/prometheus.log)" 60 http_ok "http://127.0.0.1:$PROM/-/ready"

log "starting the collector with otel-collector/backends.yaml (OTLP gRPC 127.0.0.1:$COL_GRPC)"
OTLP_GRPC_ENDPOINT=127.0.0.1:$COL_GRPC OTLP_HTTP_ENDPOINT=127.0.0.1:$COL_HTTP \
	PROMETHEUS_HOST=127.0.0.1:$PROM JAEGER_OTLP_GRPC_ENDPOINT=127.0.0.1:$JAEGER_OTLP \
	start collector "${TOOL[otelcol]}" --config "$ROOT/otel-collector/backends.yaml"
wait_until "the collector's OTLP port (see $LOGS/collector.log)" 60 port_open "$COL_GRPC"

# --- pods: network namespaces behind veths, with host routes as a CNI makes them -----
POD_IPS=()
for i in $(seq $((PODS + NEW_PODS))); do
	ns="npdemo-$SUFFIX-$i" host="npd${SUFFIX}h$i" peer="npd${SUFFIX}p$i"
	ip4="10.252.$((SUFFIX % 250)).$((i + 1))"
	ip netns add "$ns"
	NETNS+=("$ns")
	ip link add "$host" type veth peer name "$peer"
	HOSTLINKS+=("$host")
	ip link set "$peer" netns "$ns"
	ip -n "$ns" link set lo up
	ip -n "$ns" addr add "$ip4/32" dev "$peer"
	ip -n "$ns" link set "$peer" up
	ip -n "$ns" route add default dev "$peer"
	ip link set "$host" up
	ip route add "$ip4/32" dev "$host"
	POD_IPS+=("$ip4")
done
NEW_POD_IPS=("${POD_IPS[@]:$PODS}")
POD_IPS=("${POD_IPS[@]:0:$PODS}")
log "pods: ${POD_IPS[*]}, starting mid-run: ${NEW_POD_IPS[*]:-none} (netns npdemo-$SUFFIX-*, host veths npd${SUFFIX}h*)"

# --- npagent -----------------------------------------------------------------------
AGENT_URL="http://127.0.0.1:$AGENT"               # /metrics
AGENT_HEALTH_URL="http://127.0.0.1:$AGENT_HEALTH" # /livez, /readyz: a listener of their own
export OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$COL_GRPC" OTEL_EXPORTER_OTLP_INSECURE=true
export OTEL_METRIC_EXPORT_INTERVAL=2000 OTEL_BSP_SCHEDULE_DELAY=500
start_agent() {
	start npagent "$WORK/bin/npagent" --kubeconfig="$KUBECONFIG_FILE" --node-name="$NODE_NAME" --node-ip="$NODE_IP" \
		--dataplane="$1" --bpffs-path="$BPFFS" --state-file="$WORK/npagent/seen.state" \
		--metrics-addr="127.0.0.1:$AGENT" --health-addr="127.0.0.1:$AGENT_HEALTH" --resync-period=15s --trace-parenting="$PARENTING" \
		--debug-socket="$WORK/npagent/debug.sock" --pod-condition
	local deadline=$((SECONDS + 60))
	until http_ok "$AGENT_HEALTH_URL/readyz"; do
		alive npagent || return 1
		((SECONDS < deadline)) || die "npagent not ready after 60s: $(curl -s "$AGENT_HEALTH_URL/readyz")"
		sleep 0.5
	done
}
case $DATAPLANE in
auto | ebpf)
	# The host's part, as a node's init system does it: the agent never mounts bpffs.
	if ! mountpoint -q /sys/fs/bpf && [[ $EUID == 0 ]]; then
		log "mounting bpffs at /sys/fs/bpf (the host's job; the agent does not mount it)"
		mount -t bpf bpf /sys/fs/bpf || log "could not mount bpffs"
	fi
	log "starting npagent with the eBPF dataplane (pinned under $BPFFS)"
	if ! start_agent ebpf; then
		[[ $DATAPLANE == auto ]] || die "npagent could not start with the eBPF dataplane (see above)"
		log "eBPF dataplane unavailable here: $(grep -m1 -o 'npagent: .*' "$LOGS/npagent.log" || tail -n 1 "$LOGS/npagent.log")"
		mv "$LOGS/npagent.log" "$LOGS/npagent-ebpf.log"
		unset "PID[npagent]"
		log "starting npagent with the in-memory dataplane instead (no enforcement)"
		start_agent memory || die "npagent exited (see $LOGS/npagent.log)"
		DATAPLANE=memory
	else
		DATAPLANE=ebpf
	fi
	;;
memory)
	log "starting npagent with the in-memory dataplane (no enforcement)"
	start_agent memory || die "npagent exited (see $LOGS/npagent.log)"
	;;
*) die "DEMO_DATAPLANE=$DATAPLANE: want auto, ebpf or memory" ;;
esac
log "npagent ready ($DATAPLANE dataplane) at $AGENT_URL"

# --- churn, with an apiserver restart in the middle ---------------------------------
[[ $DURATION =~ ^[0-9]+$ ]] || die "DEMO_DURATION=$DURATION: want whole seconds"
log "churn: $OBJECTS PolicyEndpoints changing and $STATIC static ones, $RATE writes/s for ${DURATION}s, pods on $NODE_IP"
POD_CSV="$(
	IFS=,
	echo "${POD_IPS[*]}"
)"
NEW_POD_CSV="$(
	IFS=,
	echo "${NEW_POD_IPS[*]}"
)"
start churn "$WORK/bin/churn" --kubeconfig="$KUBECONFIG_FILE" --host-ip="$NODE_IP" --local-pod-ips="$POD_CSV" \
	--node-name="$NODE_NAME" --new-pod-ips="$NEW_POD_CSV" \
	--objects="$OBJECTS" --static-objects="$STATIC" --rate="$RATE" --duration="${DURATION}s" --summary-file="$WORK/churn.json"
if [[ $RESTART == 1 ]]; then
	sleep $((DURATION / 2))
	alive churn || die "churn driver exited early (see $LOGS/churn.log)"
	log "restarting kube-apiserver mid-run: watches end, informers relist every object"
	kill -USR1 "${PID[controlplane]}"
	wait_until "the apiserver restart (see $LOGS/controlplane.log)" 90 grep -q "kube-apiserver restarted" "$LOGS/controlplane.log"
	log "kube-apiserver restarted in $(grep -o 'restarted.* took=[^ ]*' "$LOGS/controlplane.log" | grep -o '[^=]*$' | head -n 1)"
fi
wait "${PID[churn]}" || die "churn driver failed (see $LOGS/churn.log)"
unset "PID[churn]"
log "churn done: $(cat "$WORK/churn.json")"

# --- a denied packet, so the verdict panels show one --------------------------------
# Pod 1 sends pod 2 UDP to port 9, which none of pod 2's policies allows. The host
# forwards between them on pod 1's veth only (its forwarding and proxy ARP; the
# host's global ip_forward is left as it is), and pod 2's ingress drops it.
if [[ $DATAPLANE == ebpf && ${#POD_IPS[@]} -ge 2 ]]; then
	sysctl -qw "net.ipv4.conf.npd${SUFFIX}h1.forwarding=1" "net.ipv4.conf.npd${SUFFIX}h1.proxy_arp=1"
	ip netns exec "npdemo-$SUFFIX-1" bash -c "for i in 1 2 3 4 5; do echo denied >/dev/udp/${POD_IPS[1]}/9; sleep 0.2; done" ||
		log "could not send pod 1's datagrams to pod 2"
	log "sent 5 datagrams from pod ${POD_IPS[0]} to ${POD_IPS[1]}:9/udp, which its policies deny"
fi

# --- follow the chain ---------------------------------------------------------------
log "verifying: npagent /metrics -> collector -> Prometheus (histogram, exemplars, SLO rules, dashboard queries) -> Jaeger (trace)"
"$WORK/bin/verify" --prometheus="http://127.0.0.1:$PROM" --jaeger="http://127.0.0.1:$JAEGER_QUERY" \
	--agent="$AGENT_URL" --churn-summary="$WORK/churn.json" --trace-parenting="$PARENTING" --apiserver-restarted="$([[ $RESTART == 1 ]] && echo true || echo false)" \
	--dashboard="$ROOT/deploy/grafana/npagent.json" --slowest-object-file="$WORK/slowest"

# --- why was it slow? npagent explain, on the node, for the slowest exemplar's object ---
SLOWEST="$(cat "$WORK/slowest")"
echo
echo "npagent explain $SLOWEST (the slowest exemplar's object, from the agent's debug socket):"
"$WORK/bin/npagent" explain --debug-socket="$WORK/npagent/debug.sock" "$SLOWEST" ||
	die "npagent explain $SLOWEST failed"
log "dataplane: $DATAPLANE; logs were in $LOGS"
