#!/usr/bin/env bash
# Builds a release into RELEASE_DIR (default dist/release, not committed): everything a release
# page carries.
#
#   renderqueue-VERSION.oci.tar              the image (make image: IMAGE_PLATFORMS), an OCI layout archive
#   renderqueue-VERSION.oci.tar.digest       its index digest (what a registry reports after a push)
#   renderqueue-MAJOR.MINOR.PATCH.tgz        the Helm chart (charts/renderqueue), the image pinned by digest
#   install.yaml, install-without-metrics-api.yaml
#                                            config/default and config/without-metrics-api, the image
#                                            pinned by tag and digest (REPO:VERSION@sha256:...)
#   renderqueue-OS-ARCH                      the binary, for RELEASE_PLATFORMS
#   kubectl-renderqueue-OS-ARCH.tar.gz       the kubectl plugin (the same binary as kubectl-renderqueue), for krew
#   renderqueue.krew.yaml                    the krew plugin manifest (each archive's URL and SHA-256)
#   renderqueue-VERSION.cdx.json             the SBOM of the binary (CycloneDX, cyclonedx-gomod, pinned)
#   RELEASE-NOTES.md                         CHANGELOG.md's section of VERSION
#   SHA256SUMS                               sha256sum of every file above
#
# Environment (the Makefile sets them): VERSION (vMAJOR.MINOR.PATCH[-PRE], required), RELEASE_DIR,
# REPO (the image repository, default ghcr.io/renderqueue/renderqueue), IMAGE_PLATFORMS (default
# linux/amd64 linux/arm64), RELEASE_PLATFORMS (default linux/amd64 linux/arm64 darwin/amd64
# darwin/arm64), CHANGELOG (default CHANGELOG.md: it must have a section "## [VERSION] - DATE"),
# SOURCE_DATE_EPOCH (the archives' times; default the commit's), GO, MAKE, HELM (default
# $RENDERQUEUE_HELM, else hack/helm.sh's).
# Usage: hack/release.sh
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "release: $*" >&2; exit 1; }

VERSION=${VERSION:-}
[[ $VERSION =~ ^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$ ]] ||
  die "VERSION=$VERSION is not a semantic version vMAJOR.MINOR.PATCH[-PRERELEASE] (make release VERSION=v0.2.0)"
OUT=${RELEASE_DIR:-dist/release}
REPO=${REPO:-ghcr.io/renderqueue/renderqueue}
IMAGE_PLATFORMS=${IMAGE_PLATFORMS:-linux/amd64 linux/arm64}
RELEASE_PLATFORMS=${RELEASE_PLATFORMS:-linux/amd64 linux/arm64 darwin/amd64 darwin/arm64}
CHANGELOG=${CHANGELOG:-CHANGELOG.md}
GO=${GO:-go}
MAKE=${MAKE:-make}
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
CYCLONEDX_GOMOD=${CYCLONEDX_GOMOD:-$GO run github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod@v1.10.0}
SOURCE_URL=https://github.com/renderqueue/renderqueue

