#!/usr/bin/env bash
# The shipped decoder overlays (docs/distillation.md): for each plan, the pruned decoder
# distilled to continue from the full model's KV cache (split points uniform, "handoff") and,
# as the baseline for conventional pruning, ordinary distillation (split point 0, "split0").
# Overlays go to MODEL/distill/CRITERION-keepK-{handoff,split0}.safetensors, logs to
# $TANDEM_DISTILL_WORK (default build/distill). Needs the training split of
# tools/train/prepare_data.py (the tiny models share it): $TANDEM_TRAIN_TEXT, default
# build/train-work/train.txt, else build/train-work-fg/train.txt, else made here.
#   tools/train/distill_all.sh MODEL_DIR "CRITERIA" "KEEPS" [STEPS]
# About 4 minutes per overlay for tiny-moe (150 steps of 4 x 512 tokens), 9 for tiny-fg-moe.
set -euo pipefail
cd "$(dirname "$0")/../.."
model=${1:?MODEL_DIR}
criteria=${2:?CRITERIA}
keeps=${3:?KEEPS}
steps=${4:-150}
work="${TANDEM_DISTILL_WORK:-$PWD/build/distill}"
py=/usr/bin/python3
text="${TANDEM_TRAIN_TEXT:-}"
if [ -z "$text" ]; then
  for candidate in build/train-work/train.txt build/train-work-fg/train.txt; do
    if [ -f "$candidate" ]; then text=$candidate; break; fi
  done
fi
if [ -z "$text" ]; then
  scripts/setup.sh --train
  $py tools/train/prepare_data.py --work build/train-work --model-dir "$work/scratch-model"
  text=build/train-work/train.txt
fi
name=$(basename "$model")
mkdir -p "$work" "$model/distill"
for criterion in $criteria; do
  for keep in $keeps; do
    for split in uniform zero; do
      tag=$([ "$split" = uniform ] && echo handoff || echo split0)
      out="$model/distill/$criterion-keep$keep-$tag.safetensors"
      echo "== $name $criterion keep $keep $tag"
      OMP_WAIT_POLICY=PASSIVE $py tools/train/distill.py --model-dir "$model" \
        --plan "$model/pruning/$criterion-keep$keep.json" --train-text "$text" \
        --split "$split" --steps "$steps" --eval-every 50 --out "$out" \
        > "$work/$name-$criterion-keep$keep-$tag.log" 2>&1
      tail -1 "$work/$name-$criterion-keep$keep-$tag.log"
    done
  done
done
