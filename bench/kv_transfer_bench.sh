#!/usr/bin/env bash
# KV transfer bandwidth through Tandem's UCX transport next to ucx_perftest's active-message bandwidth on
# the same transports, in one run. Needs a build (scripts/build.sh).
#   bench/kv_transfer_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
build/bin/tandem_kv_transfer_bench --tokens 1024,8192 --transports 'tcp;sm,tcp'
echo
echo "ucx_perftest ucp_am_bw, 256 KiB messages (MB/s in the last columns):"
port=$((20000 + RANDOM % 20000))
for tls in tcp sm,tcp; do
  UCX_TLS=$tls timeout 60 ucx_perftest -p "$port" >/dev/null 2>&1 &
  server=$!
  sleep 0.5
  printf '%s: ' "$tls"
  UCX_TLS=$tls timeout 60 ucx_perftest 127.0.0.1 -p "$port" -t ucp_am_bw -s 262144 -n 800 \
    2>&1 | grep '^Final' || echo "failed"
  wait "$server" || true
  port=$((port + 1))
done
