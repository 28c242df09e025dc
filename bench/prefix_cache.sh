#!/usr/bin/env bash
# Prefix caching, KV-aware routing and batched prefill on the shipped tiny model, each case
# on freshly started services so that no run inherits another's cache:
#   1. colocated (tandem-serve) and disaggregated (one prefill instance), prefix cache off / on,
#      on two workloads with shared prefixes: a fixed system prompt of --prefix_len tokens
#      before --question_len tokens of each request's own (shared_prefix), and conversations of
#      --turns turns that resend their history (multi_turn);
#   2. two prefill instances behind the gateway, KV-aware routing vs load-only, on both;
#   3. batched prefill vs one prompt at a time (--max_running=1 on prefill), cache off, random
#      prompts of --input_len tokens at --rate and all at once;
#   4. what the cache costs where nothing is shared: random prompts all at once, cache off / on,
#      disaggregated and colocated.
# Every run sends --num_prompts requests of --output_len tokens at --rate requests/s (Poisson,
# seed 0; tandem bench serve's warm-up request goes first, uncounted). Prints one table row per
# run: TTFT p50/p99, throughput and the prefix-cache hit rate (hit / looked-up prompt tokens,
# from the instances' metrics). Needs a build (scripts/build.sh) and jq.
#   bench/prefix_cache.sh [--rate 16] [--num_prompts 100] [--prefix_len 384]
#                         [--question_len 32] [--turns 4] [--input_len 128] [--output_len 32]
#                         [--only cache|prefill] [--old_prefill PATH] [--out_dir DIR]
# --only cache runs parts 1 and 2, --only prefill parts 3 and 4. --old_prefill adds part 3's
# rows for another tandem-prefill binary (e.g. one built from a commit before issue #19, which
# ran prompts one at a time and shipped each one's KV before computing the next).
set -euo pipefail
cd "$(dirname "$0")/.."
rate=16
num_prompts=100
prefix_len=384
question_len=32
turns=4
input_len=128
output_len=32
only=
old_prefill=
out_dir=
while (($#)); do
  case $1 in
    --rate=* | --num_prompts=* | --prefix_len=* | --question_len=* | --turns=* | \
      --input_len=* | --output_len=* | --only=* | --old_prefill=* | --out_dir=*)
      name=${1%%=*}
      printf -v "${name#--}" '%s' "${1#*=}"
      shift ;;
    --rate | --num_prompts | --prefix_len | --question_len | --turns | --input_len | \
      --output_len | --only | --old_prefill | --out_dir)
      (($# >= 2)) || { echo "$1 needs a value" >&2; exit 2; }
      printf -v "${1#--}" '%s' "$2"
      shift 2 ;;
    *) echo "unknown argument $1 (see the head of $0)" >&2; exit 2 ;;
  esac
done
command -v jq >/dev/null || { echo "$0 needs jq (scripts/setup.sh)" >&2; exit 1; }
bin=build/bin
model=models/tiny-moe
out_dir=${out_dir:-$(mktemp -d /tmp/tandem-prefix.XXXXXX)}
mkdir -p "$out_dir"
run_dir=$(mktemp -d /tmp/tandem-bench.XXXXXX)
source scripts/lib.sh  # start, start_as, port, metric, stop_all
trap 'stop_all; rm -rf "$run_dir"' EXIT

workload_flags() {  # workload_flags WORKLOAD: the tandem bench serve flags of a workload
  case $1 in
    shared_prefix) echo "--dataset=shared_prefix --prefix_len=$prefix_len --input_len=$question_len" ;;
    multi_turn) echo "--dataset=multi_turn --turns=$turns --input_len=$question_len" ;;
    random) echo "--dataset=random --input_len=$input_len" ;;
  esac
}
hits() {  # hits SERVICE...: prefix-cache hit and query tokens summed over the services
  local h=0 q=0 s
  for s in "$@"; do
    h=$(awk -v a="$h" -v b="$(metric "$s" tandem_prefix_cache_hit_tokens_total)" 'BEGIN { print a + b }')
    q=$(awk -v a="$q" -v b="$(metric "$s" tandem_prefix_cache_query_tokens_total)" 'BEGIN { print a + b }')
  done
  echo "$h $q"
}
rows=()
run() {  # run LABEL WORKLOAD RATE ENDPOINT_SERVICE CACHE_SERVICES...
  local label=$1 workload=$2 r=$3 service=$4; shift 4
  local out="$out_dir/$label-$workload-rate-$r.json"
  echo "$label, $workload, $r requests/s ..." >&2
  # shellcheck disable=SC2046
  "$bin/tandem" bench serve --endpoint="127.0.0.1:$(port "$service" grpc_port)" --model="$model" \
    $(workload_flags "$workload") --num_prompts="$num_prompts" --output_len="$output_len" \
    --request_rate="$r" --seed=0 --label="$label" --out="$out" >"${out%.json}.txt" ||
    { echo "$label $workload: tandem bench serve failed" >&2; return; }
  local h q
  read -r h q < <(hits "$@")
  rows+=("$(jq -r --arg w "$workload" --arg h "$h" --arg q "$q" '"| \(.label) | \($w) | \(.request_rate) | \(.completed) | \(.median_ttft_ms * 10 | round / 10) | \(.p99_ttft_ms * 10 | round / 10) | \(.total_input_tokens / .duration | round) | \(.output_throughput * 10 | round / 10) | \(if ($q | tonumber) > 0 then (($h | tonumber) / ($q | tonumber) * 1000 | round / 10 | tostring) + "%" else "-" end) |"' "$out")")
}
cluster() {  # cluster N_PREFILL PREFILL_FLAGS GATEWAY_FLAGS [PREFILL_BINARY]: prefill instances,
  # a decode, a gateway
  local n=$1 prefill_flags=$2 gateway_flags=$3 prefill_binary=${4:-tandem-prefill} i targets=
  for ((i = 1; i <= n; i++)); do
    # shellcheck disable=SC2086
    start_as "prefill$i" "$prefill_binary" $prefill_flags
    targets+="${targets:+,}127.0.0.1:$(port "prefill$i" grpc_port)"
  done
  start tandem-decode --max_running=64
  # shellcheck disable=SC2086
  start tandem-gateway --prefill="$targets" --decode="127.0.0.1:$(port tandem-decode grpc_port)" \
    $gateway_flags
  sleep 1.5  # the gateway's first health checks (block size, pool size) are in
}

