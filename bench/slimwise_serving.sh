#!/usr/bin/env bash
# The phase-decoupled headline through the real cluster: the largest aggregate decode
# throughput a decoder sustains while every user still gets a target generation speed, the
# full decoder against pruned ones (docs/pruning.md "Serving under a per-user speed target").
#
# The model is a random-weight fine-grained dummy (--config, default bench/configs/dummy-fg:
# Qwen2-MoE layout, 64 experts top-8 and a shared expert, 2.6 GB of bf16) served with
# --load_format dummy and zipf routing; its vocabulary is set to the tokenizer's
# (models/tiny-fg-moe, 8192) so replies detokenize. Plans keep the experts the calibration of
# that routing finds most used (tandem calibrate + tandem prune --criterion frequency).
#
# For each decoder (full, then each --keeps) and each mode (disaggregated: tandem-prefill with
# the full pool, tandem-decode with the plan, KV over UCX; colocated: tandem-serve --plan, prompts
# on the full pool), `tandem bench serve` runs at each concurrency of --concurrency with fixed
# prompt and output lengths. Every decoder gets the same memory (--memory_bytes): the full
# decoder's weights plus --kv_sequences whole sequences of KV; a pruned decode instance turns the
# experts it does not hold into more KV blocks (colocated serving holds every expert for its
# prompts, so it gains none). Per-user speed is 1000 / inter-token latency (median and p90).
#
#   bench/slimwise_serving.sh [--config DIR] [--keeps 32,16] [--concurrency 1,2,4,8,16,32]
#                             [--input_len 128] [--output_len 128] [--kv_sequences 16]
#                             [--modes disaggregated,colocated] [--targets 4,6,8]
#                             [--routing zipf:1.0] [--out_dir DIR]
#   bench/slimwise_serving.sh --report DIR [--targets ...]   (the tables and chart again)
# Prints, per target, the table of the best throughput each decoder and mode reaches with
# median (and p90) per-user speed at or above it, the concurrency it takes, and the ratio to the
# full decoder; writes one result JSON per run, summary.tsv and (gnuplot) throughput_vs_speed.png
# to the output directory. Needs a build (scripts/build.sh), jq and gnuplot.
set -euo pipefail
cd "$(dirname "$0")/.."
config=bench/configs/dummy-fg
keeps=32,16
concurrency=1,2,4,8,16,32
input_len=128
output_len=128
kv_sequences=16
modes=disaggregated,colocated
targets=4,6,8
routing=zipf:1.0
out_dir=
report_only=
while (($#)); do
  case $1 in
    --config=* | --keeps=* | --concurrency=* | --input_len=* | --output_len=* | \
      --kv_sequences=* | --modes=* | --targets=* | --routing=* | --out_dir=*)
      name=${1%%=*}
      printf -v "${name#--}" '%s' "${1#*=}"
      shift ;;
    --config | --keeps | --concurrency | --input_len | --output_len | --kv_sequences | \
      --modes | --targets | --routing | --out_dir)
      (($# >= 2)) || { echo "$1 needs a value" >&2; exit 2; }
      printf -v "${1#--}" '%s' "$2"
      shift 2 ;;
    --report) (($# >= 2)) || { echo "$1 needs a directory" >&2; exit 2; }
      report_only=$2; shift 2 ;;
    *) echo "unknown argument $1 (see the head of $0)" >&2; exit 2 ;;
  esac
done
# The tables and the chart of a results directory: the best throughput at each target, by
# median and by p90 per-user speed (a run in which any request failed does not count: its
# users got no speed at all), and throughput against per-user speed.
report() {
  for target in ${targets//,/ }; do
    echo
    echo "target: $target tokens/s per user"
    awk -F'\t' -v t="$target" 'NR > 1 {
        key = $1 "\t" $2; blocks[key] = $8
        if (!(key in order)) { order[key] = ++n; keys[n] = key }
        if ($9 > 0) next
        if ($5 > 0 && 1000 / $5 >= t && $4 > best[key]) { best[key] = $4; at[key] = $3 }
        if ($6 > 0 && 1000 / $6 >= t && $4 > best90[key]) { best90[key] = $4; at90[key] = $3 }
      }
      END {
        printf "%-14s %-8s %9s %12s %8s %12s %8s %7s\n", "mode", "decoder", "kv_blocks",
               "median:tok/s", "at c", "p90:tok/s", "at c", "ratio"
        for (i = 1; i <= n; i++) {
          k = keys[i]; split(k, p, "\t")
          if (p[2] == "full") full[p[1]] = best[k]
          ratio = (full[p[1]] > 0 && best[k] > 0) ? sprintf("%.2fx", best[k] / full[p[1]]) : "-"
          printf "%-14s %-8s %9s %12.1f %8s %12.1f %8s %7s\n", p[1], p[2], blocks[k], best[k],
                 (k in at) ? at[k] : "-", best90[k], (k in at90) ? at90[k] : "-", ratio
        }
      }' "$out_dir/summary.tsv"
  done

  # Throughput against per-user speed (median), one line per mode and decoder.
  if gnuplot -e 'set terminal pngcairo' >/dev/null 2>&1; then
    terminal='pngcairo noenhanced size 900,560 font ",10"'
  else
    terminal='png noenhanced size 900,560'
  fi
  plots=()
  while IFS=$'\t' read -r mode decoder; do
    awk -F'\t' -v m="$mode" -v d="$decoder" 'NR > 1 && $1 == m && $2 == d && $5 > 0 {
        print 1000 / $5, $4, $3 }' "$out_dir/summary.tsv" | sort -g >"$run_dir/$mode-$decoder.dat"
    plots+=("'$run_dir/$mode-$decoder.dat' using 1:2 with linespoints title '$mode $decoder'")
  done < <(awk -F'\t' 'NR > 1 && !seen[$1 "\t" $2]++ { print $1 "\t" $2 }' "$out_dir/summary.tsv")
  gnuplot <<EOF
set terminal $terminal
set output '$out_dir/throughput_vs_speed.png'
set xlabel 'per-user generation speed (tokens/s, 1000 / median inter-token latency)'
set ylabel 'aggregate output throughput (tokens/s)'
set key outside right
set grid
plot $(IFS=,; echo "${plots[*]}")
EOF
  echo
  echo "results in $out_dir (summary.tsv, throughput_vs_speed.png, one JSON per run)"
}

for tool in jq gnuplot; do
  command -v "$tool" >/dev/null || { echo "$0 needs $tool (scripts/setup.sh)" >&2; exit 1; }
done
if [[ -n $report_only ]]; then
  out_dir=$report_only
  run_dir=$(mktemp -d /tmp/tandem-slimwise-run.XXXXXX)
  trap 'rm -rf "$run_dir"' EXIT
  report
  exit 0
fi
bin=build/bin
out_dir=${out_dir:-$(mktemp -d /tmp/tandem-slimwise.XXXXXX)}
mkdir -p "$out_dir"
run_dir=$(mktemp -d /tmp/tandem-slimwise-run.XXXXXX)
source scripts/lib.sh  # start, port, metric, stop_all
trap 'stop_all; rm -rf "$run_dir"' EXIT
# shellcheck disable=SC2034  # read by start (scripts/lib.sh)
start_timeout_s=300  # random weights of a few GB take a while to make
seed=7
dummy=(--load_format=dummy --routing="$routing" --seed="$seed")

# The model directory: the dummy's config at the tokenizer's vocabulary, tiny-fg-moe's tokenizer.
model=$run_dir/model
mkdir -p "$model"
tokenizer_model=models/tiny-fg-moe
vocab=$(jq .vocab_size "$tokenizer_model/config.json")
jq --argjson v "$vocab" '.vocab_size = $v' "$config/config.json" >"$model/config.json"
for file in tokenizer.model tokenizer_config.json generation_config.json; do
  ln -s "$PWD/$tokenizer_model/$file" "$model/$file"
done

# Plans: calibrate the dummy's routing on validation text, keep the most used experts.
head -c 16384 "$tokenizer_model/eval/valid.txt" >"$run_dir/calibration.txt"
echo "calibrating the dummy's routing ..." >&2
"$bin/tandem" calibrate --model="$model" --text="$run_dir/calibration.txt" \
  --out="$run_dir/stats.json" "${dummy[@]}" >&2
decoders=(full)
declare -A plan_flag=([full]="")
for keep in ${keeps//,/ }; do
  "$bin/tandem" prune --stats="$run_dir/stats.json" --criterion=frequency --keep="$keep" \
    --out="$out_dir/keep$keep.json" >&2
  decoders+=("keep$keep")
  plan_flag[keep$keep]="--plan=$out_dir/keep$keep.json"
done

# The memory every decoder gets: the full decoder's weights (as a decode instance holding every
# expert reports them) and kv_sequences sequences of KV.
start tandem-decode --kv_blocks=16 "${dummy[@]}"
weights=$(metric tandem-decode tandem_weight_bytes | awk '{ printf "%.0f", $1 }')
stop_all
[[ $weights =~ ^[0-9]+$ && $weights -gt 0 ]] || { echo "cannot read the weight bytes" >&2; exit 1; }
per_token=$(jq '2 * .num_hidden_layers * .num_key_value_heads * .head_dim * 2' "$model/config.json")
seq_tokens=$((input_len + output_len))
memory_bytes=$((weights + kv_sequences * (seq_tokens + 16) * per_token))
echo "weights $weights bytes; memory per decoder $memory_bytes bytes" >&2

printf "mode\tdecoder\tconcurrency\toutput_tok_s\tmedian_itl_ms\tp90_itl_ms\tmedian_ttft_ms\tkv_blocks\tfailed\tfile\n" \
  >"$out_dir/summary.tsv"
sweep() {  # sweep MODE DECODER SERVICE: every concurrency against SERVICE
  local mode=$1 decoder=$2 service=$3 c file blocks
  blocks=$(metric "$4" 'tandem_kv_blocks{.*state="free"')
  for c in ${concurrency//,/ }; do
    file="$out_dir/$mode-$decoder-c$c.json"
    echo "$mode $decoder at concurrency $c ..." >&2
    "$bin/tandem" bench serve --endpoint="127.0.0.1:$(port "$service" grpc_port)" \
      --model="$model" --dataset=random --num_prompts=$((2 * c)) --input_len="$input_len" \
      --output_len="$output_len" --request_rate=inf --max_concurrency="$c" --seed=0 \
      --label="$mode $decoder" --out="$file" >"${file%.json}.txt" ||
      { echo "$mode $decoder at $c: tandem bench serve failed" >&2; continue; }
    jq -r --arg m "$mode" --arg d "$decoder" --arg c "$c" --arg b "$blocks" --arg f "$file" \
      '[$m, $d, $c, .output_throughput, .median_itl_ms, .p90_itl_ms, .median_ttft_ms, $b,
        ([.errors[] | select(. != "")] | length), $f]
       | @tsv' "$file" >>"$out_dir/summary.tsv"
  done
}
common=(--kv_block_size=16 --max_running=64 --memory_bytes="$memory_bytes" "${dummy[@]}")
for mode in ${modes//,/ }; do
  for decoder in "${decoders[@]}"; do
    plan=${plan_flag[$decoder]}
    if [[ $mode == disaggregated ]]; then
      start tandem-prefill --kv_block_size=16 "${dummy[@]}"
      start tandem-decode "${common[@]}" ${plan:+"$plan"}
      start tandem-gateway --prefill="127.0.0.1:$(port tandem-prefill grpc_port)" \
        --decode="127.0.0.1:$(port tandem-decode grpc_port)"
      sweep "$mode" "$decoder" tandem-gateway tandem-decode
    else
      start tandem-serve "${common[@]}" ${plan:+"$plan"}
      sweep "$mode" "$decoder" tandem-serve tandem-serve
    fi
    stop_all
  done
done

echo
echo "$(nproc)-core $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); prompts" \
  "$input_len + output $output_len tokens, 2 x concurrency requests per run, $routing routing;" \
  "memory per decoder $memory_bytes bytes (full weights $weights + KV of $kv_sequences sequences)"
report
