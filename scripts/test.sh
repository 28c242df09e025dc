#!/usr/bin/env bash
# Sets up, builds (warnings are errors) and runs every test: CTest labels unit, integration,
# e2e, fault, netns; gpu tests skip with a message when there is no GPU; the deploy test only
# with TANDEM_DEPLOY_TEST=1 (docs/testing.md). Extra arguments go to ctest
# (e.g. scripts/test.sh -L unit).
# Then the same tests built with ASan+UBSan (scripts/sanitize.sh asan: by default the unit and
# integration tests, else the ones asked for) and every fuzz harness for a bounded time
# (scripts/fuzz.sh, TANDEM_FUZZ_SECONDS each, default 15). TANDEM_SANITIZERS=0 skips both.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh -DTANDEM_WERROR=ON
# The `deploy` test (images built, the compose stack run: scripts/deploy_local.sh) takes many
# minutes and downloads Debian's packages: only with TANDEM_DEPLOY_TEST=1.
opt_out=(-LE deploy)
[[ "${TANDEM_DEPLOY_TEST:-0}" == 1 ]] && opt_out=()
(cd build && ctest --output-on-failure -j"${TANDEM_JOBS:-$(nproc)}" --timeout 600 \
  "${opt_out[@]}" "$@")

if [[ "${TANDEM_SANITIZERS:-1}" == 0 ]]; then
  echo "test: sanitizers and fuzzers skipped (TANDEM_SANITIZERS=0)"
  exit 0
fi
scripts/sanitize.sh asan "$@"
scripts/fuzz.sh "${TANDEM_FUZZ_SECONDS:-15}"
