#!/usr/bin/env bash
# Configures the one ASan + UBSan build that scripts/sanitize.sh (the whole test suite) and
# scripts/fuzz.sh (the libFuzzer targets) share: clang-14, -O2 -g (debugoptimized) for usable
# stack traces, assertions on, coverage instrumentation for libFuzzer (-Dfuzz=true), warnings as
# errors. One build instead of two: with GCC's sanitizers the suite's build alone took most of
# CI's 73 minutes (GCC 12 spent 19 minutes of CPU on the flash-attention kernel file, clang-14 3).
#   scripts/setup_asan.sh        (BUILD_DIR=build-asan unless set)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD_DIR=${BUILD_DIR:-build-asan}
# libFuzzer and clang's sanitizer runtimes: Debian's clang-14 packages.
# -fno-sanitize=float-cast-overflow: clang's -fsanitize=undefined includes it (GCC's does not, so
# the earlier GCC job never checked it), and it fires inside Highway 1.0.3's own exp on the
# SCALAR target (contrib/math ToInt32 casts NaN to int: x86's cvttps2dq defines that, C++ does
# not), which the tests run on purpose with NaN inputs. Every other UBSan check stays on.
EXTRA_PACKAGES="clang-14 libclang-rt-14-dev libfuzzer-14-dev" CC=clang-14 CXX=clang++-14 \
  scripts/setup.sh "$BUILD_DIR" -Dfuzz=true -Db_sanitize=address,undefined -Db_lundef=false \
  --buildtype=debugoptimized -Dtests=true -Dbenchmarks=false \
  -Dcpp_args=-fno-sanitize=float-cast-overflow
