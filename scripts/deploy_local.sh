#!/usr/bin/env bash
# Builds Tandem's container images from Debian's archive alone, with no container registry, runs
# the compose stack and checks it end to end:
#   1. debian:bookworm (and -slim) from a debootstrap root file system with this machine's apt
#      sources, imported into podman; deploy/docker/Dockerfile built on it (tandem:dev) and
#      deploy/prometheus/Dockerfile (Debian's prometheus package, tandem-prometheus:dev);
#   2. deploy/docker/compose.yaml's gateway, prefill, decode and Prometheus started with
#      podman-compose (Grafana is not packaged in Debian and is left out);
#   3. a chat completion through the gateway, printed; a minute of load; every service scraped;
#      every query of the Grafana dashboard (deploy/grafana/dashboards/tandem.json) answered by
#      the stack's Prometheus, its model variable included, the decode-throughput panels with
#      data, and those panels drawn from Prometheus's answers into a picture;
#   4. the stack stopped and removed (--keep leaves it running).
#   scripts/deploy_local.sh [--keep] [--picture FILE.png]
# Needs root (podman without a user namespace); exits 77, CTest's skip, saying why where no
# container can run. Work files in build-deploy/ ($TANDEM_DEPLOY_DIR). Images are built in the
# docker format (podman's OCI format drops HEALTHCHECK).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
keep=0
work=${TANDEM_DEPLOY_DIR:-$root/build-deploy}
picture=$work/dashboard-decode-throughput.png
while (($#)); do
  case "$1" in
    --keep) keep=1 ;;
    --picture) picture=$(realpath -m "$2"); shift ;;
    *) echo "usage: scripts/deploy_local.sh [--keep] [--picture FILE.png]" >&2; exit 2 ;;
  esac
  shift
done
skip() { echo "deploy: SKIPPED: $*"; exit 77; }
fail() { echo "deploy: FAILED: $*" >&2; exit 1; }
[[ $(id -u) == 0 ]] || skip "podman here runs as root (no subordinate user ids for rootless)"

scripts/setup.sh --deploy
mkdir -p "$work"
# No systemd in these machines' containers: runc instead of crun (which refuses cgroups in
# hybrid mode), cgroupfs, events to a file, no default ulimits (setting them is refused).
cat >"$work/containers.conf" <<'EOF'
[containers]
default_ulimits = []
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
[network]
network_backend = "netavark"
EOF
export CONTAINERS_CONF=$work/containers.conf
podman info >/dev/null 2>&1 || skip "podman cannot run here: $(podman info 2>&1 | tail -1)"

# 1. Images.
base=docker.io/library/debian
if ! podman image exists "$base:bookworm"; then
  mirror=$(sed -n 's/^URIs: *\(\S*\/debian\)\/\?$/\1/p' /etc/apt/sources.list.d/debian.sources \
    2>/dev/null | head -1)
  [[ -n $mirror ]] || mirror=$(awk '$1 == "deb" && $3 == "bookworm" {print $2; exit}' \
    /etc/apt/sources.list 2>/dev/null)
  [[ -n $mirror ]] || fail "no Debian bookworm apt source on this machine to build the base from"
  echo "deploy: debootstrap bookworm from $mirror"
  rm -rf "$work/rootfs"
  debootstrap --variant=minbase bookworm "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 ||
    fail "debootstrap failed; see $work/debootstrap.log"
  # The machine's Debian sources (updates and security included), as the published image has.
  rm -f "$work/rootfs/etc/apt/sources.list"
  [[ -s /etc/apt/sources.list ]] && grep -E '^deb .*debian' /etc/apt/sources.list \
    >"$work/rootfs/etc/apt/sources.list" || true
  [[ -f /etc/apt/sources.list.d/debian.sources ]] &&
    cp /etc/apt/sources.list.d/debian.sources "$work/rootfs/etc/apt/sources.list.d/"
  rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/lib/apt/lists/"*
  tar -C "$work/rootfs" -c . | podman import --change 'CMD ["bash"]' - "$base:bookworm" >/dev/null
  podman tag "$base:bookworm" "$base:bookworm-slim"
  rm -rf "$work/rootfs"
