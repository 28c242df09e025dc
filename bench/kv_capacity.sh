#!/usr/bin/env bash
# What a smaller KV dtype buys in serving (docs/kv-cache.md): colocated tandem-serve with the KV
# pool held to the same bytes for every dtype (--kv_blocks = budget / the dtype's block bytes),
# then `tandem bench serve` with more concurrent requests than a float32 pool holds, the same
# seeded prompts for each dtype. Prints one row per dtype: the pool's bytes as the service
# reports them (tandem_kv_cache_bytes), the sequences of prompt + output tokens it holds, and
# throughput, TTFT and end-to-end latency; then the per-dtype JSON results' directory. Needs a
# build (scripts/build.sh) and jq.
#   bench/kv_capacity.sh [--model DIR] [--budget_mib 24] [--dtypes f32,bf16,int8]
#                        [--num_prompts 128] [--input_len 448] [--output_len 64]
#                        [--max_concurrency 64] [--out_dir DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
model=models/tiny-moe
budget_mib=24
dtypes=f32,bf16,int8
num_prompts=128
input_len=448
output_len=64
max_concurrency=64
out_dir=
while (($#)); do
  case $1 in
    --model=* | --budget_mib=* | --dtypes=* | --num_prompts=* | --input_len=* | --output_len=* | \
      --max_concurrency=* | --out_dir=*)
      name=${1%%=*}
      printf -v "${name#--}" '%s' "${1#*=}"
      shift ;;
    --model | --budget_mib | --dtypes | --num_prompts | --input_len | --output_len | \
      --max_concurrency | --out_dir)
      (($# >= 2)) || { echo "$1 needs a value" >&2; exit 2; }
      printf -v "${1#--}" '%s' "$2"
      shift 2 ;;
    *) echo "unknown argument $1 (see the head of $0)" >&2; exit 2 ;;
  esac
done
command -v jq >/dev/null || { echo "$0 needs jq (scripts/setup.sh)" >&2; exit 1; }
bin=build/bin
out_dir=${out_dir:-$(mktemp -d /tmp/tandem-kv-capacity.XXXXXX)}
mkdir -p "$out_dir"
run_dir=$(mktemp -d /tmp/tandem-bench.XXXXXX)
source scripts/lib.sh  # start, port, metric, stop_all
trap 'stop_all; rm -rf "$run_dir"' EXIT

config=$model/config.json
# Block bytes are counted here from the top-level keys, every layer paged alike: a model whose
# layer_types mix kinds (window rings, recurrent state slots) or whose keys are in text_config
# does not fit that count.
if [[ $(jq -r '.text_config // .layer_types // empty' "$config") ]]; then
  echo "$0: $config has windowed or hybrid layers (or text_config), whose KV is not one paged" \
    "pool of every layer; bench/window_capacity.sh measures those" >&2
  exit 2
fi
layers=$(jq -r .num_hidden_layers "$config")
kv_heads=$(jq -r '.num_key_value_heads // .num_attention_heads' "$config")
head_dim=$(jq -r '.head_dim // (.hidden_size / .num_attention_heads | floor)' "$config")
pools=2  # K and V a layer
if [[ $(jq -r '.kv_lora_rank // empty' "$config") ]]; then
  # Latent attention (DeepSeek-V2/V3): one keys-only row of the latent and the rotary key.
  kv_heads=1
  head_dim=$(jq -r '.kv_lora_rank + (.qk_rope_head_dim // 64)' "$config")
  pools=1
fi
block_size=16
per_sequence=$(((input_len + output_len + block_size - 1) / block_size))  # blocks a request holds
block_bytes() {  # one layer's K (or V) block in dtype $1 (common/kernels/kv_format.h)
  local values=$((block_size * kv_heads * head_dim))
  case $1 in
    f32) echo $((4 * values)) ;;
    bf16) echo $((2 * values)) ;;
    int8) echo $(((values + 3) / 4 * 4 + 4 * block_size * kv_heads)) ;;
    *) echo "unknown dtype $1" >&2; exit 2 ;;
  esac
}

rows=()
for dtype in ${dtypes//,/ }; do
  blocks=$((budget_mib * 1024 * 1024 / (pools * layers * $(block_bytes "$dtype"))))
  start tandem-serve --kv_dtype="$dtype" --kv_blocks="$blocks" --kv_block_size="$block_size" \
    --max_running="$max_concurrency"
  pool_bytes=$(metric tandem-serve tandem_kv_cache_bytes)
  echo "$dtype: $blocks blocks, $((blocks / per_sequence)) sequences of $((input_len + output_len)) tokens ..." >&2
  "$bin/tandem" bench serve --endpoint="127.0.0.1:$(port tandem-serve grpc_port)" \
    --model="$model" --dataset=random --num_prompts="$num_prompts" --input_len="$input_len" \
    --output_len="$output_len" --request_rate=inf --max_concurrency="$max_concurrency" --seed=0 \
    --label="$dtype" --out="$out_dir/$dtype.json" >"$out_dir/$dtype.txt"
  preemptions=$(metric tandem-serve tandem_preemptions_total)
  stop_all
  rows+=("$(jq -r --arg mib "$(awk -v b="$pool_bytes" 'BEGIN { printf "%.1f", b / 1048576 }')" \
    --arg seqs "$((blocks / per_sequence))" --arg pre "${preemptions:-0}" \
    '"| \(.label) | \($mib) | \($seqs) | \(.completed) | \(.failed) | \(.output_throughput * 10 | round / 10) | \(.median_ttft_ms | round) | \(.p99_ttft_ms | round) | \(.median_e2el_ms | round) | \(.p99_e2el_ms | round) | \($pre) |"' \
    "$out_dir/$dtype.json")")
done

echo "$model, KV budget $budget_mib MiB, $num_prompts requests of $input_len prompt + $output_len" \
  "output tokens at once, max concurrency $max_concurrency"
echo
echo "| KV dtype | pool (MiB) | sequences that fit | completed | failed | output tokens/s | TTFT p50 (ms) | TTFT p99 (ms) | E2EL p50 (ms) | E2EL p99 (ms) | preemptions |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
echo
echo "Results (one JSON and printed summary per dtype): $out_dir"
