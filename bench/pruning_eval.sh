#!/usr/bin/env bash
# The table of docs/pruning.md: `tandem eval` of the shipped tiny model on its test split for
# every criterion x keep 12/8/4 of 16, in the three modes, printed as one markdown table. Plans
# and calibration statistics are the shipped ones (models/tiny-moe/pruning, calibrated on the
# validation split). Needs a build (scripts/build.sh); about 10 minutes on 2 cores.
#   bench/pruning_eval.sh [OUT_DIR]   (default build/pruning-eval: a JSON file per plan, log.txt)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/pruning-eval}
mkdir -p "$out"
model=models/tiny-moe
for criterion in frequency mass ean reap; do
  for keep in 12 8 4; do
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
awk '
  /^== / { criterion = $2; keep = $3; next }
  $1 == "full" && !full_done { full_done = 1
    printf "| - | 16 | full | %s | %s | %s | %s | %s | %s | %s | %s | %s | 1 | 1 |\n", $2, $3, $4, $5, $7, $8, $9, $10, $11 }
  $1 == "conventional" || $1 == "handoff" {
    printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", criterion, keep, $1, $2, $3, $4, $5, $7, $8, $9, $10, $11, $12, $13 }
' "$out/log.txt"
