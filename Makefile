# npagent — see README.md. Every target prints what it does; first runs build tools
# into ${XDG_CACHE_HOME:-~/.cache}/npagent/tools (kept across clones).

GO        ?= go
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X main.version=$(VERSION)
PKGS      := ./...
TEST_TIMEOUT ?= 25m

# Test tiers. Each package is in the tier of the heaviest thing its tests need (a
# package with both apiserver and eBPF tests is in integration); make check-tiers
# fails when a package is in none or in two. make unit runs the pure tests of every
# package (-short: a test needing root, the kernel, an apiserver or a built tool
# skips); make test runs every package once, in its tier.
UNIT_PKGS        := ./docs/ ./internal/report/ ./internal/testenv/skip/ ./internal/testenv/otlptest/ \
	./examples/demo/verify/ ./examples/demo/controlplane/ ./examples/deploy/ ./deploy/charts/template/ \
	./internal/translate/ ./internal/explain/ ./internal/lastvalid/ ./internal/testenv/fixture/ ./hack/release/ ./internal/podcond/ ./test/e2enode/images/...
INTEGRATION_PKGS := ./api/v1alpha1/ ./internal/testenv/ ./internal/seen/ ./internal/reconcile/ ./internal/kubewatch/ ./internal/telemetry/ ./internal/relay/ \
	./examples/churn/ ./deploy/charts/ ./deploy/grafana/ ./deploy/prometheus/
KERNEL_PKGS      := ./internal/atomicfile/ ./internal/bpfmaps/ ./internal/podif/ ./internal/nodeaddrs/ ./internal/testenv/netlab/
E2E_PKGS         := ./cmd/npagent/ ./otel-collector/ ./hack/image/ ./test/e2enode/ ./test/fleet/
# Packages whose code runs goroutines or is called from several: their tier runs them
# under the race detector (only: not a second time without it).
RACE_PKGS := ./internal/seen/ ./internal/reconcile/ ./internal/kubewatch/ ./internal/relay/ ./internal/telemetry/ ./internal/bpfmaps/ ./internal/nodeaddrs/ ./cmd/npagent/
# Tests that skip under the race detector (timing, allocation counts: its stalls
# and sync.Pool's drops make them meaningless), as package:regex. The race pass
# skips them; a plain pass of their own runs them, and only them.
RACE_SKIPPED := ./cmd/npagent/:^TestProber ./internal/telemetry/:^TestLinkAllocations
TESTFLAGS ?= -count=1 -timeout $(TEST_TIMEOUT)
empty :=
space := $(empty) $(empty)
race_skip_re := $(subst $(space),|,$(foreach t,$(RACE_SKIPPED),$(lastword $(subst :, ,$(t)))))

# $(call gotest,packages): go test each package once — those of RACE_PKGS under
# -race (but for their RACE_SKIPPED tests, run without it), the others without.
define gotest
	$(if $(filter $(RACE_PKGS),$(1)),$(GO) test $(TESTFLAGS) -race -skip '$(race_skip_re)' $(filter $(RACE_PKGS),$(1)))
	$(if $(filter-out $(RACE_PKGS),$(1)),$(GO) test $(TESTFLAGS) $(filter-out $(RACE_PKGS),$(1)))
	@for t in $(RACE_SKIPPED); do pkg=$${t%%:*}; re=$${t#*:}; case " $(1) " in *" $$pkg "*) \
		echo "$(GO) test $(TESTFLAGS) -run '$$re' $$pkg"; $(GO) test $(TESTFLAGS) -run "$$re" $$pkg || exit 1;; esac; done
endef

.PHONY: all build image release chart docs test unit integration kernel e2e e2e-full e2e-node fleet check-tiers test-unit-pkgs fuzz tools tools-demo bench lint fmt generate verify-generated demo clean

all: build

build: ## build bin/npagent
	@echo "==> go build ./cmd/npagent -> bin/npagent ($(VERSION))"
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/npagent ./cmd/npagent

# The image's revision label and every timestamp in it: the commit and its time, so
# the same commit gives the same digests (SOURCE_DATE_EPOCH, as reproducible builds name it).
IMAGE_REVISION    ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)

