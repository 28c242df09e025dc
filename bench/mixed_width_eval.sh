#!/usr/bin/env bash
# The quality table of docs/mixed-width.md: the shipped tiny model with its neurons reordered
# by importance (tandem reorder), all 16 experts kept, and tier plans at several cut-offs and
# warm widths; `tandem eval` in full and handoff mode (full prefill, mixed-width decode) on the
# test split. Needs a build (scripts/build.sh); about 6 minutes on 2 cores.
#   bench/mixed_width_eval.sh [OUT_DIR]   (default build/mixed-width-eval)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/mixed-width-eval}
mkdir -p "$out"
model=models/tiny-moe
stats=$model/pruning/calibration-valid.json
tandem=build/bin/tandem
$tandem reorder --model "$model" --stats "$stats" --out "$out/tiny-moe-reordered"
$tandem prune --stats "$stats" --criterion frequency --keep 16 --out "$out/keep16.json"
# Masking-loss dominance measured on the first 3 validation documents.
head -n 3 "$model/eval/valid.txt" > "$out/dominance.txt"
# name hot_share warm_share warm_width dominance
settings=(
  "h50-w30-192-router 0.5 0.3 192 router"
  "h50-w30-192-masking 0.5 0.3 192 masking"
  "h30-w40-96-router 0.3 0.4 96 router"
  "h70-w20-192-router 0.7 0.2 192 router"
  "h0-w0-cold-router 0 0 192 router"
)
for setting in "${settings[@]}"; do
  read -r name hot warm width dominance <<<"$setting"
  echo "== $name"
  $tandem tier --plan "$out/keep16.json" --stats "$stats" --model "$out/tiny-moe-reordered" \
    --hot_share "$hot" --warm_share "$warm" --warm_width "$width" --dominance "$dominance" \
    --text "$out/dominance.txt" --out "$out/$name.json"
  $tandem eval --model "$out/tiny-moe-reordered" --plan "$out/$name.json" --mode full,handoff \
    --text "$model/eval/test.txt" --prompts "$model/eval/prompts.txt" \
    --context 128 --near_tokens 32 --max_tokens 64 --stop=".,?,!" --out "$out/$name.eval.json"
done 2>&1 | tee "$out/log.txt"