# The release notes: CHANGELOG's section of VERSION, up to the next "## " heading.
notes=$(awk -v v="$VERSION" '
  /^## / { if (on) exit; if (index($0, "## [" v "] - ") == 1) on = 1 }
  on { print }' "$CHANGELOG")
[ -n "$notes" ] || die "$CHANGELOG has no section \"## [$VERSION] - YYYY-MM-DD\": write it first (see its head)"

rm -rf "$OUT"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
work="$OUT/.work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
printf '%s\n' "$notes" >"$OUT/RELEASE-NOTES.md"

# The image, as make image builds it (reproducible: the same commit gives the same digest).
echo "release: image $REPO:$VERSION for $IMAGE_PLATFORMS"
$MAKE --no-print-directory image VERSION="$VERSION" IMG="$REPO:$VERSION" IMAGE_DIR="$work/image" \
  IMAGE_PLATFORMS="$IMAGE_PLATFORMS" SOURCE_DATE_EPOCH="$SOURCE_DATE_EPOCH" >"$work/image.log" 2>&1 ||
  { cat "$work/image.log" >&2; die "make image failed"; }
digest=$(cat "$work/image/renderqueue.oci.tar.digest")
[[ $digest =~ ^sha256:[0-9a-f]{64}$ ]] || die "make image wrote no digest ($digest)"
cp "$work/image/renderqueue.oci.tar" "$OUT/renderqueue-$VERSION.oci.tar"
echo "$digest" >"$OUT/renderqueue-$VERSION.oci.tar.digest"

# The install manifests, pinned to the image by digest.
DIST_DIR="$work/dist" VERSION="$VERSION" IMG="$REPO:$VERSION@$digest" hack/dist.sh write >/dev/null
cp "$work/dist/install.yaml" "$work/dist/install-without-metrics-api.yaml" "$OUT/"

# The Helm chart: its version the release's (without the v), the image pinned by tag and digest.
HELM=${HELM:-${RENDERQUEUE_HELM:-$(hack/helm.sh | tail -n 1)}}
cp -r charts/renderqueue "$work/chart"
sed -i -e "s|^  tag: \"\"|  tag: \"$VERSION\"|" -e "s|^  digest: \"\"|  digest: \"$digest\"|" "$work/chart/values.yaml"
grep -q "^  digest: \"$digest\"" "$work/chart/values.yaml" || die "could not pin the chart's image (values.yaml's image.digest)"
"$HELM" package "$work/chart" --version "${VERSION#v}" --app-version "$VERSION" --destination "$OUT" >/dev/null

# The binaries (the flags of make image's, so linux's are the image's), and the plugin archives.
for p in $RELEASE_PLATFORMS; do
  os=${p%/*} arch=${p#*/}
  echo "release: renderqueue $os/$arch"
  CGO_ENABLED=0 GOOS=$os GOARCH=$arch $GO build -trimpath -buildvcs=false -ldflags "-s -w -X main.version=$VERSION" \
    -o "$OUT/renderqueue-$os-$arch" ./cmd/renderqueue
  d="$work/plugin-$os-$arch"
  mkdir -p "$d"
  cp "$OUT/renderqueue-$os-$arch" "$d/kubectl-renderqueue"
  cp LICENSE "$d/LICENSE"
  touch -d "@$SOURCE_DATE_EPOCH" "$d/kubectl-renderqueue" "$d/LICENSE"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$SOURCE_DATE_EPOCH" -C "$d" -cf - kubectl-renderqueue LICENSE |
    gzip -n -9 >"$OUT/kubectl-renderqueue-$os-$arch.tar.gz"
done

# The krew manifest: each platform's archive, by URL and SHA-256.
{
  cat <<YAML
apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: renderqueue
spec:
  version: $VERSION
  homepage: $SOURCE_URL
  shortDescription: Show a RenderQueue's shards, due counts and lateness
  description: |
    Prints the shards of a RenderQueue (renderqueue.dev/v1alpha1): each shard's state, whether its
    due count is exact, its due rows, edge, last walk and p99 lateness, and what comes due by hour,
    read through the API server's Pod proxy. Usage: kubectl renderqueue NAME [-n NAMESPACE].
  platforms:
YAML
  for p in $RELEASE_PLATFORMS; do
    os=${p%/*} arch=${p#*/}
    sum=$(sha256sum "$OUT/kubectl-renderqueue-$os-$arch.tar.gz" | cut -d' ' -f1)
    cat <<YAML
    - selector:
        matchLabels:
          os: $os
          arch: $arch
      uri: $SOURCE_URL/releases/download/$VERSION/kubectl-renderqueue-$os-$arch.tar.gz
      sha256: $sum
      bin: kubectl-renderqueue
      files:
        - from: kubectl-renderqueue
          to: .
        - from: LICENSE
          to: .
YAML
  done
} >"$OUT/renderqueue.krew.yaml"

# The SBOM of the binary the image runs (the first image platform's): its modules at the versions
# linked in, as "go version -m" reads them from the binary.
first=${IMAGE_PLATFORMS%% *}
sbom_bin="$OUT/renderqueue-${first%/*}-${first#*/}"
[ -f "$sbom_bin" ] || sbom_bin="$work/image/${first%/*}_${first#*/}/renderqueue"
echo "release: SBOM of $(basename "$sbom_bin")"
$CYCLONEDX_GOMOD bin -json -version "$VERSION" -noserial -notimestamp \
  -output "$OUT/renderqueue-$VERSION.cdx.json" "$sbom_bin" 2>"$work/sbom.log" ||
  { cat "$work/sbom.log" >&2; die "cyclonedx-gomod failed"; }

# Checksums of everything but themselves.
rm -rf "$work"
trap - EXIT
(cd "$OUT" && find . -maxdepth 1 -type f ! -name SHA256SUMS -printf '%f\n' | LC_ALL=C sort | xargs sha256sum >SHA256SUMS)
echo "release: $VERSION in $OUT (image $REPO:$VERSION@$digest)"
