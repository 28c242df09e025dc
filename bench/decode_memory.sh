#!/usr/bin/env bash
# Resident memory of tandem-decode on the shipped tiny model, without a plan and with the
# shipped REAP plans keeping 12, 8 and 4 of 16 experts per layer (retained-only loading): the
# process's VmRSS once it serves, and the expert bytes it reports (tandem_expert_weight_bytes).
# A small KV pool (--kv_blocks 64, 3 MiB) keeps the cache from hiding the weights.
# Needs a build (scripts/build.sh).
#   bench/decode_memory.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/bin
model=models/tiny-moe
run_dir=$(mktemp -d /tmp/tandem-memory.XXXXXX)
source scripts/lib.sh  # start, port, metric, stop_all
trap 'stop_all; rm -rf "$run_dir"' EXIT

echo "| decode plan | experts held | expert weights (MB) | VmRSS (MB) | VmRSS vs full |"
echo "|---|---|---|---|---|"
full_rss=
for plan in "" reap-keep12 reap-keep8 reap-keep4; do
  args=(--kv_blocks=64)
  [[ -n "$plan" ]] && args+=(--plan="$model/pruning/$plan.json")
  start tandem-decode "${args[@]}"
  experts=$(metric tandem-decode tandem_experts_resident)
  bytes=$(metric tandem-decode tandem_expert_weight_bytes)
  rss_kb=$(awk '/^VmRSS/ {print $2}' "/proc/$(port tandem-decode pid)/status")
  [[ -z "$full_rss" ]] && full_rss=$rss_kb
  awk -v p="${plan:-none (full)}" -v e="$experts" -v b="$bytes" -v r="$rss_kb" -v f="$full_rss" \
    'BEGIN { printf "| %s | %d | %.1f | %.1f | %.2f |\n", p, e, b / 1e6, r / 1024, r / f }'
  stop_all
done