fi
echo "deploy: building tandem:dev (deploy/docker/Dockerfile)"
podman build --format docker --pull=never --network=host -f deploy/docker/Dockerfile -t localhost/tandem:dev . \
  >"$work/build-tandem.log" 2>&1 || fail "image build failed; see $work/build-tandem.log"
echo "deploy: building tandem-prometheus:dev (deploy/prometheus/Dockerfile)"
podman build --format docker --pull=never --network=host -t localhost/tandem-prometheus:dev deploy/prometheus \
  >"$work/build-prometheus.log" 2>&1 || fail "image build failed; see $work/build-prometheus.log"
podman images --filter reference=localhost/tandem* --format '  {{.Repository}}:{{.Tag}} {{.Size}}'

# 2. The stack.
export TANDEM_IMAGE=localhost/tandem:dev PROMETHEUS_IMAGE=localhost/tandem-prometheus:dev
compose=(podman-compose -f deploy/docker/compose.yaml)
for port in 8080 9090 50051; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    fail "127.0.0.1:$port is taken: the compose file publishes the gateway and Prometheus there"
  fi
done
stop() {
  if ((keep)); then
    echo "deploy: left running; stop with: CONTAINERS_CONF=$CONTAINERS_CONF TANDEM_IMAGE=$TANDEM_IMAGE PROMETHEUS_IMAGE=$PROMETHEUS_IMAGE ${compose[*]} down -v"
  else
    "${compose[@]}" down -v >"$work/down.log" 2>&1 || echo "deploy: compose down failed; see $work/down.log"
  fi
}
trap stop EXIT
"${compose[@]}" down -v >/dev/null 2>&1 || true
"${compose[@]}" up -d prefill decode gateway prometheus >"$work/up.log" 2>&1 ||
  fail "compose up failed; see $work/up.log"
logs() { for s in prefill decode gateway prometheus; do podman logs --tail 20 "docker_${s}_1" 2>&1 | sed "s/^/  $s: /"; done; }
gateway=http://127.0.0.1:8080
prometheus=http://127.0.0.1:9090
wait_for() {  # wait_for SECONDS WHAT COMMAND...
  local deadline=$((SECONDS + $1)) what=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || { logs; fail "$what not within the deadline"; }
    sleep 1
  done
}
wait_for 120 "the gateway ready" curl -sf "$gateway/readyz"
wait_for 60 "Prometheus ready" curl -sf "$prometheus/-/ready"

# 3. End to end.
model=$(curl -sf "$gateway/v1/models" | jq -r '.data[0].id')
echo "deploy: chat completion through the gateway (model $model):"
answer=$(curl -sf "$gateway/v1/chat/completions" -H 'Content-Type: application/json' \
  -d "{\"model\": \"$model\", \"messages\": [{\"role\": \"user\", \"content\": \"Tell me about the jury.\"}], \"max_tokens\": 24, \"temperature\": 0}") ||
  { logs; fail "the chat completion failed"; }
echo "$answer" | jq -c '{content: .choices[0].message.content, finish_reason: .choices[0].finish_reason, usage}'
[[ $(echo "$answer" | jq '.usage.completion_tokens') -gt 0 ]] || fail "no tokens came back"

# Half a minute idle (the pictures's baseline), then 90 s of load: the dashboard's rates are
# over a minute, so they climb for a minute and then hold.
sleep 30
echo "deploy: 90 s of load (4 streams of completions)"
load_start=$(date +%s)
for worker in 1 2 3 4; do
  (
    while (($(date +%s) < load_start + 90)); do
      curl -sf "$gateway/v1/completions" -H 'Content-Type: application/json' \
        -d '{"prompt": "It was a bright cold day in April, and", "max_tokens": 96, "ignore_eos": true}' \
        >/dev/null || echo "deploy: a load request failed"
    done
  ) &
done
wait
load_end=$(date +%s)
sleep 12  # two scrapes and a rule evaluation past the load

query() { curl -sf --get "$prometheus/api/v1/query" --data-urlencode "query=$1"; }
up=$(query 'sum(up{job="tandem"})' | jq -r '.data.result[0].value[1] // 0')
[[ $up == 3 ]] || fail "Prometheus scrapes $up of the 3 services (up{job=\"tandem\"})"
echo "deploy: Prometheus scrapes gateway, prefill and decode (up = 3)"

