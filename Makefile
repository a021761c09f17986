# renderqueue — see README.md. Every target does its own setup.
GO ?= go
# One build configuration for every compile of our code (vet, the tests, the binaries the tests
# build, make build, make image): static and -trimpath, as the image must be. Go's build cache then
# holds one compile of the dependencies rather than one for cgo builds and one for the image's
# (each ~5 CPU-minutes cold: docs/local-cluster.md, "How long it takes").
CGO_ENABLED ?= 0
GOFLAGS ?= -trimpath
export CGO_ENABLED GOFLAGS
GOLANGCI_LINT_VERSION ?= v2.15.0
PKGS ?= ./...
CONTROLLER_GEN_VERSION ?= v0.23.0
CONTROLLER_GEN ?= $(GO) run sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION)
KUSTOMIZE_VERSION ?= v5.8.2
KUSTOMIZE ?= $(GO) run sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION)
# The release: dist/ pins the operator (and the shards' default) image to $(IMG).
VERSION ?= v0.1.0
IMG ?= ghcr.io/renderqueue/renderqueue:$(VERSION)
# make image / make pause-image: OCI image layout archives in IMAGE_DIR (docs/image.md), dated at
# the commit (SOURCE_DATE_EPOCH) and labelled with it (REVISION), for IMAGE_PLATFORMS.
IMAGE_DIR ?= bin/image
IMAGE_PLATFORMS ?= linux/amd64 linux/arm64
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
PAUSE_IMG ?= localhost/renderqueue/pause:3.10
# The image builder (hack/image, a module of its own) and the static build of one platform's binary.
IMAGE_BUILDER = $(GO) -C hack/image run .
image_os = $(word 1,$(subst /, ,$(1)))
image_arch = $(word 2,$(subst /, ,$(1)))
image_bin = $(abspath $(IMAGE_DIR))/$(subst /,_,$(1))/$(2)
# make release: where it writes (not committed) and the platforms of its binaries.
RELEASE_DIR ?= dist/release
RELEASE_PLATFORMS ?= linux/amd64 linux/arm64 darwin/amd64 darwin/arm64
# How long `make soak` loops the chaos cases.
DURATION ?= 30m

.PHONY: all build test bench fmt vet lint run tidy manifests generate verify-generated crd-reference verify-crd-reference dist verify-dist release e2e soak demo docker-build image pause-image
all: build

build: ## Build bin/renderqueue (and bin/kubectl-renderqueue, the kubectl plugin, and bin/kubectl_complete-renderqueue, its shell completion: links to it).
	$(GO) build -o bin/renderqueue ./cmd/renderqueue
	ln -sf renderqueue bin/kubectl-renderqueue
	ln -sf renderqueue bin/kubectl_complete-renderqueue

test: ## Run every test (starts a throwaway PostgreSQL; builds envtest binaries once; installs promtool when missing).
	hack/test.sh $(PKGS)

bench: ## Run the benchmarks named in the issues (starts a throwaway PostgreSQL).
	BENCH=1 hack/bench.sh

fmt: ## Format the code.
	gofmt -w $$(git ls-files '*.go')

vet: ## go vet and a gofmt check.
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	cd test/monitoring && $(GO) vet ./...
	cd hack/image && $(GO) vet ./...

lint: ## golangci-lint, pinned, through the Go module proxy.
	$(GO) run github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION) run --allow-parallel-runners ./...
	cd test/monitoring && $(GO) run github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION) run --allow-parallel-runners ./...
	cd hack/image && $(GO) run github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION) run --allow-parallel-runners ./...

run: ## Local end-to-end run: throwaway PostgreSQL, seed 200k rows, standalone keeper, worker-sim, status.
	hack/run.sh

tidy:
	$(GO) mod tidy

manifests: ## Generate the CRDs (config/crd/bases) and RBAC (config/rbac) from the kubebuilder markers; copy the CRD and config/prometheus into the Helm chart.
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=config/crd/bases
	@if [ -d controllers ]; then \
	  echo $(CONTROLLER_GEN) rbac:roleName=renderqueue-operator paths=./controllers/... output:rbac:artifacts:config=config/rbac; \
	  $(CONTROLLER_GEN) rbac:roleName=renderqueue-operator paths=./controllers/... output:rbac:artifacts:config=config/rbac; \
	fi
	cp config/crd/bases/renderqueue.dev_renderqueues.yaml charts/renderqueue/crds/
	cp config/prometheus/podmonitor-operator.yaml config/prometheus/podmonitor-keepers.yaml \
	  config/prometheus/podmonitor-workers.yaml config/prometheus/prometheusrule.yaml charts/renderqueue/files/

generate: ## Generate the deepcopy methods of the API types.
	$(CONTROLLER_GEN) object paths=./api/...

verify-generated: manifests generate ## Fail when the committed generated files are not current.
	@out=$$(git status --porcelain -- api config/crd config/rbac charts/renderqueue/crds charts/renderqueue/files); \
	if [ -n "$$out" ]; then \
	  echo "generated files are not current; run 'make manifests generate' and commit:"; \
	  echo "$$out"; git --no-pager diff --stat -- api config/crd config/rbac charts/renderqueue/crds charts/renderqueue/files; exit 1; \
	fi

