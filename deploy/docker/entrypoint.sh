#!/bin/sh
# The entry point of Tandem's images (installed as tandem-entrypoint): runs the command it is
# given, a Tandem binary and its flags, in its own place (exec), so that the binary is the
# container's process 1 and gets SIGTERM itself (graceful drain).
#
# The KV transport advertises --kv_listen_host to its peers, so it must be an address other
# containers reach. TANDEM_PREFILL_KV_LISTEN_HOST=auto or TANDEM_DECODE_KV_LISTEN_HOST=auto is
# replaced by this container's first IPv4 address (what `hostname -I` lists first), which
# lets a replicated compose service advertise each replica's own address. On Kubernetes the
# manifests set the pod IP from the downward API instead.
set -eu

for var in TANDEM_PREFILL_KV_LISTEN_HOST TANDEM_DECODE_KV_LISTEN_HOST; do
  eval "value=\${$var:-}"
  if [ "$value" = auto ]; then
    address=$(hostname -I 2>/dev/null | tr ' ' '\n' | grep -m1 -E '^[0-9]+(\.[0-9]+){3}$' || true)
    if [ -z "$address" ]; then
      echo "tandem-entrypoint: $var=auto, but this container has no IPv4 address" >&2
      exit 2
    fi
    export "$var=$address"
  fi
done

if [ "$#" -eq 0 ]; then
  echo "tandem-entrypoint: no command (e.g. tandem-gateway --config=FILE)" >&2
  exit 2
fi
exec "$@"
