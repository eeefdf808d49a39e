#!/usr/bin/env bash
# The README's first command: sets up (Debian packages, meson build in build/), builds, and runs
# the shipped example: a torchvision VisionTransformer trained on scikit-learn's handwritten
# digits (examples/digits/, made by examples/digits/make_digits.py), classifying the 360
# held-out images with `tessera run`. Prints the accuracy and checks that tessera's logits match
# PyTorch's (within 1e-4; typically ~1e-6) and that every prediction equals PyTorch's. Exits
# non-zero otherwise.
#   scripts/run_example.sh [BUILD_DIR]        (default: build)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD_DIR=${1:-build}

scripts/setup.sh "$BUILD_DIR"
ninja -C "$BUILD_DIR" apps/tessera apps/tessera-compare >/dev/null

OUT_DIR=$(mktemp -d)
trap 'rm -rf "$OUT_DIR"' EXIT
EX=examples/digits

echo "\$ tessera summary $EX/digits.safetensors --shape x=360,3,8,8 | tail -3"
"$BUILD_DIR/apps/tessera" summary "$EX/digits.safetensors" --shape x=360,3,8,8 | tail -3
echo
echo "\$ tessera run $EX/digits.safetensors --input $EX/input.safetensors --output logits.safetensors"
"$BUILD_DIR/apps/tessera" run "$EX/digits.safetensors" --input "$EX/input.safetensors" \
  --output "$OUT_DIR/logits.safetensors"
echo
echo "tessera's logits against PyTorch's ($EX/expected.safetensors), and the digits they predict:"
"$BUILD_DIR/apps/tessera-compare" "$OUT_DIR/logits.safetensors" "$EX/expected.safetensors" \
  --atol 1e-4 --labels "$EX/labels.safetensors"
