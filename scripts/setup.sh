#!/usr/bin/env bash
# Installs what moerl needs from Debian's packages, only what is missing.
# Idempotent: when everything is present it takes about a second.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git python3
  libtorch-dev                 # LibTorch 1.13 (CPU)
  libopenblas0-openmp          # fast BLAS for LibTorch (the reference BLAS is ~16x slower)
  libopenmpi-dev openmpi-bin   # MPI
  libhdf5-dev                  # checkpoints
  libspdlog-dev libcli11-dev catch2 libtomlplusplus-dev
  libpcre2-dev libicu-dev       # BPE tokenizer: split regexes, NFC
)

missing=()
for package in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$package" 2>/dev/null || true)
  [ "$status" = "installed" ] || missing+=("$package")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup: done"
