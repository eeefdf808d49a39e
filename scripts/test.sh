#!/usr/bin/env bash
# Sets up (Debian packages, meson), builds everything with warnings as errors and runs the whole
# test suite. This is the README's test command and what .ci/run calls.
#   scripts/test.sh [MESON_OPTION...]    (BUILD_DIR=build unless set; options go to meson setup,
#                                         as scripts/sanitize.sh does for its own build)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD_DIR=${BUILD_DIR:-build}
scripts/setup.sh "$BUILD_DIR" "$@"
ninja -C "$BUILD_DIR"
status=0
meson test -C "$BUILD_DIR" --print-errorlogs || status=$?
# Boost.Test's report ("N test cases out of M passed/failed") as one plain closing line.
log="$BUILD_DIR/meson-logs/testlog.txt"
if [ -f "$log" ]; then
  passed=$(grep -Eo '[0-9]+ test cases? out of [0-9]+ passed' "$log" | tail -1 | grep -Eo '^[0-9]+' || true)
  failed=$(grep -Eo '[0-9]+ test cases? out of [0-9]+ failed' "$log" | tail -1 | grep -Eo '^[0-9]+' || true)
  echo "tests: ${passed:-0} passed, ${failed:-0} failed"
fi
exit $status
