#!/usr/bin/env bash
# The tables of docs/pruning.md: `tandem eval` of a shipped model on its test split for every
# criterion x keep, in the three modes, printed as one markdown table. Plans and calibration
# statistics are the shipped ones (MODEL/pruning, calibrated on the validation split). Needs a
# build (scripts/build.sh); about 10 minutes on 2 cores for tiny-moe, 15 for tiny-fg-moe.
#   bench/pruning_eval.sh [OUT_DIR] [MODEL_DIR] [KEEPS]
#     OUT_DIR    default build/pruning-eval: a JSON file per plan, log.txt
#     MODEL_DIR  default models/tiny-moe (keeps 12 8 4 of 16); models/tiny-fg-moe: 48 32 16 of 64
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/pruning-eval}
model=${2:-models/tiny-moe}
keeps=${3:-12 8 4}
mkdir -p "$out"
experts=$(jq '.num_local_experts // .num_experts // .text_config.num_experts' "$model/config.json")
for criterion in frequency mass ean reap; do
  for keep in $keeps; do
    echo "== $criterion $keep"
    build/bin/tandem eval --model "$model" --plan "$model/pruning/$criterion-keep$keep.json" \
      --text "$model/eval/test.txt" --prompts "$model/eval/prompts.txt" \
      --context 128 --near_tokens 32 --max_tokens 64 --stop=".,?,!" \
      --out "$out/$criterion-keep$keep.json"
  done
done | tee "$out/log.txt"

# One row per (criterion, keep, mode); the full model once, first.
echo
echo "| criterion | keep | mode | perplexity | accuracy | ppl@32 | acc@32 | length mean | p50 | p90 | hit 64 | never ended | exact | prefix |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
awk -v experts="$experts" '
  /^== / { criterion = $2; keep = $3; next }
  $1 == "full" && !full_done { full_done = 1
    printf "| - | %s | full | %s | %s | %s | %s | %s | %s | %s | %s | %s | 1 | 1 |\n", experts, $2, $3, $4, $5, $7, $8, $9, $10, $11 }
  $1 == "conventional" || $1 == "handoff" {
    printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", criterion, keep, $1, $2, $3, $4, $5, $7, $8, $9, $10, $11, $12, $13 }
' "$out/log.txt"
