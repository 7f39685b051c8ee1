#!/usr/bin/env bash
# GPU check of the MoE kernels on a lent GPU machine (pip torch 2.x with CUDA,
# CUDA toolkit installed). Configures a separate build directory against the
# pip LibTorch, builds the CUDA kernel tests and moerl, then runs:
#   1. moerl_gpu_tests --bench : every CUDA kernel vs its CPU twin at odd sizes,
#      then dispatch+combine GB/s vs a device-to-device cudaMemcpy and grouped
#      GEMM GFLOP/s
#   2. moerl_torch_tests "[moe]" : the LibTorch operators and layer, including
#      the CUDA-vs-reference layer test (it runs only when torch sees a GPU)
# and prints a short summary table. Usage:
#   scripts/gpu_check.sh [BUILD_DIR]     (default: build-gpu; JOBS=N to override -j)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-$ROOT/build-gpu}"
JOBS="${JOBS:-$(nproc)}"
LOG="$BUILD/gpu_check_logs"

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version \
  --format=csv,noheader || echo "warning: nvidia-smi not found"

TORCH_PREFIX="$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
  "available", torch.cuda.is_available())'

# nvcc is often not on PATH on these machines; MoerlCuda also looks in /usr/local/cuda.
CUDA_ARGS=()
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  CUDA_ARGS+=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)
fi

cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" -DMOERL_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  "${CUDA_ARGS[@]}"
mkdir -p "$LOG"
# The kernel tests need only the CUDA kernels: build them first, so that a
# problem elsewhere (the LibTorch side against torch 2.x) cannot hide them.
cmake --build "$BUILD" -j "$JOBS" --target moerl_gpu_tests

status() { if [[ $1 -eq 0 ]]; then echo pass; elif [[ $1 -eq 77 ]]; then echo skipped; else echo "FAIL($1)"; fi; }

set +e
"$BUILD/tests/gpu/moerl_gpu_tests" --bench 2>&1 | tee "$LOG/gpu_tests.txt"
gpu_rc=${PIPESTATUS[0]}
cmake --build "$BUILD" -j "$JOBS" --target moerl_torch_tests moerl 2>&1 | tee "$LOG/build_torch.txt" | tail -n 30
build_rc=${PIPESTATUS[0]}
torch_rc=99
if [[ $build_rc -eq 0 ]]; then
  OMP_NUM_THREADS=8 "$BUILD/tests/moerl_torch_tests" "[moe]" 2>&1 | tee "$LOG/torch_moe_tests.txt"
  torch_rc=${PIPESTATUS[0]}
fi
set -e

echo
echo "==================== moerl GPU check ===================="
printf '%-34s %s\n' "CUDA kernels vs CPU twins" "$(status "$gpu_rc")"
printf '%-34s %s\n' "build moerl + torch tests (torch 2.x)" "$(status "$build_rc")"
printf '%-34s %s\n' "LibTorch MoE tests ([moe])" "$([[ $build_rc -eq 0 ]] && status "$torch_rc" || echo "not built")"
grep -q "cuda layer checked" "$LOG/torch_moe_tests.txt" 2>/dev/null &&
  printf '%-34s %s\n' "layer on CUDA vs reference" "ran" ||
  printf '%-34s %s\n' "layer on CUDA vs reference" "not run (torch sees no GPU?)"
echo "--- kernel benchmark (dispatch+combine vs cudaMemcpy D2D) ---"
sed -n '/^tokens /,$p' "$LOG/gpu_tests.txt"
echo "logs: $LOG"
[[ $gpu_rc -eq 0 && $torch_rc -eq 0 ]]
