# syntax=docker/dockerfile:1
# The renderqueue image for users with Docker: the same image `make image` builds without a Docker
# daemon (docs/image.md), built FROM scratch with the same files, modes and owners:
#   /renderqueue                          the static binary (operator, keeper, schema, seed, ...)
#   /etc/passwd, /etc/group               root, nobody and nonroot (65532), as distroless static:nonroot
#   /etc/ssl/certs/ca-certificates.crt    Mozilla's roots from golang.org/x/crypto/x509roots/fallback
#   /tmp (1777), /home/nonroot (0700, 65532:65532)
# and no shell. hack/image writes the base's files for both paths; its TestMakeImage checks that
# this file (ENTRYPOINT, USER, labels, the files COPY gives) agrees with `make image`'s image.
# Build with `make docker-build IMG=...` or
#   docker build --build-arg VERSION=v0.1.0 -t REGISTRY/renderqueue:TAG .
# Cross-build with `docker buildx build --platform linux/amd64,linux/arm64 ...`.

ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
ARG TARGETOS=linux
ARG TARGETARCH
ARG VERSION=dev
WORKDIR /src
# Dependencies first, so that a source change does not refetch them.
COPY go.mod go.sum ./
COPY hack/image/go.mod hack/image/go.sum hack/image/
RUN --mount=type=cache,target=/go/pkg/mod go mod download && go -C hack/image mod download
COPY . .
# The base's files (passwd, group, CA certificates, /tmp, /home/nonroot), from the code that
# writes make image's base layer.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    go -C hack/image run . rootfs -out /out/base
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -buildvcs=false -ldflags "-s -w -X main.version=${VERSION}" -o /out/renderqueue ./cmd/renderqueue

FROM scratch
ARG VERSION=dev
ARG REVISION=unknown
ARG CREATED=1970-01-01T00:00:00Z
# COPY keeps modes but not owners: everything is root's but the non-root user's home.
COPY --from=build /out/base/rootfs/ /
COPY --from=build --chown=65532:65532 /out/base/home/ /home/
COPY --from=build /out/renderqueue /renderqueue
LABEL org.opencontainers.image.title="renderqueue" \
      org.opencontainers.image.source="https://github.com/renderqueue/renderqueue" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}"
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
USER 65532:65532
ENTRYPOINT ["/renderqueue"]
