# npagent — see README.md. Every target prints what it does; first runs build tools
# into ${XDG_CACHE_HOME:-~/.cache}/npagent/tools (kept across clones).

GO        ?= go
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X main.version=$(VERSION)
PKGS      := ./...
TEST_TIMEOUT ?= 25m
# Packages whose code runs goroutines or is called from several: make test runs them
# again under the race detector.
RACE_PKGS := ./internal/seen/ ./internal/reconcile/ ./internal/telemetry/ ./internal/bpfmaps/ ./cmd/npagent/

.PHONY: all build image chart test unit e2e e2e-node fuzz tools tools-demo bench lint fmt generate verify-generated demo clean

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

chart: ## write examples/deploy: the Helm chart deploy/charts/npagent rendered with its default values
	@echo "==> helm template deploy/charts/npagent (Helm's Go packages) -> examples/deploy; go run ./deploy/charts/template [-set k=v] prints other values"
	$(GO) run ./deploy/charts/template -examples examples/deploy

tools: ## build kube-apiserver, etcd and the OpenTelemetry Collectors (cached)
	@echo "==> tools: kube-apiserver, etcd, otelcol, otelcol-gateway (cached after the first build)"
	@hack/tools.sh kube-apiserver etcd otelcol otelcol-gateway >/dev/null

tools-demo: tools ## also Prometheus and Jaeger for the demo
	@echo "==> tools: prometheus, jaeger (cached after the first build)"
	@hack/tools.sh prometheus jaeger >/dev/null

# The collector tiers' test (otel-collector/tiers_test.go) runs a real Prometheus and
# Jaeger: built here (tools-demo), before go test's timeout starts, not inside a test.
test: tools-demo ## all tests: unit, real apiserver, real collectors, Prometheus, Jaeger, eBPF (as root)
	@echo "==> go vet"
	$(GO) vet $(PKGS)
	@echo "==> go test (integration tests use the real control plane and collector; eBPF tests need root)"
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) $(PKGS)
	@echo "==> go test -race (every package with concurrency: $(RACE_PKGS))"
	$(GO) test -count=1 -race -timeout $(TEST_TIMEOUT) $(RACE_PKGS)

# The fault tests (cmd/npagent/faults_test.go) and the packet prober
# (cmd/npagent/prober_test.go) run a short profile in make test; NPAGENT_E2E=1 selects
# the full one, with -v so their figures and the prober's flip table are printed.
E2E_TESTS := ^(TestFault|TestProber)

e2e: tools ## full profiles: 410 relist (apiserver restarted in the gap), 10 SIGKILLs mid-churn, collector down 30s, packet prober (16 flips)
	@echo "==> NPAGENT_E2E=1 go test -run '$(E2E_TESTS)' ./cmd/npagent/ (full profiles: 410 relist with an apiserver restart, SIGKILL x10 mid-churn, collector outage 30s, packet prober 16 flips; root for the pods and eBPF)"
	NPAGENT_E2E=1 $(GO) test -count=1 -v -timeout $(TEST_TIMEOUT) -run '$(E2E_TESTS)' ./cmd/npagent/

# A real node (test/e2enode): kubelet, scheduler, controller-manager, containerd, runc,
# CNI plugins and the pause image are built here first (cached), then the tests boot
# the node and install the chart with the image built by make image. Root only.
E2E_NODE_TOOLS := kube-apiserver etcd kubelet kube-scheduler kube-controller-manager containerd runc cni-plugins pause

e2e-node: image ## a real single-node cluster: npagent from its chart on a kubelet + containerd (root; see test/e2enode/README.md)
	@echo "==> tools: $(E2E_NODE_TOOLS) (cached after the first build)"
	@hack/tools.sh $(E2E_NODE_TOOLS) >/dev/null
	@echo "==> NPAGENT_E2E_NODE=1 go test ./test/e2enode/ (boots the node, installs the chart, checks pods, probes and policy)"
	NPAGENT_E2E_NODE=1 $(GO) test -count=1 -v -timeout $(TEST_TIMEOUT) ./test/e2enode/

unit: ## fast tests only (no control plane, no root)
	$(GO) test -count=1 -short $(PKGS)

# Fuzz targets as package:function. `go test` (make test, CI) runs each one's seed
# corpus and the inputs it once failed on (testdata/fuzz); `make fuzz` explores.
FUZZ_TARGETS := ./internal/seen/:FuzzParseTrigger ./internal/seen/:FuzzDecodeState \
	./internal/reconcile/:FuzzCompilePolicyEndpoint ./internal/bpfmaps/:FuzzCompiledEntriesMatchVerdict
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
