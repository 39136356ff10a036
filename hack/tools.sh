#!/usr/bin/env bash
# Builds the binaries npagent's tests and demo need, from Go module source, into a
# cache folder outside the clone keyed by name and version, so a fresh clone reuses
# them and a new machine builds them once. Usage: hack/tools.sh [name ...]
# Names: kube-apiserver etcd otelcol otelcol-gateway prometheus promtool jaeger
# kubelet kube-scheduler kube-controller-manager containerd runc cni-plugins pause
# kubectl helm aws-network-policy-controller (default: the first three). kubelet to
# pause are make e2e-node's node (test/e2enode); the last three run its quick start.
# Prints the path of each tool's binary on stdout, one line each (progress goes to stderr).
# Concurrent runs (parallel test packages) wait on a lock instead of building twice.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${NPAGENT_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/npagent/tools}"

KUBE_VERSION=v1.37.2
# The Kubernetes binaries' version, stamped at link time as Kubernetes' own build does:
# without it they report v0.0.0-master, which Helm's kubeVersion check (the chart
# wants >=1.30) and the Node's kubeletVersion show. Cached under this key (bump its
# suffix when the recipe changes): a warm build cache makes that a link step.
KUBE_BUILD_KEY="$KUBE_VERSION-v"
KUBE_MINOR="${KUBE_VERSION#v1.}"
KUBE_LDFLAGS="-X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${KUBE_MINOR%%.*} -X k8s.io/component-base/version.gitTreeState=clean"
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
# make e2e-node's container runtime, all from Go module source (tools/containerd pins
# them): Debian bookworm's containerd 1.6 is past its end of life and has no CRI v1
# image-volume fields the 1.37 kubelet asks about, and one module keeps CI free of apt.
CONTAINERD_VERSION=v2.4.2
RUNC_VERSION=v1.5.3
CNI_PLUGINS_VERSION=v1.10.0
# The quick start's CLIs and the managed controller it runs beside (test/e2enode):
# helm at the release the chart tests link (go.mod), the AWS Network Policy
# Controller at the one release the module proxy lists, whose PolicyEndpoints carry
# the trigger annotation the latency is measured from. kubectl shares KUBE_BUILD_KEY.
HELM_VERSION=v3.22.0
AWS_NPC_VERSION=v1.1.10
# The pause image: test/e2enode/images/pause, cached under a hash of its source.
PAUSE_KEY="$(cat "$ROOT/test/e2enode/images/pause/"*.go "$ROOT/test/e2enode/images/pack/"*.go 2>/dev/null | sha256sum | cut -c1-12)"

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
	(cd "$ROOT/tools/kube-apiserver" && go build -trimpath -ldflags "$KUBE_LDFLAGS" -o "$OUT" k8s.io/kubernetes/cmd/kube-apiserver)
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

# The node's Kubernetes components share tools/kube-node (the same k8s.io/kubernetes
# as kube-apiserver, so the build cache is shared too).
build_kube_node() {
	(cd "$ROOT/tools/kube-node" && go build -trimpath -ldflags "$KUBE_LDFLAGS" -o "$OUT" "k8s.io/kubernetes/cmd/$1")
}

build_helm() {
	(cd "$ROOT/tools/helm" && go build -trimpath -o "$OUT" helm.sh/helm/v3/cmd/helm)
}

# Its module has no replace directives, so building it as a dependency of
# tools/aws-network-policy-controller resolves the graph its own go.mod pins.
build_aws_npc() {
	(cd "$ROOT/tools/aws-network-policy-controller" && go build -trimpath -o "$OUT" github.com/aws/amazon-network-policy-controller-k8s/cmd)
}