image: ## OCI image, linux/amd64 + linux/arm64, no daemon: bin/image/oci and a docker-archive per arch
	@echo "==> image: npagent $(VERSION) at $(IMAGE_REVISION) (time $(SOURCE_DATE_EPOCH)) -> bin/image"
	$(GO) run ./hack/image -go "$(GO)" -version "$(VERSION)" -ldflags "$(LDFLAGS)" \
		-revision "$(IMAGE_REVISION)" -created "$(SOURCE_DATE_EPOCH)" -out bin/image

# make release VERSION=x.y.z: what a user pulls (hack/release): the image for that
# version, the chart packaged to install it by digest, SHA256SUMS; RELEASE_PUSH=
# registry/path also pushes the image there and the chart beside it (oci://).
RELEASE_REPOSITORY ?= ghcr.io/npagent/npagent
RELEASE_PUSH       ?=
release: ## VERSION=x.y.z: image, packaged chart and SHA256SUMS in bin/release (RELEASE_PUSH=registry/path pushes them)
	@$(GO) run ./hack/release -check-version -version "$(VERSION)"
	@$(MAKE) --no-print-directory image VERSION="$(VERSION)"
	@echo "==> release $(VERSION): chart, image archive, SHA256SUMS -> bin/release (image repository $(RELEASE_REPOSITORY))"
	$(GO) run ./hack/release -version "$(VERSION)" -image bin/image/oci -repository "$(if $(RELEASE_PUSH),$(RELEASE_PUSH),$(RELEASE_REPOSITORY))" \
		-out bin/release $(if $(RELEASE_PUSH),-push "$(RELEASE_PUSH)")

chart: ## write examples/deploy: the Helm chart deploy/charts/npagent rendered with its default values
	@echo "==> helm template deploy/charts/npagent (Helm's Go packages) -> examples/deploy; go run ./deploy/charts/template [-set k=v] prints other values"
	$(GO) run ./deploy/charts/template -examples examples/deploy

# The generated references (docs/reference: flags, metrics, chart values) and the
# samples the documents show: each is written by a test that, run without
# NPAGENT_UPDATE_DOCS, fails when the committed file is stale.
docs: ## regenerate docs/reference (flags, metrics, chart values) and the documents' samples from the code
	@echo "==> docs: the references in docs/reference and the samples in docs/, from the code"
	NPAGENT_UPDATE_DOCS=1 $(GO) test -count=1 -run '^(TestFlagsReference|TestExplainSampleInDocs|TestCommandUsageInDocs)$$' ./cmd/npagent/
	NPAGENT_UPDATE_DOCS=1 $(GO) test -count=1 -run '^TestMetricsReference$$' ./internal/telemetry/
	NPAGENT_UPDATE_DOCS=1 $(GO) test -count=1 -run '^TestChartValuesReference$$' ./deploy/charts/

tools: ## build kube-apiserver, etcd and the OpenTelemetry Collectors (cached)
	@echo "==> tools: kube-apiserver, etcd, otelcol, otelcol-gateway (cached after the first build)"
	@hack/tools.sh kube-apiserver etcd otelcol otelcol-gateway >/dev/null

tools-demo: tools ## also Prometheus and Jaeger for the demo
	@echo "==> tools: prometheus, jaeger (cached after the first build)"
	@hack/tools.sh prometheus jaeger >/dev/null

# The collector tiers' test (otel-collector/tiers_test.go) runs a real Prometheus and
# Jaeger: built here (tools-demo), before go test's timeout starts, not inside a test.
test: tools-demo check-tiers ## every test once, tier by tier: unit, integration, kernel (as root), e2e
	@echo "==> go vet"
	$(GO) vet $(PKGS)
	@$(MAKE) --no-print-directory test-unit-pkgs
	@$(MAKE) --no-print-directory integration
	@$(MAKE) --no-print-directory kernel
	@$(MAKE) --no-print-directory e2e

unit: ## the pure tests of every package (-short: nothing needing root, the kernel, an apiserver or a tool); cached
	@echo "==> unit: go test -short (no root, no control plane, no tools; cached)"
	$(GO) test -short $(PKGS)

# make test's share of the unit tier: the packages with nothing but pure tests (the
# pure tests of the others run in their own tier's pass).
test-unit-pkgs:
	@echo "==> unit: $(UNIT_PKGS)"
	$(GO) test $(UNIT_PKGS)

