#!/usr/bin/env bash
# GPU check of moerl's MoE kernels and operators on a lent GPU machine: pip
# torch 2.x with CUDA, nvcc, CMake, ninja and g++, but none of MPI, HDF5,
# spdlog, CLI11, toml++, PCRE2, ICU, BLAS or Catch2, and no network. It
# configures only what the check needs (-DMOERL_GPU_CHECK_ONLY=ON) against the
# pip LibTorch, then:
#   1. builds and runs `moerl_gpu_tests --bench`: every CUDA kernel against its
#      CPU twin at odd sizes, then dispatch+combine GB/s against a device-to-
#      device cudaMemcpy and grouped GEMM GFLOP/s. It needs only CUDA and C++
#      and is built first, so that a LibTorch problem cannot hide its results
#      (if LibTorch cannot even be configured, it is built without LibTorch);
#   2. builds and runs moerl_moe_tests (tests/torch/test_moe_ops.cpp): the
#      LibTorch MoE operators and layer, including the layer on CUDA against the
#      reference and the CPU (that case runs only where torch sees a GPU);
#   3. builds and runs moerl_moe_gpu_bench: the MoE layer's forward+backward
#      on CUDA, our operators against the per-expert-loop reference, at the
#      shapes of `moerl bench moe` (issue #3's goal: at least 3x at E=64);
#   4. scripts/gpu_job_check.sh: the whole moerl against the same LibTorch,
#      the NCCL communicator on 2 ranks, and `moerl train` with
#      run.device = "cuda" (4 ranks sharing the GPU, with MPI groups and with
#      NCCL groups);
# and prints a short summary table. Exit status 0 only when everything passed.
#
# Device invocation, from the repository root:
#   here, once (needs apt and network):  scripts/gpu_deps.sh
#       unpacks Catch2 v2 into .gpu-deps/ and keeps the Debian packages the
#       whole build needs in .gpu-deps/debs (ignored by git, about 26 MB)
#   device run:  command "scripts/gpu_check.sh", carry [".gpu-deps"], timeout_s 560
# The script keeps itself within GPU_CHECK_BUDGET_S (default 520 s) and then
# prints the summary. Logs go to $OUT/gpu_check/ when $OUT is set (they come
# back from the device), else to BUILD_DIR/gpu_check_logs.
#
# Usage: scripts/gpu_check.sh [BUILD_DIR]     (default: build-gpu)
# Environment: JOBS (default: nproc); TORCH_PREFIX, a CMake prefix that holds
# Torch/TorchConfig.cmake (default: python3's torch.utils.cmake_prefix_path);
# MOERL_CMAKE_ARGS, extra configure arguments (e.g. to simulate a bare machine).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-$ROOT/build-gpu}"
JOBS="${JOBS:-$(nproc)}"
BUDGET="${GPU_CHECK_BUDGET_S:-520}"
DEPS="$ROOT/.gpu-deps/usr"
if [[ -n "${OUT:-}" ]]; then LOG="$OUT/gpu_check"; else LOG="$BUILD/gpu_check_logs"; fi
mkdir -p "$BUILD" "$LOG"
SUMMARY="$LOG/summary.txt"
: >"$SUMMARY"

# Seconds a step may take: what is left of the budget, at most $1 when given,
# and at least 5 so that `timeout` always gets a limit.
left() {
  local s=$((BUDGET - SECONDS))
  [[ -n "${1:-}" && $1 -lt $s ]] && s=$1
  echo $((s > 5 ? s : 5))
}
status() {
  case "$1" in
    0) echo pass ;;
    77) echo "skipped (no CUDA device)" ;;
    124) echo "TIMEOUT" ;;
    *) echo "FAIL($1)" ;;
  esac
}
row() { printf '%-38s %s\n' "$1" "$2" | tee -a "$SUMMARY"; }
# step LOGFILE CMD...: runs CMD within the budget (and within STEP_CAP seconds
# when set), output to LOGFILE; sets rc and secs.
step() {
  local logfile="$1" t0=$SECONDS
  shift
  timeout "$(left "${STEP_CAP:-}")" "$@" >"$logfile" 2>&1
  rc=$?
  secs=$((SECONDS - t0))
}

