#!/usr/bin/env bash
# Fails when a C++ or proto source under version control differs from clang-format's output
# (config: .clang-format). Fix with: scripts/check_format.sh --fix
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files -co --exclude-standard -- '*.h' '*.cc' '*.cu' '*.proto' | sort -u)
existing=()
for f in "${files[@]}"; do [[ -f "$f" ]] && existing+=("$f"); done
if [[ "${1:-}" == "--fix" ]]; then
  clang-format -i "${existing[@]}"
  exit 0
fi
clang-format --dry-run --Werror "${existing[@]}"
echo "clang-format: ${#existing[@]} files clean"
