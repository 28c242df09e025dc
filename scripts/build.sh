#!/usr/bin/env bash
# Configures and builds Tandem (Release) into build/; binaries land in build/bin/.
# Extra arguments go to CMake's configure step (e.g. -DTANDEM_WERROR=ON).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="${TANDEM_JOBS:-$(nproc)}"
export CCACHE_DIR="${CCACHE_DIR:-$PWD/.cache/ccache}"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >build.configure.log 2>&1 ||
  { cat build.configure.log; exit 1; }
rm -f build.configure.log
cmake --build build -j"$jobs"
