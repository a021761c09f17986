#!/usr/bin/env bash
# Builds every image the local cluster's node runs, as OCI image layout archives under
# bin/image/node/ (not bin/image/, where `make image` writes the two-platform index), and prints
# one line per image (the LAST lines of stdout): ROLE NAME ARCHIVE; then `binary PLATFORM PATH`,
# the renderqueue image's own binary, which the tests run on this machine too.
#
#   renderqueue  the renderqueue image, `make image` for this machine's platform only: the same
#                image (manifest digest) as that platform's entry in the two-platform index a user
#                pushes (hack/image's TestMakeImage checks it); the arm64 half is not built here
#   sandbox      the Pods' sandbox ("pause") image, `make pause-image`, this platform only
#   coredns      CoreDNS (the binary hack/setup-envtest.sh builds, without the forward plugin)
#   probe        the end-to-end tests' probe (test/e2e/cmd/probe: dial, dns, get, sleep)
#
# Usage: hack/images.sh [ASSETS_DIR]   (default: $KUBEBUILDER_ASSETS, else hack/setup-envtest.sh)
# Nothing is pulled: there is no registry; containerd imports the archives (test/e2e/cluster/node).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf 'images: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

assets=${1:-${KUBEBUILDER_ASSETS:-}}
if [ -z "$assets" ]; then
  assets=$(hack/setup-envtest.sh | tail -n 1)
fi
[ -x "$assets/coredns" ] || die "no coredns in $assets (hack/setup-envtest.sh builds it)"

out=bin/image/node
mkdir -p "$out"
arch=$(go env GOARCH)
make --no-print-directory image IMAGE_DIR="$out" IMAGE_PLATFORMS="linux/$arch" >&2
make --no-print-directory pause-image IMAGE_DIR="$out" IMAGE_PLATFORMS="linux/$arch" >&2

# The builder of `make image` (hack/image, a module of its own).
builder=$PWD/bin/image-builder
(cd hack/image && go build -o "$builder" .)
epoch=$(git log -1 --format=%ct 2>/dev/null || echo 0)

coredns_version=$("$assets/coredns" -version | sed -n 's/^CoreDNS-\([0-9.]*\).*/v\1/p' | head -n 1)
[ -n "$coredns_version" ] || die "could not tell the version of $assets/coredns"
coredns_name=localhost/renderqueue/coredns:$coredns_version
"$builder" build -out "$out/coredns.oci.tar" -name "$coredns_name" \
  -binary "linux/$arch=$assets/coredns" -path /coredns -user 65532:65532 -epoch "$epoch" \
  -label org.opencontainers.image.title=coredns -label org.opencontainers.image.version="$coredns_version" >&2

probe_name=localhost/renderqueue/e2e-probe:dev
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/probe" ./test/e2e/cmd/probe
"$builder" build -out "$out/probe.oci.tar" -name "$probe_name" \
  -binary "linux/$arch=$out/probe" -path /probe -user 65532:65532 -epoch "$epoch" \
  -label org.opencontainers.image.title=e2e-probe >&2

# The name each archive carries (its index's io.containerd.image.name annotation).
name_of() {
  tar -xOf "$1" index.json | tr ',' '\n' | sed -n 's/.*"io.containerd.image.name": *"\([^"]*\)".*/\1/p' | head -n 1
}
for role in renderqueue:renderqueue sandbox:pause coredns:coredns probe:probe; do
  r=${role%%:*} f=$out/${role#*:}.oci.tar
  [ -s "$f" ] || die "$f was not built"
  n=$(name_of "$f")
  [ -n "$n" ] || die "$f carries no io.containerd.image.name"
  echo "$r $n $PWD/$f"
done
bin=$out/linux_$arch/renderqueue # the Makefile's image_bin
[ -x "$bin" ] || die "$bin was not built"
echo "binary linux/$arch $PWD/$bin"
