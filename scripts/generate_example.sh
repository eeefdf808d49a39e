#!/usr/bin/env bash
# The generation example: the character-level GPT of examples/fortunes/ (the `gpt` recipe,
# 0.84M parameters, trained on Debian's fortunes by examples/fortunes/make_fortunes.py) writes a
# fortune that starts with PROMPT, through `tessera generate` with its KV cache. Its token ids
# are ASCII codes, so the text goes in and comes out through od and awk; a fortune starts after
# a "%" line, as in the fortune files, so the prompt is sent after one.
#   scripts/generate_example.sh ["PROMPT" [NEW_TOKENS [TEMPERATURE [SEED]]]]
# Defaults: "The best way to", 200 characters, temperature 0.5 among the 40 likeliest, seed 1
# (at 0.8 the model invents more words; greedy, 0, loops as small char models do);
# Sets up and builds first, as scripts/run_example.sh does.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD_DIR=${BUILD_DIR:-build}
PROMPT=${1:-The best way to}
NEW_TOKENS=${2:-200}
TEMPERATURE=${3:-0.5}
SEED=${4:-1}

scripts/setup.sh "$BUILD_DIR"
ninja -C "$BUILD_DIR" apps/tessera >/dev/null

ids=$(printf '%%\n%s' "$PROMPT" | od -An -tu1 | tr -s ' \n' ',' | sed 's/^,//; s/,$//')
echo "\$ tessera generate examples/fortunes/fortunes.safetensors --prompt-ids ${ids:0:24}... \\"
echo "    --max-new-tokens $NEW_TOKENS --temperature $TEMPERATURE --top-k 40 --seed $SEED"
echo
text=$("$BUILD_DIR/apps/tessera" generate examples/fortunes/fortunes.safetensors \
         --prompt-ids "$ids" --max-new-tokens "$NEW_TOKENS" --temperature "$TEMPERATURE" \
         --top-k 40 --seed "$SEED" | awk '{ for (i = 1; i <= NF; i++) printf "%c", $i }')
# The fortune ends where the model starts the next one (a "%" line).
printf '%s%s\n' "$PROMPT" "$text" | sed '/^%$/,$d'