integration: tools ## packages with tests against a real kube-apiserver + etcd, collector or promtool (as root, their eBPF tests too)
	@echo "==> integration: $(INTEGRATION_PKGS) (race detector on $(filter $(RACE_PKGS),$(INTEGRATION_PKGS)))"
	$(call gotest,$(INTEGRATION_PKGS))

kernel: ## packages with tests of real eBPF, netlink and namespaces (root)
	@echo "==> kernel: $(KERNEL_PKGS) (race detector on $(filter $(RACE_PKGS),$(KERNEL_PKGS)))"
	$(call gotest,$(KERNEL_PKGS))

# The fault tests (cmd/npagent/faults_test.go) and the packet prober
# (cmd/npagent/prober_test.go) run a short profile in make e2e (and make test);
# NPAGENT_E2E=1 selects the full one (make e2e-full), with -v so their figures and
# the prober's flip table are printed.
E2E_TESTS := ^(TestFault|TestProber)

e2e: tools-demo ## the agent's binary against real parts: faults, restarts, the prober; the collector tiers; the image
	@echo "==> e2e: $(E2E_PKGS) (race detector on $(filter $(RACE_PKGS),$(E2E_PKGS)))"
	$(call gotest,$(E2E_PKGS))

e2e-full: tools ## full profiles: 410 relist (apiserver restarted in the gap), 10 SIGKILLs mid-churn, collector down 30s, packet prober (16 flips)
	@echo "==> NPAGENT_E2E=1 go test -run '$(E2E_TESTS)' ./cmd/npagent/ (full profiles: 410 relist with an apiserver restart, SIGKILL x10 mid-churn, collector outage 30s, packet prober 16 flips; root for the pods and eBPF)"
	NPAGENT_E2E=1 $(GO) test -count=1 -v -timeout $(TEST_TIMEOUT) -run '$(E2E_TESTS)' ./cmd/npagent/

# The fleet run (test/fleet's TestFleet, BENCHMARKS.md "Fleet"): many agent processes
# against one real apiserver, not in make test (make e2e skips it: even its smoke
# profile takes over a minute here; make e2e runs the package's TestRelayTier, a fixed
# 3-agent run through the relay tier, instead). make fleet runs the measured profile
# (FLEET_ARGS; FLEET_ARGS= runs the smoke one: 3 agents, 300 objects), plus
# FLEET_EXTRA: the relay variant is
#   make fleet FLEET_EXTRA=-relay
# (npagent relay on loopback, TLS, every agent pointed at it); -relay-cmd and
# -agent-args run another relay command instead.
FLEET_ARGS ?= -agents 40 -objects 10000 -pods 4 -writes 20 -window 60s -baseline 20s -settle 10s -after 10s
FLEET_EXTRA ?=

fleet: tools ## 40 agents, 10,000 objects, 20 writes/s, one real apiserver: its CPU and bytes, agent CPU/RSS, p99, a restart, exactly once (root; FLEET_ARGS)
	@echo "==> go test ./test/fleet/ (prints the table; ~10 min on 2 cores)"
	NPAGENT_FLEET=1 $(GO) test -count=1 -v -timeout 60m -run '^TestFleet$$' ./test/fleet/ -args $(FLEET_ARGS) $(FLEET_EXTRA)

# Every package in exactly one tier, and every fuzz target listed.
check-tiers:
	@listed="$$($(GO) list $(UNIT_PKGS) $(INTEGRATION_PKGS) $(KERNEL_PKGS) $(E2E_PKGS) | sort)"; \
	dup="$$(printf '%s\n' $(UNIT_PKGS) $(INTEGRATION_PKGS) $(KERNEL_PKGS) $(E2E_PKGS) | sort | uniq -d)"; \
	off="$$(printf '%s\n%s\n' "$$($(GO) list $(PKGS))" "$$listed" | sort | uniq -u)"; \
	if [ -n "$$dup$$off" ]; then echo "test tiers (Makefile): in two tiers: $$dup; in none: $$off"; exit 1; fi
	@found="$$(grep -rE --include='*_test.go' -o '^func Fuzz[A-Za-z0-9_]*' . | sed -E 's#^(.*/)[^/]*:func #\1:#' | sort)"; \
	listed="$$(printf '%s\n' $(FUZZ_TARGETS) | sort)"; \
	if [ "$$found" != "$$listed" ]; then echo "FUZZ_TARGETS (Makefile) differs from the tree's func Fuzz:"; \
		printf '%s\n%s\n' "$$found" "$$listed" | sort | uniq -u; exit 1; fi

