# renderqueue — see README.md. Every target does its own setup.
GO ?= go
GOLANGCI_LINT_VERSION ?= v2.15.0
PKGS ?= ./...

.PHONY: all build test bench fmt vet lint run tidy
all: build

build: ## Build bin/renderqueue.
	$(GO) build -o bin/renderqueue ./cmd/renderqueue

test: ## Run every test (starts a throwaway PostgreSQL; builds envtest binaries once).
	hack/test.sh $(PKGS)

bench: ## Run the benchmarks named in the issues (starts a throwaway PostgreSQL).
	BENCH=1 hack/bench.sh

fmt: ## Format the code.
	gofmt -w $$(git ls-files '*.go')

vet: ## go vet and a gofmt check.
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

lint: ## golangci-lint, pinned, through the Go module proxy.
	$(GO) run github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION) run ./...

tidy:
	$(GO) mod tidy