dashboard=deploy/grafana/dashboards/tandem.json
models=$(curl -sf --get "$prometheus/api/v1/label/model/values" \
  --data-urlencode 'match[]=tandem_build_info' | jq -r '.data | join("|")')
[[ -n $models ]] || fail "the dashboard's model variable (label_values(tandem_build_info, model)) is empty"
answered=0 with_data=0 total=0 empty=()
while IFS=$'\t' read -r id title expr; do
  expr=${expr//\$model/$models}
  expr=${expr//\$__rate_interval/1m}
  total=$((total + 1))
  result=$(query "$expr") || fail "panel $id ($title): Prometheus refused: $expr"
  [[ $(echo "$result" | jq -r .status) == success ]] || fail "panel $id ($title): $result"
  answered=$((answered + 1))
  n=$(echo "$result" | jq '.data.result | length')
  if ((n > 0)); then with_data=$((with_data + 1)); else empty+=("$title"); fi
  if [[ $id == 2 || $id == 3 ]] &&
    ! echo "$result" | jq -e '[.data.result[].value[1] | tonumber] | any(. > 0)' >/dev/null; then
    fail "panel $id ($title) shows no decode throughput: $expr"
  fi
done < <(jq -r '.panels[] | select(.type != "row") | .id as $id | .title as $t
                | .targets[] | [$id, $t, .expr] | @tsv' "$dashboard")
echo "deploy: the dashboard's $total queries all answered, $with_data with data"
((${#empty[@]} == 0)) ||
  echo "deploy: without data (nothing of the kind happened in this stack): $(IFS=';'; echo "${empty[*]}")"

# The decode-throughput panels (ids 2 and 3) over the load, as Grafana would draw them.
mkdir -p "$(dirname "$picture")"
plot=$work/plot
rm -rf "$plot" && mkdir -p "$plot"
series=()
while IFS=$'\t' read -r id title legend expr; do
  expr=${expr//\$model/$models}
  expr=${expr//\$__rate_interval/1m}
  curl -sf --get "$prometheus/api/v1/query_range" --data-urlencode "query=$expr" \
    --data-urlencode "start=$((load_start - 30))" --data-urlencode "end=$((load_end + 10))" \
    --data-urlencode step=5 >"$plot/$id.json" || fail "panel $id: query_range failed"
  count=$(jq '.data.result | length' "$plot/$id.json")
  for ((i = 0; i < count; i++)); do
    name=$(jq -r --arg legend "$legend" --argjson i "$i" '.data.result[$i].metric as $m
      | $legend | gsub("\\{\\{ *(?<k>[a-z_]+) *\\}\\}"; ($m[.k] // ""))' "$plot/$id.json")
    jq -r --argjson i "$i" --argjson t0 "$load_start" \
      '.data.result[$i].values[] | "\(.[0] - $t0) \(.[1])"' "$plot/$id.json" >"$plot/$id-$i.dat"
    series+=("$id-$i.dat|$title: $name")
  done
done < <(jq -r '.panels[] | select(.id == 2 or .id == 3) | .id as $id | .title as $t
                | .targets[] | [$id, $t, (.legendFormat // ""), .expr] | @tsv' "$dashboard")
plots=()
dash=1
for s in "${series[@]}"; do
  plots+=("'$plot/${s%%|*}' using 1:2 with lines linewidth 2 dashtype $dash title '${s#*|}'")
  dash=$((dash + 1))
done
gnuplot <<EOF || fail "gnuplot failed"
set terminal pngcairo size 900,450 noenhanced
set output '$picture'
set title "The dashboard's decode-throughput panels, drawn from the compose stack's Prometheus"
set xlabel 'seconds since the load started (4 streams of 96-token completions for 90 s)'
set ylabel 'tokens/s'
set key bottom right
set grid
set xrange [-30:100]
plot $(IFS=,; echo "${plots[*]}")
EOF
echo "deploy: decode-throughput panels drawn: $picture"
echo "deploy: OK"
