#!/usr/bin/env bash
# Builds the binaries npagent's tests and demo need, from Go module source, into a
# cache folder outside the clone keyed by name and version, so a fresh clone reuses
# them and a new machine builds them once. Usage: hack/tools.sh [name ...]
# Names: kube-apiserver etcd otelcol otelcol-gateway prometheus promtool jaeger
# (default: the first three).
# Prints the path of each tool's binary on stdout, one line each (progress goes to stderr).
# Concurrent runs (parallel test packages) wait on a lock instead of building twice.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${NPAGENT_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/npagent/tools}"

KUBE_VERSION=v1.37.2
ETCD_VERSION=v3.7.3
OTELCOL_VERSION=v0.165.0
# The tiers' collector (otel-collector/gateway): contrib's tail sampling and load
# balancing, all at one release the module proxy serves whole. Cached under the
# release plus a hash of its manifest (comments aside), so adding a component
# rebuilds it instead of reusing a binary without it.
OTELCOL_GATEWAY_VERSION=v0.161.0
OTELCOL_GATEWAY_KEY="$OTELCOL_GATEWAY_VERSION-$(grep -v '^[[:space:]]*#' "$ROOT/otel-collector/gateway/builder-config.yaml" | sha256sum | cut -c1-12)"
PROMETHEUS_VERSION=v0.316.0
JAEGER_VERSION=v1.76.0

log() { printf '[tools] %s\n' "$*" >&2; }

# build NAME VERSION BINARY CMD... : runs CMD in a temp dir with $OUT set, unless
# $CACHE/NAME-VERSION/BINARY exists already.
ensure() {
	local name=$1 version=$2 binary=$3
	shift 3
	local dir="$CACHE/$name-$version"
	mkdir -p "$dir"
	exec 9>"$dir/.lock"
	flock 9
	if [[ -x "$dir/$binary" ]]; then
		log "$name $version: cached at $dir"
		echo "$dir/$binary"
		exec 9>&-
		return
	fi
	log "$name $version: building (first run only; this can take several minutes)..."
	local start=$SECONDS
	OUT="$dir/$binary.tmp" "$@"
	mv "$dir/$binary.tmp" "$dir/$binary"
	log "$name $version: built in $((SECONDS - start))s -> $dir/$binary"
	echo "$dir/$binary"
	exec 9>&-
}

build_kube_apiserver() {
	(cd "$ROOT/tools/kube-apiserver" && go build -trimpath -o "$OUT" k8s.io/kubernetes/cmd/kube-apiserver)
}

build_etcd() {
	(cd "$ROOT/tools/etcd" && go build -trimpath -o "$OUT" go.etcd.io/etcd/server/v3)
}

# build_collector VERSION DIR BINARY: the OpenTelemetry Collector builder at
# VERSION (it must match its components' release) builds the distribution whose
# manifest is otel-collector/DIR/builder-config.yaml, named BINARY.
build_collector() {
	local version=$1 dir=$2 binary=$3 work
	work="$(mktemp -d)"
	GOBIN="$work/bin" go install "go.opentelemetry.io/collector/cmd/builder@$version"
	cp "$ROOT/otel-collector/$dir/builder-config.yaml" "$work/"
	(cd "$work" && ./bin/builder --config builder-config.yaml >"$work/builder.log" 2>&1) || {
		cat "$work/builder.log" >&2
		return 1
	}
	cp "$work/_build/$binary" "$OUT"
	rm -rf "$work"
}

build_prometheus() {
	local work
	work="$(mktemp -d)"
	GOBIN="$work" go install "github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS_VERSION"
	mv "$work/prometheus" "$OUT"
	rm -rf "$work"
}

# promtool comes from the same module and version as the demo's Prometheus, so the
# rules in deploy/prometheus are checked by the PromQL engine that runs them.
build_promtool() {
	local work
	work="$(mktemp -d)"
	GOBIN="$work" go install "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_VERSION"
	mv "$work/promtool" "$OUT"
	rm -rf "$work"
}

build_jaeger() {
	(cd "$ROOT/tools/jaeger" && go build -trimpath -o "$OUT" github.com/jaegertracing/jaeger/cmd/jaeger)
}

names=("$@")
[[ ${#names[@]} -gt 0 ]] || names=(kube-apiserver etcd otelcol)
for n in "${names[@]}"; do
	case $n in
	kube-apiserver) ensure kube-apiserver "$KUBE_VERSION" kube-apiserver build_kube_apiserver ;;
	etcd) ensure etcd "$ETCD_VERSION" etcd build_etcd ;;
	otelcol) ensure otelcol "$OTELCOL_VERSION" otelcol-npagent build_collector "$OTELCOL_VERSION" . otelcol-npagent ;;
	otelcol-gateway) ensure otelcol-gateway "$OTELCOL_GATEWAY_KEY" otelcol-gateway build_collector "$OTELCOL_GATEWAY_VERSION" gateway otelcol-gateway ;;
	prometheus) ensure prometheus "$PROMETHEUS_VERSION" prometheus build_prometheus ;;
	promtool) ensure promtool "$PROMETHEUS_VERSION" promtool build_promtool ;;
	jaeger) ensure jaeger "$JAEGER_VERSION" jaeger build_jaeger ;;
	*) log "unknown tool $n"; exit 2 ;;
	esac
done