crd-reference: ## Write docs/crd-reference.md, the RenderQueue API reference, from the Go types (hack/crdref).
	$(GO) run ./hack/crdref -api api/v1alpha1 -o docs/crd-reference.md

verify-crd-reference: crd-reference ## Fail when the committed docs/crd-reference.md is not current.
	@out=$$(git status --porcelain -- docs/crd-reference.md); \
	if [ -n "$$out" ]; then \
	  echo "docs/crd-reference.md is not current; run 'make crd-reference' and commit it:"; \
	  echo "$$out"; git --no-pager diff --stat -- docs/crd-reference.md; exit 1; \
	fi

dist: ## Render dist/install.yaml and dist/install-without-metrics-api.yaml (config/, image $(IMG)).
	VERSION=$(VERSION) IMG=$(IMG) KUSTOMIZE="$(KUSTOMIZE)" hack/dist.sh write

verify-dist: ## Fail when the committed dist/ is not the current rendering of config/ (make dist).
	VERSION=$(VERSION) IMG=$(IMG) KUSTOMIZE="$(KUSTOMIZE)" hack/dist.sh verify

release: ## Build release VERSION=vX.Y.Z into $(RELEASE_DIR): image, install.yaml pinned by digest, binaries, krew manifest, SBOM, SHA256SUMS.
	@if [ "$(origin VERSION)" = file ]; then echo "make release needs VERSION=vX.Y.Z" >&2; exit 2; fi
	VERSION=$(VERSION) RELEASE_DIR=$(RELEASE_DIR) IMAGE_PLATFORMS="$(IMAGE_PLATFORMS)" RELEASE_PLATFORMS="$(RELEASE_PLATFORMS)" \
	  KUSTOMIZE="$(KUSTOMIZE)" GO="$(GO)" MAKE="$(MAKE)" hack/release.sh

e2e: ## End-to-end test (as root) on a one-node cluster of real components: the image, operator, shards, kubectl, HPA.
	hack/node.sh install >/dev/null
	KUBEBUILDER_ASSETS=$${KUBEBUILDER_ASSETS:-$$(hack/setup-envtest.sh | tail -n 1)} \
	  $(GO) test -tags e2e -count=1 -timeout 30m -v ./test/e2e

soak: ## The e2e chaos test (TestChaos) in a loop for DURATION (default 30m), with a summary at the end (as root).
	DURATION=$(DURATION) hack/soak.sh

demo: ## The whole system locally: control plane, 3-shard RenderQueue, 200k rows, workers, HPA metric (KEEP=1 keeps it).
	hack/demo.sh

docker-build: ## Build the container image $(IMG) with Docker (Dockerfile; the same image as make image).
	docker build --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) \
	  --build-arg CREATED=$$(date -u -d @$(SOURCE_DATE_EPOCH) +%Y-%m-%dT%H:%M:%SZ) -t $(IMG) .

image: ## Build the image $(IMG) without Docker: $(IMAGE_DIR)/renderqueue.oci.tar (OCI layout; digest in .digest).
	@mkdir -p $(IMAGE_DIR)
	$(foreach p,$(IMAGE_PLATFORMS),CGO_ENABLED=0 GOOS=$(call image_os,$(p)) GOARCH=$(call image_arch,$(p)) \
	  $(GO) build -trimpath -buildvcs=false -ldflags "-s -w -X main.version=$(VERSION)" \
	  -o $(call image_bin,$(p),renderqueue) ./cmd/renderqueue && ) true
	$(IMAGE_BUILDER) build -out $(abspath $(IMAGE_DIR))/renderqueue.oci.tar -name $(IMG) \
	  $(foreach p,$(IMAGE_PLATFORMS),-binary $(p)=$(call image_bin,$(p),renderqueue)) \
	  -path /renderqueue -user 65532:65532 -env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
	  -epoch $(SOURCE_DATE_EPOCH) \
	  -label org.opencontainers.image.title=renderqueue \
	  -label org.opencontainers.image.source=https://github.com/renderqueue/renderqueue \
	  -label org.opencontainers.image.version=$(VERSION) \
	  -label org.opencontainers.image.revision=$(REVISION)

pause-image: ## Build the test node's sandbox image $(PAUSE_IMG): $(IMAGE_DIR)/pause.oci.tar (hack/image/pause).
	@mkdir -p $(IMAGE_DIR)
	$(foreach p,$(IMAGE_PLATFORMS),CGO_ENABLED=0 GOOS=$(call image_os,$(p)) GOARCH=$(call image_arch,$(p)) \
	  $(GO) -C hack/image build -trimpath -buildvcs=false -ldflags "-s -w" \
	  -o $(call image_bin,$(p),pause) ./pause && ) true
	$(IMAGE_BUILDER) build -out $(abspath $(IMAGE_DIR))/pause.oci.tar -name $(PAUSE_IMG) \
	  $(foreach p,$(IMAGE_PLATFORMS),-binary $(p)=$(call image_bin,$(p),pause)) \
	  -path /pause -user 65535:65535 -base=false -epoch $(SOURCE_DATE_EPOCH) \
	  -label org.opencontainers.image.title=pause \
	  -label org.opencontainers.image.source=https://github.com/renderqueue/renderqueue \
	  -label org.opencontainers.image.revision=$(REVISION)