# containerd, its shim and ctr into one folder: containerd finds the shim on its PATH.
# Static, no cgo: the btrfs and devmapper snapshotters are left out (the node uses
# overlayfs or native).
build_containerd() {
	local dir
	dir="$(dirname "$OUT")"
	(cd "$ROOT/tools/containerd" && for c in containerd containerd-shim-runc-v2 ctr; do
		log "containerd: go build cmd/$c"
		CGO_ENABLED=0 go build -trimpath -tags "no_btrfs no_devmapper no_zfs" \
			-o "$dir/$c.new" "github.com/containerd/containerd/v2/cmd/$c"
		mv "$dir/$c.new" "$dir/$c"
	done)
	cp "$dir/containerd" "$OUT"
}

# runc needs cgo and libseccomp (the seccomp tag): RuntimeDefault is a seccomp profile.
build_runc() {
	[[ -f /usr/include/seccomp.h ]] || { log "runc: needs libseccomp-dev (apt-get install libseccomp-dev)"; return 1; }
	(cd "$ROOT/tools/containerd" && CGO_ENABLED=1 go build -trimpath -tags seccomp -o "$OUT" github.com/opencontainers/runc)
}

# CNI plugins into one folder (the kubelet's CNI bin dir); the marker binary is ptp.
build_cni_plugins() {
	local dir p
	dir="$(dirname "$OUT")"
	(cd "$ROOT/tools/containerd" && for p in ipam/host-local main/loopback main/ptp; do
		log "cni-plugins: go build plugins/$p"
		CGO_ENABLED=0 go build -trimpath -o "$dir/${p#*/}.new" "github.com/containernetworking/plugins/plugins/$p"
		mv "$dir/${p#*/}.new" "$dir/${p#*/}"
	done)
	cp "$dir/ptp" "$OUT"
}

# The pause image as a docker-archive (ctr imports it): a static Go binary that
# sleeps until a signal (test/e2enode/images/pause), packed by test/e2enode/images/pack.
build_pause() {
	(cd "$ROOT" && go run ./test/e2enode/images/pack -pkg ./test/e2enode/images/pause -image localhost/npagent-e2e/pause:1 -out "$OUT")
}

names=("$@")
[[ ${#names[@]} -gt 0 ]] || names=(kube-apiserver etcd otelcol)
for n in "${names[@]}"; do
	case $n in
	kube-apiserver) ensure kube-apiserver "$KUBE_BUILD_KEY" kube-apiserver build_kube_apiserver ;;
	etcd) ensure etcd "$ETCD_VERSION" etcd build_etcd ;;
	otelcol) ensure otelcol "$OTELCOL_VERSION" otelcol-npagent build_collector "$OTELCOL_VERSION" . otelcol-npagent ;;
	otelcol-gateway) ensure otelcol-gateway "$OTELCOL_GATEWAY_KEY" otelcol-gateway build_collector "$OTELCOL_GATEWAY_VERSION" gateway otelcol-gateway ;;
	prometheus) ensure prometheus "$PROMETHEUS_VERSION" prometheus build_prometheus ;;
	promtool) ensure promtool "$PROMETHEUS_VERSION" promtool build_promtool ;;
	jaeger) ensure jaeger "$JAEGER_VERSION" jaeger build_jaeger ;;
	kubelet | kube-scheduler | kube-controller-manager | kubectl) ensure "$n" "$KUBE_BUILD_KEY" "$n" build_kube_node "$n" ;;
	containerd) ensure containerd "$CONTAINERD_VERSION" containerd build_containerd ;;
	runc) ensure runc "$RUNC_VERSION" runc build_runc ;;
	cni-plugins) ensure cni-plugins "$CNI_PLUGINS_VERSION" ptp build_cni_plugins ;;
	pause) ensure pause "$PAUSE_KEY" pause.tar build_pause ;;
	helm) ensure helm "$HELM_VERSION" helm build_helm ;;
	aws-network-policy-controller) ensure aws-network-policy-controller "$AWS_NPC_VERSION" controller build_aws_npc ;;
	*) log "unknown tool $n"; exit 2 ;;
	esac
done