# A real node (test/e2enode): kubelet, scheduler, controller-manager, containerd, runc,
# CNI plugins and the pause image are built here first (cached), then the tests boot
# the node and install the chart with the image built by make image. Root only.
E2E_NODE_TOOLS := kube-apiserver etcd kubelet kube-scheduler kube-controller-manager containerd runc cni-plugins pause otelcol \
	kubectl helm aws-network-policy-controller

e2e-node: image ## a real single-node cluster: npagent from its chart on a kubelet + containerd (root; see test/e2enode/README.md)
	@echo "==> tools: $(E2E_NODE_TOOLS) (cached after the first build)"
	@hack/tools.sh $(E2E_NODE_TOOLS) >/dev/null
	@echo "==> NPAGENT_E2E_NODE=1 go test ./test/e2enode/ (boots the node, installs the chart, checks pods, probes and policy)"
	NPAGENT_E2E_NODE=1 $(GO) test -count=1 -v -timeout $(TEST_TIMEOUT) ./test/e2enode/


# Fuzz targets as package:function. `go test` (make test, CI) runs each one's seed
# corpus and the inputs it once failed on (testdata/fuzz); `make fuzz` explores.
FUZZ_TARGETS := ./internal/seen/:FuzzParseTrigger ./internal/seen/:FuzzDecodeState \
	./internal/translate/:FuzzCompilePolicyEndpoint ./internal/bpfmaps/:FuzzCompiledEntriesMatchVerdict \
	./internal/bpfmaps/:FuzzCompileMatchesReference
FUZZTIME ?= 30s

fuzz: ## run every fuzz target for FUZZTIME each (default 30s; the first run builds an instrumented test binary per package)
	@set -e; for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; fn=$${t##*:}; \
		echo "==> fuzz $$fn ($$pkg) for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) $$pkg; done

bench: ## benchmarks (figures recorded in BENCHMARKS.md)
	$(GO) test -run '^$$' -bench . -benchmem -timeout 60m $(PKGS)

lint: ## go vet, gofmt, staticcheck
	@echo "==> go vet"
	$(GO) vet $(PKGS)
	@echo "==> gofmt"
	@out="$$(gofmt -l $$(git ls-files '*.go'))"; if [ -n "$$out" ]; then echo "not gofmt'ed:"; echo "$$out"; exit 1; fi
	@echo "==> staticcheck"
	$(GO) tool staticcheck $(PKGS)

BPF_GENERATED := internal/bpfmaps/policy_*_bpfel.go internal/bpfmaps/policy_*_bpfel.o

generate: ## deepcopy + CRDs (controller-gen) and eBPF objects (bpf2go; needs clang, llvm, libbpf-dev)
	@echo "==> controller-gen: deepcopy and CRDs"
	$(GO) tool controller-gen object paths=./api/...
	$(GO) tool controller-gen crd paths=./api/... output:crd:dir=config/crd
	@echo "==> bpf2go: eBPF objects for amd64 and arm64 ($$(clang --version | head -n 1))"
	$(GO) generate ./internal/bpfmaps/...

verify-generated: ## generated files are current: controller-gen and bpf2go (needs clang, llvm, libbpf-dev)
	@echo "==> controller-gen: deepcopy and CRDs"
	$(GO) tool controller-gen object paths=./api/...
	$(GO) tool controller-gen crd paths=./api/... output:crd:dir=config/crd
	@echo "==> bpf2go: eBPF objects for amd64 and arm64 ($$(clang --version | head -n 1))"
	$(GO) generate ./internal/bpfmaps/...
	@echo "==> git diff: generated files against the commit"
	@git diff --exit-code -- api config/crd $(BPF_GENERATED) || { echo "generated files are stale: run make generate"; exit 1; }
	@new="$$(git ls-files --others --exclude-standard -- api config/crd internal/bpfmaps)"; \
		if [ -n "$$new" ]; then echo "generation left files git does not know:"; echo "$$new"; exit 1; fi

demo: build ## the main job: agent + real apiserver + collector + Prometheus + Jaeger + churn
	examples/demo/demo.sh

clean:
	rm -rf bin
