#!/bin/bash
# tandem-probe [PATH]: exits 0 when this container's Tandem service answers
# GET http://127.0.0.1:$TANDEM_PROBE_PORT/PATH (default /readyz, port 8080) with 200, else 1.
# The image's HEALTHCHECK; it needs no HTTP client in the image (bash's /dev/tcp).
# /readyz is 503 until the service is ready and while it drains; /healthz is 200 while the
# process serves.
set -uo pipefail
path="${1:-/readyz}"
port="${TANDEM_PROBE_PORT:-8080}"
if ! { exec 3<>"/dev/tcp/127.0.0.1/$port"; } 2>/dev/null; then
  echo "tandem-probe: nothing listens on 127.0.0.1:$port"
  exit 1
fi
printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$path" >&3
IFS= read -r -t 5 status <&3 || { echo "tandem-probe: no answer from 127.0.0.1:$port"; exit 1; }
status="${status%$'\r'}"
[[ "$status" =~ ^HTTP/1\.[01]\ 200 ]] || { echo "tandem-probe: $path: $status"; exit 1; }
