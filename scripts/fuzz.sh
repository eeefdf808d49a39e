#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/: clang-14, ASan + UBSan + coverage) in the ASan build that
# scripts/sanitize.sh shares (scripts/setup_asan.sh, build-asan) and runs each on its committed
# seed corpus for SECONDS (default 60), one after the other.
#   scripts/fuzz.sh [SECONDS [TARGET...]]      TARGET: fuzz_safetensors fuzz_network fuzz_run
#                                             fuzz_panel_cache
# New inputs go to build-asan/corpus/<target>/ (kept between runs, never committed), crashes to
# build-asan/artifacts/<target>/. Long runs: `scripts/fuzz.sh 3600`; SECURITY.md has more.
# Exits non-zero when a target crashed, leaked, hung (-timeout) or ran out of memory.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SECONDS_PER_TARGET=${1:-60}
TARGETS=("${@:2}")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(fuzz_safetensors fuzz_network fuzz_run fuzz_panel_cache)
export BUILD_DIR=${BUILD_DIR:-build-asan}

scripts/setup_asan.sh
ninja -C "$BUILD_DIR" "${TARGETS[@]/#/fuzz/}"

# UBSan findings abort, so libFuzzer records them as crashes.
export UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
status=0
for t in "${TARGETS[@]}"; do
  seeds="fuzz/corpus/${t#fuzz_}"
  corpus="$BUILD_DIR/corpus/$t"
  artifacts="$BUILD_DIR/artifacts/$t"
  mkdir -p "$corpus" "$artifacts"
  log="$BUILD_DIR/$t.log"
  echo "fuzz: $t for ${SECONDS_PER_TARGET}s (log: $log)"
  # -timeout: one input over 10 s is a hang. -malloc_limit_mb: fuzz_run's memory budget is
  # 16 MiB, so a single allocation over 32 MiB means an estimate missed it (fuzz/fuzz_run.cpp).
  rc=0
  "$BUILD_DIR/fuzz/$t" "$corpus" "$seeds" -max_total_time="$SECONDS_PER_TARGET" -timeout=10 \
    -rss_limit_mb=2048 -malloc_limit_mb=32 -artifact_prefix="$artifacts/" \
    -print_final_stats=1 -print_funcs=0 >"$log" 2>&1 || rc=$?
  runs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$' || true)
  speed=$(grep -Eo 'stat::average_exec_per_sec: *[0-9]+' "$log" | grep -Eo '[0-9]+$' || true)
  cov=$(grep -Eo 'cov: [0-9]+' "$log" | tail -1 | grep -Eo '[0-9]+' || true)
  echo "fuzz: $t: ${runs:-?} runs, ${speed:-?} exec/s, coverage ${cov:-?} edges," \
       "corpus $(ls "$corpus" | wc -l) + $(ls "$seeds" | wc -l) seeds, exit $rc"
  if [ $rc -ne 0 ]; then
    echo "fuzz: $t FAILED; the end of its log:" >&2
    tail -n 60 "$log" >&2
    ls -l "$artifacts" >&2
    status=1
  fi
done
exit $status
