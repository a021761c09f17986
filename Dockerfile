# syntax=docker/dockerfile:1
# The renderqueue image: one static binary (operator, keeper, schema, seed, worker-sim, ...) on a
# distroless non-root base. Build with `make docker-build IMG=...` or
#   docker build -t REGISTRY/renderqueue:TAG .
# Cross-build with `docker buildx build --platform linux/amd64,linux/arm64 ...`.

ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
ARG TARGETOS=linux
ARG TARGETARCH
ARG VERSION=dev
WORKDIR /src
# Dependencies first, so that a source change does not refetch them.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/renderqueue ./cmd/renderqueue

FROM gcr.io/distroless/static:nonroot
COPY --from=build /out/renderqueue /renderqueue
USER 65532:65532
ENTRYPOINT ["/renderqueue"]
