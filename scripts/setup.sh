#!/usr/bin/env bash
# Installs what tessera needs to build and test (Debian 12 packages) and configures the build.
# Idempotent: installs only missing packages; reconfigures an existing build directory.
#   scripts/setup.sh [BUILD_DIR [MESON_OPTION...]]     (default: build)
# MESON_OPTIONs go to `meson setup` (scripts/sanitize.sh: -Db_sanitize=...); EXTRA_PACKAGES
# (space-separated Debian packages) are installed too (scripts/fuzz.sh: clang-14 ...).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD_DIR=${1:-build}
MESON_OPTIONS=("${@:2}")

PACKAGES=(g++ pkg-config meson ninja-build libopenblas-dev libhwy-dev libtbb-dev
          libboost-test-dev libcxxopts-dev nlohmann-json3-dev)
read -r -a extra <<< "${EXTRA_PACKAGES:-}"
PACKAGES+=("${extra[@]}")
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

# Warnings are errors here and in CI (-Wall -Wextra come from warning_level=2).
if [ -d "$BUILD_DIR" ] && [ -f "$BUILD_DIR/build.ninja" ]; then
  meson setup --reconfigure "$BUILD_DIR" --werror "${MESON_OPTIONS[@]}" >/dev/null
  # meson 1.0.1's --reconfigure keeps the old value of some options given again (cpp_args,
  # b_sanitize: measured); `meson configure` applies them, at the next ninja run.
  [ ${#MESON_OPTIONS[@]} -eq 0 ] || meson configure "$BUILD_DIR" "${MESON_OPTIONS[@]}" >/dev/null
else
  meson setup "$BUILD_DIR" --werror "${MESON_OPTIONS[@]}" >/dev/null
fi
