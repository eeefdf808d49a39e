#!/usr/bin/env bash
# The whole test suite under AddressSanitizer + UndefinedBehaviorSanitizer (with LeakSanitizer),
# in the ASan build that scripts/fuzz.sh shares (scripts/setup_asan.sh: clang-14, build-asan),
# with warnings as errors. Any sanitizer report
# fails the job, also one from a child process (the cli suite runs the tessera binary): reports
# go to files under BUILD_DIR/sanitizer-reports/, which must stay empty.
#   scripts/sanitize.sh            (BUILD_DIR=build-asan unless set)
# OpenBLAS and oneTBB are not instrumented (SECURITY.md), and no suppression is needed for them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export BUILD_DIR=${BUILD_DIR:-build-asan}
reports="$PWD/$BUILD_DIR/sanitizer-reports"
rm -rf "$reports"
mkdir -p "$reports"

# halt_on_error: the first report aborts the process, so the test that caused it fails too.
# allocator_may_return_null: a failed allocation returns null, as malloc does, instead of
# aborting; the cli suite checks that tessera turns one into E_INTERNAL (exit 1).
asan="detect_leaks=1:halt_on_error=1:abort_on_error=1:strict_string_checks=1"
asan="$asan:allocator_may_return_null=1"
export ASAN_OPTIONS="$asan:check_initialization_order=1:strict_init_order=1:log_path=$reports/asan"
export UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1:log_path=$reports/ubsan"

status=0
scripts/setup_asan.sh
ninja -C "$BUILD_DIR"
meson test -C "$BUILD_DIR" --print-errorlogs || status=$?
log="$BUILD_DIR/meson-logs/testlog.txt"
passed=$(grep -Eo '[0-9]+ test cases? out of [0-9]+ passed' "$log" | tail -1 | grep -Eo '^[0-9]+' || true)
echo "sanitize: ${passed:-0} test cases passed"

# A report file holding only "WARNING: AddressSanitizer failed to allocate 0x... bytes" is the
# allocation the cli suite makes fail on purpose (16 PiB of buffers -> E_INTERNAL, exit 1);
# anything else in any file fails the job.
allowed='^==[0-9]+==WARNING: AddressSanitizer failed to allocate 0x[0-9a-f]+ bytes$'
for f in "$reports"/*; do
  [ -e "$f" ] || continue
  if grep -Evq "$allowed" "$f"; then
    echo "sanitize: sanitizer report $f:" >&2
    cat "$f" >&2
    status=1
  fi
done
[ $status -eq 0 ] && echo "sanitize: no sanitizer report"
exit $status