echo "moerl GPU check: $(date -u '+%F %T UTC'), commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown), build dir $BUILD, logs $LOG"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
else
  echo "warning: nvidia-smi not found"
fi
# nvcc is often not on PATH on these machines; torch's CMake files look for it too.
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
command -v nvcc >/dev/null && nvcc --version | tail -n 2 | head -n 1

if [[ -z "${TORCH_PREFIX:-}" ]]; then
  TORCH_PREFIX="$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)" ||
    TORCH_PREFIX=""
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
    "available", torch.cuda.is_available())' 2>/dev/null || echo "warning: python3 has no torch"
fi
echo "LibTorch CMake prefix: ${TORCH_PREFIX:-none}"
# Torch's CMake files add -gencode flags for TORCH_CUDA_ARCH_LIST or, unset,
# for a detected GPU; name the H200's architecture so both agree with ours.
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"

# pip torch's libraries need the CUDA libraries of the nvidia-* wheels. The
# linker must find those before any other copy on an rpath: linking against
# pip torch 2.15 here picked /usr/local/cuda/lib's NCCL 2.28.9 over the wheel's
# 2.30 and failed on undefined nccl* symbols in libtorch_cuda.so.
LINK_ARGS=()
NVIDIA_LIBS="$(python3 -c 'import glob, os, nvidia
print(":".join(sorted(glob.glob(os.path.join(list(nvidia.__path__)[0], "*", "lib")))))' 2>/dev/null)"
if [[ -n "$NVIDIA_LIBS" ]]; then
  LINK_ARGS+=(-DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$NVIDIA_LIBS")
  echo "link: pip CUDA libraries first ($NVIDIA_LIBS)"
fi

PREFIX_PATH="$TORCH_PREFIX"
if [[ -f "$DEPS/lib/cmake/Catch2/Catch2Config.cmake" ]]; then
  PREFIX_PATH="${PREFIX_PATH:+$PREFIX_PATH;}$DEPS"
fi
# configure_args DIR: the GPU-check-only configuration of moerl into DIR, as
# the array CONF (`timeout` runs programs, not shell functions).
configure_args() {
  CONF=(cmake -S "$ROOT" -B "$1")
  if [[ ! -f "$1/CMakeCache.txt" ]] && command -v ninja >/dev/null; then CONF+=(-G Ninja); fi
  CONF+=(-DCMAKE_BUILD_TYPE=Release -DMOERL_GPU_CHECK_ONLY=ON -DMOERL_CUDA=ON
         -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_PREFIX_PATH="$PREFIX_PATH" "${LINK_ARGS[@]}")
  # shellcheck disable=SC2206  # MOERL_CMAKE_ARGS is a list of arguments
  CONF+=(${MOERL_CMAKE_ARGS:-})
}

configure_args "$BUILD"
step "$LOG/configure.txt" "${CONF[@]}"
conf_rc=$rc conf_secs=$secs
KBUILD="$BUILD"
if [[ $conf_rc -ne 0 ]]; then
  echo "FAILED: configure (log $LOG/configure.txt):"
  tail -n 25 "$LOG/configure.txt"
  echo "configuring the CUDA kernel tests alone, without LibTorch and Catch2"
  KBUILD="$BUILD-kernels"
  configure_args "$KBUILD"
  step "$LOG/configure_kernels.txt" "${CONF[@]}" -DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON \
    -DCMAKE_DISABLE_FIND_PACKAGE_Catch2=ON
  kconf_rc=$rc
  if [[ $kconf_rc -ne 0 ]]; then
    echo "FAILED: configure without LibTorch too (log $LOG/configure_kernels.txt):"
    tail -n 25 "$LOG/configure_kernels.txt"
  fi
else
  kconf_rc=0
fi
moe_configured=0
if [[ $conf_rc -eq 0 ]]; then
  # Whole output first: grep -q would close the pipe early (SIGPIPE under pipefail).
  targets="$(cmake --build "$BUILD" --target help 2>/dev/null)"
  grep -q moerl_moe_tests <<<"$targets" && moe_configured=1
fi

# build_and_run KEY DIR TARGET CAP PROGRAM [ARGS...]: builds TARGET in DIR,
# then runs PROGRAM (at most CAP seconds; empty: what is left of the budget).
# Logs: $LOG/build_KEY.txt and $LOG/KEY.txt. Sets build_rc, build_secs,
# run_rc and run_secs (99 and 0 for what did not happen).
build_and_run() {
  local key=$1 dir=$2 target=$3 cap=$4
  shift 4
  run_rc=99 run_secs=0
  echo "building $target"
  step "$LOG/build_$key.txt" cmake --build "$dir" -j "$JOBS" --target "$target"
  build_rc=$rc build_secs=$secs
  if [[ $build_rc -ne 0 ]]; then
    echo "FAILED: build of $target (log $LOG/build_$key.txt):"
    grep -m 20 -E 'error|Error' "$LOG/build_$key.txt"
    tail -n 15 "$LOG/build_$key.txt"
    return
  fi
  echo "running $target"
  STEP_CAP=$cap step "$LOG/$key.txt" "$@"
  run_rc=$rc run_secs=$secs
  tail -n 60 "$LOG/$key.txt"
  [[ $run_rc -eq 0 ]] || echo "FAILED: $target: $(status "$run_rc")"
}

# 1. CUDA kernels against their CPU twins, then the kernel benchmark; capped
# so that a hang leaves time for the rest.
kbuild_rc=99 gpu_rc=99 kbuild_secs=0 gpu_secs=0
if [[ $kconf_rc -eq 0 ]]; then
  build_and_run gpu_tests "$KBUILD" moerl_gpu_tests 240 "$KBUILD/tests/gpu/moerl_gpu_tests" --bench
  kbuild_rc=$build_rc kbuild_secs=$build_secs gpu_rc=$run_rc gpu_secs=$run_secs
fi

# 2. The LibTorch MoE operator and layer tests, CUDA cases included.
mbuild_rc=99 moe_rc=99 mbuild_secs=0 moe_secs=0
if [[ $moe_configured -eq 1 ]]; then
  build_and_run moe_tests "$BUILD" moerl_moe_tests "" \
    env OMP_NUM_THREADS=8 "$BUILD/tests/moerl_moe_tests" --durations yes
  mbuild_rc=$build_rc mbuild_secs=$build_secs moe_rc=$run_rc moe_secs=$run_secs
elif [[ $conf_rc -eq 0 ]]; then
  echo "FAILED: moerl_moe_tests not configured: it needs LibTorch and Catch2 v2 (run" \
       "scripts/gpu_deps.sh where apt works and carry .gpu-deps); see $LOG/configure.txt"
fi

# 3. The MoE layer on CUDA against the per-expert-loop reference.
bbuild_rc=99 bench_rc=99 bbuild_secs=0 bench_secs=0
if [[ $moe_configured -eq 1 && $mbuild_rc -eq 0 ]]; then
  build_and_run moe_bench "$BUILD" moerl_moe_gpu_bench 180 "$BUILD/benchmarks/moerl_moe_gpu_bench"
  bbuild_rc=$build_rc bbuild_secs=$build_secs bench_rc=$run_rc bench_secs=$run_secs
fi

# 4. The job on the GPU (scripts/gpu_job_check.sh): the whole moerl, NCCL,
# and `moerl train` with run.device = "cuda".
job_rc=99
if ! nvidia-smi -L >/dev/null 2>&1; then
  job_rc=77
elif [[ $conf_rc -eq 0 ]]; then
  echo "running the job check (scripts/gpu_job_check.sh)"
  "$ROOT/scripts/gpu_job_check.sh" "$BUILD-job" "$LOG" "$(left)"
  job_rc=$?
fi

echo
echo "==================== moerl GPU check ====================" | tee -a "$SUMMARY"
row "configure (GPU-check-only)" "$(status "$conf_rc") (${conf_secs} s)"
row "build CUDA kernel tests" "$([[ $kconf_rc -eq 0 ]] && echo "$(status "$kbuild_rc") (${kbuild_secs} s)" || echo "not configured")"
row "CUDA kernels vs CPU twins (+bench)" "$([[ $kbuild_rc -eq 0 ]] && echo "$(status "$gpu_rc") (${gpu_secs} s)" || echo "not built")"
row "build MoE LibTorch tests" "$([[ $moe_configured -eq 1 ]] && echo "$(status "$mbuild_rc") (${mbuild_secs} s)" || echo "not configured")"
row "LibTorch MoE tests (moerl_moe_tests)" "$([[ $mbuild_rc -eq 0 ]] && echo "$(status "$moe_rc") (${moe_secs} s)" || echo "not built")"
row "build MoE layer GPU benchmark" "$([[ $mbuild_rc -eq 0 ]] && echo "$(status "$bbuild_rc") (${bbuild_secs} s)" || echo "not built")"
row "MoE layer on CUDA vs reference (bench)" "$([[ $bbuild_rc -eq 0 ]] && echo "$(status "$bench_rc") (${bench_secs} s)" || echo "not built")"
if grep -q "cuda layer checked" "$LOG/moe_tests.txt" 2>/dev/null; then
  row "layer on CUDA vs reference" "ran"
else
  row "layer on CUDA vs reference" "not run (torch sees no GPU, or a check before it failed)"
fi
if grep -q "cuda bf16 layer checked" "$LOG/moe_tests.txt" 2>/dev/null; then
  row "bf16 layer on CUDA vs float32 on CPU" "ran"
else
  row "bf16 layer on CUDA vs float32 on CPU" "not run (torch sees no GPU, or a check before it failed)"
fi
if [[ -s "$LOG/job_rows.txt" ]]; then
  tee -a "$SUMMARY" <"$LOG/job_rows.txt"
else
  row "job on the GPU (gpu_job_check.sh)" "$(status "$job_rc")"
fi
if [[ -f "$LOG/gpu_tests.txt" ]] && grep -q '^tokens ' "$LOG/gpu_tests.txt"; then
  echo "--- kernel benchmark (dispatch+combine vs cudaMemcpy D2D) ---" | tee -a "$SUMMARY"
  sed -n '/^tokens /,$p' "$LOG/gpu_tests.txt" | tee -a "$SUMMARY"
fi
if [[ -f "$LOG/moe_bench.txt" ]] && grep -q '^layer ' "$LOG/moe_bench.txt"; then
  echo "--- MoE layer fwd+bwd on CUDA (ratio = reference ms / ours ms) ---" | tee -a "$SUMMARY"
  sed -n '/^layer /,$p' "$LOG/moe_bench.txt" | tee -a "$SUMMARY"
fi
echo "total ${SECONDS} s; logs: $LOG" | tee -a "$SUMMARY"

problems=()
[[ $conf_rc -eq 0 ]] || problems+=("configure")
[[ $gpu_rc -eq 0 ]] || problems+=("CUDA kernel tests: $(
  [[ $kbuild_rc -eq 0 ]] && status "$gpu_rc" || echo "not built")")
[[ $moe_rc -eq 0 ]] || problems+=("MoE LibTorch tests: $(
  [[ $mbuild_rc -eq 0 ]] && status "$moe_rc" || echo "not built")")
[[ $bench_rc -eq 0 ]] || problems+=("MoE layer GPU benchmark: $(
  [[ $bbuild_rc -eq 0 ]] && status "$bench_rc" || echo "not built")")
[[ $job_rc -eq 0 ]] || problems+=("job on the GPU: $(status "$job_rc")")
if [[ ${#problems[@]} -eq 0 ]]; then
  echo "GPU CHECK PASSED" | tee -a "$SUMMARY"
else
  joined="${problems[0]}"
  for p in "${problems[@]:1}"; do joined+="; $p"; done
  echo "GPU CHECK FAILED: $joined" | tee -a "$SUMMARY"
  exit 1
fi
