#!/usr/bin/env bash
# Installs the Debian 12 packages vramfuzz builds with. Idempotent: installs only what is missing,
# and touches apt only then. Uses sudo when not root. The CUDA toolkit is optional and not
# installed here: when nvcc is at /usr/local/cuda/bin or on PATH the CUDA backend is built too.
set -euo pipefail

packages=(
  build-essential cmake ninja-build git pkg-config
  libspdlog-dev libfmt-dev nlohmann-json3-dev libcli11-dev
  libgtest-dev libgmock-dev librapidcheck-dev libbenchmark-dev
  clang libclang-rt-14-dev   # libFuzzer runtime and the ASan/UBSan runtimes for clang
  libxml2-utils libpng-dev   # reports tests: xmllint checks junit.xml against its XSD; libpng decodes screenshots
)
# Extra packages a caller asks for (the HTML report test installs chromium this way).
packages+=("$@")

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 3; }
  SUDO="sudo"
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
