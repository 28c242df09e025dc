#!/usr/bin/env bash
# Reproduces models/tiny-hybrid-moe and tests/golden/tiny-hybrid-moe from scratch: installs the
# training packages, fetches and splits the corpus exactly as for tiny-moe (same seed, same
# documents), takes tiny-moe's tokenizer as it is shipped, trains the Qwen3.5-MoE-layout hybrid
# of tools/train/configs/tiny-hybrid-moe.json (Gated DeltaNet in three of every four layers,
# 64 experts top-8 and a gated shared expert; the DeltaNet in its chunked form while training),
# exports, measures, writes the model card and the golden references, then (from a build)
# the calibration, the plans and the decoder overlays.
# Scratch files go to $TANDEM_TRAIN_WORK (default: build/train-work-hybrid); nothing there is
# committed.
set -euo pipefail
cd "$(dirname "$0")/../.."
work="${TANDEM_TRAIN_WORK:-$PWD/build/train-work-hybrid}"
model=models/tiny-hybrid-moe
scripts/setup.sh --train
mkdir -p "$work" "$model"
py=/usr/bin/python3
$py tools/train/prepare_data.py --work "$work" --model-dir "$model"
cp models/tiny-moe/tokenizer.model "$work/tokenizer.model"
cp models/tiny-moe/eval/prompts.txt "$model/eval/prompts.txt"
# One stage, load balancing per layer from the start. A 600-step cosine schedule, stopped
# after 65 minutes if it has not ended: the time the session it was trained in could give it.
OMP_WAIT_POLICY=PASSIVE $py tools/train/train.py --work "$work" \
  --model-config tools/train/configs/tiny-hybrid-moe.json --steps 600 --warmup 50 \
  --eval-every 150 --balance per-layer --aux-coef 0.05 --max-minutes 65
$py tools/train/export.py --work "$work" --checkpoint best.pt --model-dir "$model"
$py tools/train/model_card.py --model-dir "$model" --train-log "$work/train.log"
$py tools/train/golden.py --model-dir "$model" --out tests/golden/tiny-hybrid-moe
# The shipped calibration statistics and pruning plans (docs/pruning.md), from a build
# (scripts/build.sh): every criterion x 48, 32 and 16 of the 64 routed experts.
build/bin/tandem calibrate --model "$model" --text "$model/eval/valid.txt" \
  --out "$model/pruning/calibration-valid.json"
for criterion in frequency mass ean reap; do
  for keep in 48 32 16; do
    build/bin/tandem prune --stats "$model/pruning/calibration-valid.json" \
      --criterion "$criterion" --keep "$keep" --out "$model/pruning/$criterion-keep$keep.json"
  done
done
# The shipped decoder overlays (docs/distillation.md) and the golden reference of one.
TANDEM_TRAIN_TEXT="$work/train.txt" tools/train/distill_all.sh "$model" reap 32 100
$py tools/train/overlay_golden.py --model-dir "$model" --plan "$model/pruning/reap-keep32.json" \
  --overlay "$model/distill/reap-keep32-handoff.safetensors" \
  --out tests/golden/distill/tiny-hybrid-moe-reap-keep32
