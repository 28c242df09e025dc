#!/bin/bash
# runtime-packages.sh FILE...: prints the Debian packages that hold the shared libraries the
# files (binaries, and libraries loaded with dlopen such as libtandem_spm.so) need, one per
# line, sorted. The Dockerfiles' build stage runs it so that the slim
# runtime stage installs exactly those packages (and no compilers or -dev packages). Fails if
# a library is missing or belongs to no package.
set -euo pipefail
(($# > 0)) || { echo "usage: $0 FILE..." >&2; exit 2; }
declare -A packages=()
for binary in "$@"; do
  while read -r line; do
    if [[ "$line" == *"not found"* ]]; then
      echo "runtime-packages: $binary: $line" >&2
      exit 1
    fi
    [[ "$line" =~ =\>\ (/[^ ]+) ]] || continue
    library=$(readlink -f "${BASH_REMATCH[1]}")
    # Debian 12 merges /lib into /usr/lib: dpkg may know the file under either name.
    owner=$(dpkg-query -S "$library" 2>/dev/null || dpkg-query -S "${library#/usr}" 2>/dev/null) || {
      echo "runtime-packages: $binary: $library belongs to no Debian package" >&2
      exit 1
    }
    package=${owner%%:*}
    package=${package%%,*}  # "a, b: path" when two packages share it
    packages["$package"]=1
  done < <(ldd "$binary")
done
printf '%s\n' "${!packages[@]}" | sort
