#!/usr/bin/env bash
# Headless Chromium for the console's browser tests (pkg/console, test/e2e).
#
#   hack/chromium.sh        find Chromium, installing Debian's `chromium` package with apt-get
#                           when it is missing and we are root; print its path as the LAST line of
#                           stdout. Fails, saying what to install, when it cannot.
#
# CHROMIUM=/path/to/chromium names a binary to use instead. The tests start it themselves, headless
# with a fresh profile and no network beyond the test's own loopback servers (see
# pkg/console/browsertest).
set -euo pipefail

log() { echo "chromium.sh: $*" >&2; }
die() { log "$*"; exit 1; }

if [ -n "${CHROMIUM:-}" ]; then
  [ -f "$CHROMIUM" ] && [ -x "$CHROMIUM" ] || die "CHROMIUM=$CHROMIUM is not an executable file"
  echo "$CHROMIUM"
  exit 0
fi

find_chromium() {
  local c
  for c in chromium chromium-browser google-chrome-stable google-chrome; do
    if command -v "$c" >/dev/null 2>&1; then command -v "$c"; return 0; fi
  done
  return 1
}

if path=$(find_chromium); then echo "$path"; exit 0; fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  log "Chromium not found; installing the Debian package 'chromium' (about 100 MB, once)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >&2
  if path=$(find_chromium); then echo "$path"; exit 0; fi
fi
die "Chromium not found. Install it:
  Debian/Ubuntu: sudo apt-get install -y chromium
  Fedora/RHEL:   sudo dnf install -y chromium
  macOS:         brew install --cask chromium
or set CHROMIUM to its path."
