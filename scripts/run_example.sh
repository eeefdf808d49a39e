#!/usr/bin/env bash
# The README's first command: sets up (Debian packages, meson build in build/), builds, runs the
# example transformer encoder (examples/encoder/, a checkpoint carrying its network) through
# `tessera run`, and compares the output with PyTorch's (examples/encoder/expected.safetensors,
# written by examples/encoder/make_encoder.py). Exits non-zero when they differ by more than
# 1e-4 (float32 vs float32; the difference is typically below 1e-6).
#   scripts/run_example.sh [BUILD_DIR]        (default: build)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD_DIR=${1:-build}

scripts/setup.sh "$BUILD_DIR"
ninja -C "$BUILD_DIR" apps/tessera apps/tessera-compare >/dev/null

OUT_DIR=$(mktemp -d)
trap 'rm -rf "$OUT_DIR"' EXIT
EX=examples/encoder

echo "\$ tessera summary $EX/encoder.safetensors"
"$BUILD_DIR/apps/tessera" summary "$EX/encoder.safetensors"
echo
echo "\$ tessera run $EX/encoder.safetensors --input $EX/input.safetensors --output out.safetensors"
"$BUILD_DIR/apps/tessera" run "$EX/encoder.safetensors" --input "$EX/input.safetensors" \
  --output "$OUT_DIR/out.safetensors"
echo
echo "tessera's output against PyTorch's ($EX/expected.safetensors):"
"$BUILD_DIR/apps/tessera-compare" "$OUT_DIR/out.safetensors" "$EX/expected.safetensors" --atol 1e-4