for workload in shared_prefix multi_turn; do
  [[ $only == prefill ]] && break
  for cache in false true; do
    start tandem-serve --max_running=64 --prefix_cache=$cache
    run "colocated, cache $cache" "$workload" "$rate" tandem-serve tandem-serve
    stop_all
    cluster 1 "--prefix_cache=$cache" ""
    run "disaggregated, cache $cache" "$workload" "$rate" tandem-gateway prefill1
    stop_all
  done
  for routing in load kv_aware; do
    cluster 2 "" "--prefill_routing=$routing"
    run "2 prefill, $routing routing" "$workload" "$rate" tandem-gateway prefill1 prefill2
    stop_all
  done
done
for r in "$rate" inf; do
  [[ $only == cache ]] && break
  if [[ -n $old_prefill ]]; then
    cluster 1 "" "" "$old_prefill"
    run "prefill --old_prefill" random "$r" tandem-gateway
    stop_all
  fi
  for running in 1 16; do
    cluster 1 "--prefix_cache=false --max_running=$running" ""
    run "prefill max_running $running" random "$r" tandem-gateway prefill1
    stop_all
  done
done
# What the cache costs where nothing is shared.
if [[ $only != cache ]]; then
  cluster 1 "--prefix_cache=true" ""
  run "prefill max_running 16, cache true" random inf tandem-gateway prefill1
  stop_all
  for cache in false true; do
    start tandem-serve --max_running=64 --prefix_cache=$cache
    run "colocated, cache $cache" random inf tandem-serve tandem-serve
    stop_all
  done
fi

echo "$num_prompts requests per run, $output_len output tokens each; shared_prefix: $prefix_len" \
  "+ $question_len prompt tokens; multi_turn: $turns turns of $question_len new tokens each;" \
  "random: $input_len prompt tokens"
echo
echo "| setup | workload | rate (req/s) | completed | TTFT p50 (ms) | TTFT p99 (ms) | prompt tokens/s | output tokens/s | prefix-cache hits |"
echo "|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
echo
echo "Results (one JSON and summary per run): $out_dir"
