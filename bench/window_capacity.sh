#!/usr/bin/env bash
# What keeping sliding-window layers in rings buys at long context (docs/kv-cache.md "Sliding
# windows"): tandem-serve on dummy weights of a model with windowed and whole-context layers
# (default: gpt-oss-20b's attention exactly, its MoE narrowed), weights and KV together held to
# --memory_gib, once with --kv_window_rings and once without. Prints per mode the paged layers'
# blocks the pool got, the state slots' bytes (the rings), the KV bytes a token costs at
# --context, and how many sequences of --context tokens the pool holds (its blocks, and with
# rings also its --max_running state slots). --snapshots sets the prefix cache's state
# snapshots (default: the service's); --modes the layouts to run ("false true": paged, then
# rings; a model whose windowed layers have another shape than its whole-context ones, Gemma 4,
# keeps rings either way, so "true" alone). Needs a build (scripts/build.sh) and jq.
#   bench/window_capacity.sh [--model DIR] [--memory_gib 8] [--context 32768] [--max_running 16]
#                            [--snapshots N] [--modes "false true"]
set -euo pipefail
cd "$(dirname "$0")/.."
model=bench/configs/dummy-gpt-oss-20b-attn
memory_gib=8
context=32768
max_running=16
snapshots_flag=
modes="false true"
while (($#)); do
  case $1 in
    --snapshots=*) snapshots_flag=--prefix_state_snapshots=${1#*=}; shift ;;
    --snapshots) snapshots_flag=--prefix_state_snapshots=$2; shift 2 ;;
    --model=* | --memory_gib=* | --context=* | --max_running=* | --modes=*)
      name=${1%%=*}
      printf -v "${name#--}" '%s' "${1#*=}"
      shift ;;
    --model | --memory_gib | --context | --max_running | --modes)
      (($# >= 2)) || { echo "$1 needs a value" >&2; exit 2; }
      printf -v "${1#--}" '%s' "$2"
      shift 2 ;;
    *) echo "unknown argument $1 (see the head of $0)" >&2; exit 2 ;;
  esac
done
command -v jq >/dev/null || { echo "$0 needs jq (scripts/setup.sh)" >&2; exit 1; }
bin=build/bin
run_dir=$(mktemp -d /tmp/tandem-bench.XXXXXX)
source scripts/lib.sh  # start, port, metric, stop_all
trap 'stop_all; rm -rf "$run_dir"' EXIT
# The dummy model's directory: its config, and the tiny model's tokenizer (the services need one).
dir=$run_dir/model
mkdir -p "$dir"
cp "$model/config.json" "$dir/"
for file in tokenizer.model tokenizer_config.json generation_config.json; do
  ln -s "$PWD/models/tiny-moe/$file" "$dir/$file"
done
config=$dir/config.json
block_size=16
context_blocks=$(((context + block_size - 1) / block_size))
start_timeout_s=300
echo "| KV layout | paged layers | blocks | state slots (MiB) | KV bytes a token at $context | sequences of $context tokens |"
echo "|---|---|---|---|---|---|"
for rings in $modes; do
  model=$dir start tandem-serve --load_format=dummy --routing=zipf:1 --seed=7 --kv_dtype=bf16 \
    --kv_block_size="$block_size" --memory_bytes=$((memory_gib << 30)) \
    --max_running="$max_running" --kv_window_rings="$rings" $snapshots_flag
  blocks=$(curl -sf "http://127.0.0.1:$(port tandem-serve http_port)/metrics" |
    awk '/^tandem_kv_blocks\{/ && /state="free"/ { print $2; exit }')
  pool_bytes=$(metric tandem-serve tandem_kv_cache_bytes)
  stop_all
  log=$run_dir/tandem-serve.log
  state_bytes=$(sed -nE 's/.*state slots and [0-9]+ prefix-cache state snapshots of ([0-9]+) bytes.*/\1/p' "$log" | head -1)
  state_bytes=${state_bytes:-0}
  slots=$(sed -nE 's/.*KV pool: ([0-9]+) state slots.*/\1/p' "$log" | head -1)
  slots=${slots:-0}
  snapshots=$(sed -nE 's/.*state slots and ([0-9]+) prefix-cache.*/\1/p' "$log" | head -1)
  snapshots=${snapshots:-0}
  blocks=${blocks%.*}
  held=$((blocks / context_blocks))
  if ((state_bytes > 0 && slots < held)); then held=$slots; fi
  text='(.text_config // .)'  # a multimodal checkpoint's language model
  layers=$(jq -r "[$text.layer_types[] | select(. == \"full_attention\")] | length" "$config")
  [[ $rings == false ]] && layers=$(jq -r "$text.num_hidden_layers" "$config")
  # The paged layers' bytes a token (the pool less its state slots), and a sequence's rings
  # spread over its context.
  per_token=$(awk -v p="$pool_bytes" -v s="$state_bytes" -v k="$((slots + snapshots))" \
    -v n="$blocks" -v bs="$block_size" -v c="$context" \
    'BEGIN { printf "%.0f", (p - s * k) / n / bs + s / c }')
  echo "| $([[ $rings == true ]] && echo "window rings" || echo "all paged") | $layers | $blocks |" \
    "$(awk -v b="$state_bytes" -v n="$((slots + snapshots))" 'BEGIN { printf "%.1f", b * n / 1048576 }') |" \
    "$per_token | $held |"
done
echo
echo "$(basename "$model"): $(jq -r .model_type "$config"), --memory_gib $memory_gib (weights and KV)," \
  "--max_running $max_running; state slots: the sequences running and the prefix cache's snapshots"
