# renderqueue — see README.md. Every target does its own setup.
GO ?= go
GOLANGCI_LINT_VERSION ?= v2.15.0
PKGS ?= ./...
CONTROLLER_GEN_VERSION ?= v0.23.0
CONTROLLER_GEN ?= $(GO) run sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION)
KUSTOMIZE_VERSION ?= v5.8.2
KUSTOMIZE ?= $(GO) run sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION)
# The release: dist/ pins the operator (and the shards' default) image to $(IMG).
VERSION ?= v0.1.0
IMG ?= ghcr.io/renderqueue/renderqueue:$(VERSION)
# How long `make soak` loops the chaos cases.
DURATION ?= 30m

.PHONY: all build test bench fmt vet lint run tidy manifests generate verify-generated dist verify-dist e2e soak demo docker-build
all: build

build: ## Build bin/renderqueue (and bin/kubectl-renderqueue, the kubectl plugin: a link to it).
	$(GO) build -o bin/renderqueue ./cmd/renderqueue
	ln -sf renderqueue bin/kubectl-renderqueue

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

lint: ## golangci-lint, pinned, through the Go module proxy.
	$(GO) run github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION) run --allow-parallel-runners ./...
	cd test/monitoring && $(GO) run github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION) run --allow-parallel-runners ./...

run: ## Local end-to-end run: throwaway PostgreSQL, seed 200k rows, standalone keeper, worker-sim, status.
	hack/run.sh

tidy:
	$(GO) mod tidy

manifests: ## Generate the CRDs (config/crd/bases) and RBAC (config/rbac) from the kubebuilder markers.
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=config/crd/bases
	@if [ -d controllers ]; then \
	  echo $(CONTROLLER_GEN) rbac:roleName=renderqueue-operator paths=./controllers/... output:rbac:artifacts:config=config/rbac; \
	  $(CONTROLLER_GEN) rbac:roleName=renderqueue-operator paths=./controllers/... output:rbac:artifacts:config=config/rbac; \
	fi

generate: ## Generate the deepcopy methods of the API types.
	$(CONTROLLER_GEN) object paths=./api/...

verify-generated: manifests generate ## Fail when the committed generated files are not current.
	@out=$$(git status --porcelain -- api config/crd config/rbac); \
	if [ -n "$$out" ]; then \
	  echo "generated files are not current; run 'make manifests generate' and commit:"; \
	  echo "$$out"; git --no-pager diff --stat -- api config/crd config/rbac; exit 1; \
	fi

dist: ## Render dist/install.yaml and dist/install-without-metrics-api.yaml (config/, image $(IMG)).
	VERSION=$(VERSION) IMG=$(IMG) KUSTOMIZE="$(KUSTOMIZE)" hack/dist.sh write

verify-dist: ## Fail when the committed dist/ is not the current rendering of config/ (make dist).
	VERSION=$(VERSION) IMG=$(IMG) KUSTOMIZE="$(KUSTOMIZE)" hack/dist.sh verify

e2e: ## End-to-end test: local control plane, PostgreSQL, operator, real keeper processes, kubectl, HPA.
	KUBEBUILDER_ASSETS=$${KUBEBUILDER_ASSETS:-$$(hack/setup-envtest.sh | tail -n 1)} \
	  $(GO) test -tags e2e -count=1 -timeout 25m -v ./test/e2e/...

soak: ## The e2e chaos test (TestChaos) in a loop for DURATION (default 30m), with a summary at the end (as root).
	DURATION=$(DURATION) hack/soak.sh

demo: ## The whole system locally: control plane, 3-shard RenderQueue, 200k rows, workers, HPA metric (KEEP=1 keeps it).
	hack/demo.sh

docker-build: ## Build the container image $(IMG) (Dockerfile).
	docker build -t $(IMG) .
