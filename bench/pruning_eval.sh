#!/usr/bin/env bash
# The table of docs/pruning.md: `tandem eval` of the shipped tiny model on its test split for
# every criterion x keep 12/8/4 of 16, in the three modes. Plans and calibration statistics are
# the shipped ones (models/tiny-moe/pruning, calibrated on the validation split).
#   bench/pruning_eval.sh [OUT_DIR]   (default build/pruning-eval; about 8 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/pruning-eval}
mkdir -p "$out"
model=models/tiny-moe
for criterion in frequency mass ean reap; do
  for keep in 12 8 4; do
    echo "== $criterion keep $keep/16"
    build/bin/tandem eval --model "$model" --plan "$model/pruning/$criterion-keep$keep.json" \
      --text "$model/eval/test.txt" --prompts "$model/eval/prompts.txt" \
      --context 128 --max_tokens 64 --stop=".,?,!" --out "$out/$criterion-keep$keep.json"
  done
done
