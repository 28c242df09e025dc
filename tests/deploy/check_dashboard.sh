#!/usr/bin/env bash
# Checks the Grafana dashboard's structure where no Grafana runs: valid JSON, unique panel ids,
# every panel inside the 24-column grid, every non-row panel with at least one query and a
# title, every query on the dashboard's data source variable, and the provisioning files
# pointing where the compose file and docs say. Whether the queries return data is checked
# against a live cluster in tests/integration/cluster_metrics_test.cc.
#   tests/deploy/check_dashboard.sh [DASHBOARD.json]
set -euo pipefail
cd "$(dirname "$0")/../.."
dashboard=${1:-deploy/grafana/dashboards/tandem.json}
command -v jq >/dev/null || { echo "jq missing: scripts/setup.sh installs it"; exit 1; }
fail() { echo "$dashboard: $*"; exit 1; }
jq -e . "$dashboard" >/dev/null || fail "not valid JSON"
[[ $(jq -r .uid "$dashboard") == tandem-overview ]] || fail "uid is not tandem-overview"
dupes=$(jq -r '[.panels[].id] | group_by(.) | map(select(length > 1) | .[0]) | join(",")' "$dashboard")
[[ -z $dupes ]] || fail "duplicate panel ids: $dupes"
bad=$(jq -r '.panels[] | select(.gridPos.x < 0 or .gridPos.w < 1 or .gridPos.x + .gridPos.w > 24)
             | .title' "$dashboard")
[[ -z $bad ]] || fail "panels outside the grid: $bad"
bad=$(jq -r '.panels[] | select(.type != "row")
             | select((.title // "") == "" or ((.targets // []) | length) == 0
                      or any(.targets[]; (.expr // "") == "")) | .id' "$dashboard")
[[ -z $bad ]] || fail "panels without a title or a query: $bad"
bad=$(jq -r '.panels[] | select(.type != "row") | select(.datasource.uid != "${datasource}") | .id' \
  "$dashboard")
[[ -z $bad ]] || fail "panels not on the \${datasource} variable: $bad"
[[ $(jq '[.panels[] | select(.type != "row")] | length' "$dashboard") -ge 20 ]] ||
  fail "fewer than 20 panels"
# Decode throughput front and centre: the first panel after the first row.
[[ $(jq -r '.panels[1].title' "$dashboard") == *"Decode tokens/s"* ]] ||
  fail "the first panel is not decode throughput"
grep -q "path: /var/lib/grafana/dashboards/tandem" deploy/grafana/provisioning/dashboards/tandem.yml ||
  fail "dashboard provisioning does not load /var/lib/grafana/dashboards/tandem"
echo "$dashboard: $(jq '[.panels[] | select(.type != "row")] | length' "$dashboard") panels, $(jq '[.panels[].targets[]?] | length' "$dashboard") queries: ok"
