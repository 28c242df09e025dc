#!/usr/bin/env bash
# The tables of docs/distillation.md: `tandem eval` of a shipped model's plans with and without
# their decoder overlays (tools/train/distill_all.sh), on the test split, by the protocol of
# docs/pruning.md. Rows per plan: conventional, handoff, handoff + the handoff-distilled decoder,
# conventional + ordinary distillation (split point 0), and the two crossed (each overlay in the
# other mode); the full model once. Needs a build and the overlays in MODEL/distill.
#   bench/distill_eval.sh [OUT_DIR] [MODEL_DIR] [CRITERIA] [KEEPS]
#     defaults: build/distill-eval, models/tiny-moe, "reap ean", "8 4"
#   TABLE_ONLY=1 prints the table from the JSON files of an earlier run.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/distill-eval}
model=${2:-models/tiny-moe}
criteria=${3:-reap ean}
keeps=${4:-8 4}
mkdir -p "$out"
eval_args=(--model "$model" --text "$model/eval/test.txt" --prompts "$model/eval/prompts.txt"
  --context 128 --near_tokens 32 --max_tokens 64 --stop=".,?,!")
first=1
for criterion in $criteria; do
  for keep in $keeps; do
    [ -n "${TABLE_ONLY:-}" ] && continue
    plan="$model/pruning/$criterion-keep$keep.json"
    base="$model/distill/$criterion-keep$keep"
    modes=conventional,handoff
    if [ $first = 1 ]; then modes=full,$modes; first=0; fi
    echo "== $criterion $keep base" >&2
    build/bin/tandem eval "${eval_args[@]}" --plan "$plan" --mode "$modes" \
      --out "$out/$criterion-keep$keep-base.json" >&2
    for tag in handoff split0; do
      echo "== $criterion $keep $tag" >&2
      build/bin/tandem eval "${eval_args[@]}" --plan "$plan" --overlay "$base-$tag.safetensors" \
        --mode handoff,conventional --out "$out/$criterion-keep$keep-$tag.json" >&2
    done
  done
done

# One markdown row per (criterion, keep, setting).
row() {  # criterion keep label file mode
  jq -r --arg c "$1" --arg k "$2" --arg setting "$3" --arg mode "$5" '
    .modes[] | select(.mode == $mode) |
    "| \($c) | \($k) | \($setting) | \(.perplexity*100|round/100) | \(.accuracy*1000|round/1000) | \(.near_prompt.perplexity*100|round/100) | \(.near_prompt.accuracy*1000|round/1000) | \(.generation.mean_length*10|round/10) | \(.generation.p50_length) | \(.generation.p90_length) | \(.generation.hit_max_share*100|round/100) | \(.generation.never_ended_share*100|round/100) | \(.generation.exact_agreement*100|round/100) | \(.generation.prefix_agreement*100|round/100) |"' "$4"
}
echo "| criterion | keep | setting | perplexity | accuracy | ppl@32 | acc@32 | length mean | p50 | p90 | hit 64 | never ended | exact | prefix |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
first=1
for criterion in $criteria; do
  for keep in $keeps; do
    f="$out/$criterion-keep$keep"
    if [ $first = 1 ]; then row - all full "$f-base.json" full; first=0; fi
    row "$criterion" "$keep" conventional "$f-base.json" conventional
    row "$criterion" "$keep" handoff "$f-base.json" handoff
    row "$criterion" "$keep" "**handoff + distilled**" "$f-handoff.json" handoff
    row "$criterion" "$keep" "**conventional + ordinary distillation**" "$f-split0.json" conventional
    row "$criterion" "$keep" "handoff + ordinary distillation" "$f-split0.json" handoff
    row "$criterion" "$keep" "conventional + handoff-distilled" "$f-handoff.json" conventional
  done
done
