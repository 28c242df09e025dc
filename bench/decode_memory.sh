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
pid=
trap '[[ -n "$pid" ]] && kill -TERM "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$run_dir"' EXIT

echo "| decode plan | experts held | expert weights (MB) | VmRSS (MB) | VmRSS vs full |"
echo "|---|---|---|---|---|"
full_rss=
for plan in "" reap-keep12 reap-keep8 reap-keep4; do
  rm -f "$run_dir/ports"
  args=(--model="$model" --port_file="$run_dir/ports" --kv_blocks=64)
  [[ -n "$plan" ]] && args+=(--plan="$model/pruning/$plan.json")
  "$bin/tandem-decode" "${args[@]}" >"$run_dir/decode.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 300); do [[ -s "$run_dir/ports" ]] && break; sleep 0.05; done
  [[ -s "$run_dir/ports" ]] || { echo "tandem-decode did not start"; cat "$run_dir/decode.log"; exit 1; }
  http=$(sed -E 's/.*"http_port": ([0-9]+).*/\1/' "$run_dir/ports")
  metrics=$(curl -sf "http://127.0.0.1:$http/metrics")
  experts=$(awk '$1 ~ /^tandem_experts_resident/ {print $2}' <<<"$metrics")
  bytes=$(awk '$1 ~ /^tandem_expert_weight_bytes/ {print $2}' <<<"$metrics")
  rss_kb=$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status")
  [[ -z "$full_rss" ]] && full_rss=$rss_kb
  awk -v p="${plan:-none (full)}" -v e="$experts" -v b="$bytes" -v r="$rss_kb" -v f="$full_rss" \
    'BEGIN { printf "| %s | %d | %.1f | %.1f | %.2f |\n", p, e, b / 1e6, r / 1024, r / f }'
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true; pid=
done
