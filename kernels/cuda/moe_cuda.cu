// CUDA MoE kernels (see moerl_kernels/moe.h for the semantics, which the CPU
// twins in kernels/cpu/moe_cpu.cpp define). Nothing here copies to the host:
// segment bounds are produced and consumed on the device, and the permuted
// buffers are sized by a bound known from T, k, E and the block size.

#include <cuda_runtime.h>

#include <cstdint>

#include "moerl_kernels/moe.h"

namespace moerl::kernels {
namespace {

constexpr int kPlanTile = 256;  // assignments per block in the plan kernels

// Per tile: how many of its assignments go to each expert.
__global__ void plan_tile_counts(const std::int64_t* __restrict__ expert_idx, std::int64_t assignments, int experts,
                                 std::int64_t* __restrict__ tile_counts) {
  extern __shared__ int counts_s[];
  for (int e = threadIdx.x; e < experts; e += blockDim.x) counts_s[e] = 0;
  __syncthreads();
  const std::int64_t a = static_cast<std::int64_t>(blockIdx.x) * kPlanTile + threadIdx.x;
  if (a < assignments) {
    const std::int64_t e = expert_idx[a];
    if (e >= 0 && e < experts) atomicAdd(&counts_s[e], 1);  // out-of-range: never placed
  }
  __syncthreads();
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    tile_counts[static_cast<std::int64_t>(blockIdx.x) * experts + e] = counts_s[e];
  }
}

// One block per expert: turns that expert's column of tile counts into each
// tile's exclusive start (in place, a block-wide scan over 256 tiles at a
// time), and writes routed[e] and counts[e] (after capacity).
__global__ void plan_scan_expert(std::int64_t* __restrict__ tile_counts, std::int64_t tiles, int experts,
                                 std::int64_t capacity, std::int64_t* __restrict__ routed,
                                 std::int64_t* __restrict__ counts) {
  __shared__ std::int64_t buf[kPlanTile];
  const int e = blockIdx.x;
  const int i = threadIdx.x;
  std::int64_t carry = 0;  // the same in every thread
  for (std::int64_t base = 0; base < tiles; base += kPlanTile) {
    const std::int64_t t = base + i;
    const std::int64_t v = t < tiles ? tile_counts[t * experts + e] : 0;
    buf[i] = v;
    __syncthreads();
    for (int off = 1; off < kPlanTile; off <<= 1) {  // inclusive Hillis-Steele scan
      const std::int64_t add = i >= off ? buf[i - off] : 0;
      __syncthreads();
      buf[i] += add;
      __syncthreads();
    }
    if (t < tiles) tile_counts[t * experts + e] = carry + buf[i] - v;
    const std::int64_t chunk_total = buf[kPlanTile - 1];
    __syncthreads();  // all reads of buf done before the next chunk overwrites it
    carry += chunk_total;
  }
  if (i == 0) {
    routed[e] = carry;
    counts[e] = capacity < 0 ? carry : (carry < capacity ? carry : capacity);
  }
}

// One thread: padded segment starts and the dropped total. E is tens to
// hundreds, so a serial pass is cheaper than another scan launch.
__global__ void plan_offsets(int experts, std::int64_t block, const std::int64_t* __restrict__ routed,
                             const std::int64_t* __restrict__ counts, std::int64_t* __restrict__ offsets,
                             std::int64_t* __restrict__ dropped) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  std::int64_t start = 0, lost = 0;
  for (int e = 0; e < experts; ++e) {
    offsets[e] = start;
    start += (counts[e] + block - 1) / block * block;
    lost += routed[e] - counts[e];
  }
  offsets[experts] = start;
  dropped[0] = lost;
}

// Each assignment's rank among same-expert assignments before it (stable).
__global__ void plan_assign(const std::int64_t* __restrict__ expert_idx, std::int64_t assignments, int experts,
                            std::int64_t capacity, const std::int64_t* __restrict__ tile_starts,
                            const std::int64_t* __restrict__ offsets, std::int64_t* __restrict__ dest_row,
                            std::int64_t* __restrict__ row_source) {
  __shared__ int tile_e[kPlanTile];
  const std::int64_t a = static_cast<std::int64_t>(blockIdx.x) * kPlanTile + threadIdx.x;
  const int e = a < assignments ? static_cast<int>(expert_idx[a]) : -1;
  tile_e[threadIdx.x] = e;
  __syncthreads();
  if (a >= assignments) return;
  if (e < 0 || e >= experts) {
    dest_row[a] = -1;
    return;
  }
  int local = 0;
  for (int j = 0; j < static_cast<int>(threadIdx.x); ++j) local += (tile_e[j] == e);
  const std::int64_t rank = tile_starts[static_cast<std::int64_t>(blockIdx.x) * experts + e] + local;
  if (capacity >= 0 && rank >= capacity) {
    dest_row[a] = -1;
    return;
  }
  const std::int64_t row = offsets[e] + rank;
  dest_row[a] = row;
  row_source[row] = a;
}

// T is the storage type (float or bfloat16); sums and products run in float.
template <typename T>
__global__ void dispatch_kernel(const T* __restrict__ x, const std::int64_t* __restrict__ row_source,
                                const float* __restrict__ weights, std::int64_t top_k, std::int64_t hidden,
                                std::int64_t rows, bool vec4, T* __restrict__ out) {
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const std::int64_t a = row_source[r];
    T* dst = out + r * hidden;
    if (a < 0) {
      for (std::int64_t h = threadIdx.x; h < hidden; h += blockDim.x) dst[h] = narrow<T>(0.f);
      continue;
    }
    const T* src = x + (a / top_k) * hidden;
    if (weights == nullptr) {  // a plain copy: bits unchanged
      for (std::int64_t h = threadIdx.x; h < hidden; h += blockDim.x) dst[h] = src[h];
      continue;
    }
    const float w = weights[a];
    for (std::int64_t h = threadIdx.x; h < hidden; h += blockDim.x) dst[h] = narrow<T>(w * widen(src[h]));
  }
}

// float rows move as float4 when hidden % 4 == 0 and the bases are aligned.
template <>
__global__ void dispatch_kernel<float>(const float* __restrict__ x, const std::int64_t* __restrict__ row_source,
                                       const float* __restrict__ weights, std::int64_t top_k, std::int64_t hidden,
                                       std::int64_t rows, bool vec4, float* __restrict__ out) {
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const std::int64_t a = row_source[r];
    float* dst = out + r * hidden;
    if (a < 0) {
      for (std::int64_t h = threadIdx.x; h < hidden; h += blockDim.x) dst[h] = 0.f;
      continue;
    }
    const float w = weights ? weights[a] : 1.f;
    const float* src = x + (a / top_k) * hidden;
    if (vec4) {
      const float4* s4 = reinterpret_cast<const float4*>(src);
      float4* d4 = reinterpret_cast<float4*>(dst);
      for (std::int64_t h = threadIdx.x; h < hidden / 4; h += blockDim.x) {
        float4 v = s4[h];
        v.x *= w, v.y *= w, v.z *= w, v.w *= w;
        d4[h] = v;
      }
    } else {
      for (std::int64_t h = threadIdx.x; h < hidden; h += blockDim.x) dst[h] = w * src[h];
    }
  }
}

// The k rows of a token are summed in a float register and rounded once.
template <typename T>
__global__ void combine_kernel(const T* __restrict__ src, const std::int64_t* __restrict__ dest_row,
                               const float* __restrict__ weights, std::int64_t tokens, std::int64_t top_k,
                               std::int64_t hidden, T* __restrict__ y) {
  for (std::int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    T* dst = y + t * hidden;
    for (std::int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
      float acc = 0.f;
      for (std::int64_t j = 0; j < top_k; ++j) {
        const std::int64_t a = t * top_k + j;
        const std::int64_t r = dest_row[a];
        if (r < 0) continue;
        acc += (weights ? weights[a] : 1.f) * widen(src[r * hidden + h]);
      }
      dst[h] = narrow<T>(acc);
    }
  }
}

// One warp per assignment; the dot product is a float sum whatever T.
template <typename T>
__global__ void gate_grad_kernel(const T* __restrict__ grad_y, const T* __restrict__ src,
                                 const std::int64_t* __restrict__ dest_row, std::int64_t assignments,
                                 std::int64_t top_k, std::int64_t hidden, float* __restrict__ grad_w) {
  const int lane = threadIdx.x & 31;
  const std::int64_t warps_per_block = blockDim.x / 32;
  for (std::int64_t a = blockIdx.x * warps_per_block + threadIdx.x / 32; a < assignments;
       a += static_cast<std::int64_t>(gridDim.x) * warps_per_block) {
    const std::int64_t r = dest_row[a];
    float acc = 0.f;
    if (r >= 0) {
      const T* g = grad_y + (a / top_k) * hidden;
      const T* s = src + r * hidden;
      for (std::int64_t h = lane; h < hidden; h += 32) acc += widen(g[h]) * widen(s[h]);
    }
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, off);
    if (lane == 0) grad_w[a] = acc;
  }
}

// ---- grouped GEMM ----------------------------------------------------------
// 64x64 output tile, 16-deep reduction slices, 256 threads, 4x4 outputs per
// thread at stride 16 (conflict-free shared reads).
constexpr int BM = 64, BN = 64, BK = 16, kGemmThreads = 256;

__device__ __forceinline__ int expert_of_row(const std::int64_t* offsets, int experts, std::int64_t r) {
  int lo = 0, hi = experts;  // last e with offsets[e] <= r
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (offsets[mid] <= r)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

__device__ __forceinline__ void tile_fma(const float (&sa)[BK][BM], const float (&sb)[BK][BN], int ty, int tx,
                                         float (&acc)[4][4]) {
#pragma unroll
  for (int kk = 0; kk < BK; ++kk) {
    float av[4], bv[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) av[i] = sa[kk][ty + 16 * i];
#pragma unroll
    for (int j = 0; j < 4; ++j) bv[j] = sb[kk][tx + 16 * j];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
  }
}

// Row-wise forms (T: float or bfloat16 storage; tiles are staged in shared
// memory as float, so the reduction is a float sum for both). C[r, c] = sum_p A[r, p] * Bop(e(r), p, c), with
//   B_NT (forward):  Bop = B[e][c * P + p]   (B[e] is [cols, P])
//   !B_NT (dgrad):   Bop = B[e][p * cols + c] (B[e] is [P, cols])
// A row tile may straddle segments: one pass per overlapping expert, each
// masking A to that expert's rows, so every row sums only its own expert.
template <bool B_NT, typename T>
__global__ void __launch_bounds__(kGemmThreads)
    grouped_rows_kernel(const T* __restrict__ A, const T* __restrict__ B, const std::int64_t* __restrict__ offsets,
                        std::int64_t rows, int experts, std::int64_t cols, std::int64_t P, T* __restrict__ C) {
  __shared__ float sa[BK][BM];
  __shared__ float sb[BK][BN];
  const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * BM;
  const std::int64_t c0 = static_cast<std::int64_t>(blockIdx.x) * BN;
  float acc[4][4] = {};
  const std::int64_t used = offsets[experts];
  if (r0 < used) {
    const std::int64_t tile_end = r0 + BM < used ? r0 + BM : used;
    for (int e = expert_of_row(offsets, experts, r0); e < experts && offsets[e] < tile_end; ++e) {
      const std::int64_t seg_lo = offsets[e] > r0 ? offsets[e] : r0;
      const std::int64_t seg_hi = offsets[e + 1] < tile_end ? offsets[e + 1] : tile_end;
      if (seg_hi <= seg_lo) continue;
      const T* Be = B + static_cast<std::int64_t>(e) * cols * P;
      for (std::int64_t p0 = 0; p0 < P; p0 += BK) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int idx = tid + kGemmThreads * i;  // 64 rows x 16 p
          const int m = idx / BK, kk = idx % BK;
          const std::int64_t r = r0 + m, p = p0 + kk;
          sa[kk][m] = (r >= seg_lo && r < seg_hi && p < P) ? widen(A[r * P + p]) : 0.f;
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int idx = tid + kGemmThreads * i;
          if (B_NT) {  // contiguous along p
            const int n = idx / BK, kk = idx % BK;
            const std::int64_t c = c0 + n, p = p0 + kk;
            sb[kk][n] = (c < cols && p < P) ? widen(Be[c * P + p]) : 0.f;
          } else {  // contiguous along c
            const int kk = idx / BN, n = idx % BN;
            const std::int64_t c = c0 + n, p = p0 + kk;
            sb[kk][n] = (c < cols && p < P) ? widen(Be[p * cols + c]) : 0.f;
          }
        }
        __syncthreads();
        tile_fma(sa, sb, ty, tx, acc);
        __syncthreads();
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const std::int64_t r = r0 + ty + 16 * i;
    if (r >= rows) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const std::int64_t c = c0 + tx + 16 * j;
      if (c < cols) C[r * cols + c] = narrow<T>(acc[i][j]);
    }
  }
}

// Weight gradient: C[e][n][q] = sum_{r in segment e} A[r,n] * X[r,q].
template <typename T>
__global__ void __launch_bounds__(kGemmThreads)
    grouped_wgrad_kernel(const T* __restrict__ A, const T* __restrict__ X, const std::int64_t* __restrict__ offsets,
                         int experts, std::int64_t N, std::int64_t K, T* __restrict__ C) {
  __shared__ float sa[BK][BM];
  __shared__ float sb[BK][BN];
  const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
  const int e = blockIdx.z;
  const std::int64_t n0 = static_cast<std::int64_t>(blockIdx.y) * BM;
  const std::int64_t q0 = static_cast<std::int64_t>(blockIdx.x) * BN;
  const std::int64_t lo = offsets[e], hi = offsets[e + 1];
  float acc[4][4] = {};
  for (std::int64_t r0 = lo; r0 < hi; r0 += BK) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int idx = tid + kGemmThreads * i;  // 16 rows x 64 columns
      const int kk = idx / BM, m = idx % BM;
      const std::int64_t r = r0 + kk;
      const std::int64_t n = n0 + m, q = q0 + m;
      sa[kk][m] = (r < hi && n < N) ? widen(A[r * N + n]) : 0.f;
      sb[kk][m] = (r < hi && q < K) ? widen(X[r * K + q]) : 0.f;
    }
    __syncthreads();
    tile_fma(sa, sb, ty, tx, acc);
    __syncthreads();
  }
  T* Ce = C + static_cast<std::int64_t>(e) * N * K;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const std::int64_t n = n0 + ty + 16 * i;
    if (n >= N) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const std::int64_t q = q0 + tx + 16 * j;
      if (q < K) Ce[n * K + q] = narrow<T>(acc[i][j]);
    }
  }
}

unsigned grid_1d(std::int64_t items, std::int64_t cap = 65535LL * 16) {
  if (items < 1) return 1;
  return static_cast<unsigned>(items < cap ? items : cap);
}

}  // namespace

std::size_t moe_plan_workspace_bytes(std::int64_t tokens, std::int64_t top_k, std::int64_t experts) {
  const std::int64_t tiles = (tokens * top_k + kPlanTile - 1) / kPlanTile;
  return static_cast<std::size_t>((tiles > 0 ? tiles : 1) * experts) * sizeof(std::int64_t);
}

cudaError_t moe_plan_cuda(const std::int64_t* expert_idx, std::int64_t tokens, std::int64_t top_k, std::int64_t experts,
                          std::int64_t capacity, std::int64_t block_size, std::int64_t* routed, std::int64_t* counts,
                          std::int64_t* offsets, std::int64_t* dest_row, std::int64_t* row_source,
                          std::int64_t* dropped, void* workspace, cudaStream_t stream) {
  const std::int64_t assignments = tokens * top_k;
  const std::int64_t block = block_size < 1 ? 1 : block_size;
  const std::int64_t rows = moe_permuted_rows(tokens, top_k, experts, block);
  const std::int64_t tiles = (assignments + kPlanTile - 1) / kPlanTile;
  auto* tile_counts = static_cast<std::int64_t*>(workspace);
  const int e32 = static_cast<int>(experts);
  // All-ones bytes are -1 in two's complement: padding rows point nowhere.
  cudaError_t err = cudaMemsetAsync(row_source, 0xFF, sizeof(std::int64_t) * rows, stream);
  if (err != cudaSuccess) return err;
  if (tiles > 0) {
    plan_tile_counts<<<static_cast<unsigned>(tiles), kPlanTile, sizeof(int) * experts, stream>>>(
        expert_idx, assignments, e32, tile_counts);
  }
  plan_scan_expert<<<static_cast<unsigned>(experts), kPlanTile, 0, stream>>>(tile_counts, tiles, e32, capacity, routed,
                                                                             counts);
  plan_offsets<<<1, 32, 0, stream>>>(e32, block, routed, counts, offsets, dropped);
  if (tiles > 0) {
    plan_assign<<<static_cast<unsigned>(tiles), kPlanTile, 0, stream>>>(expert_idx, assignments, e32, capacity,
                                                                        tile_counts, offsets, dest_row, row_source);
  }
  return cudaGetLastError();
}

namespace {

template <typename T>
cudaError_t launch_dispatch(const T* x, const std::int64_t* row_source, const float* weights, std::int64_t top_k,
                            std::int64_t hidden, std::int64_t rows, T* out, cudaStream_t stream) {
  if (rows == 0 || hidden == 0) return cudaSuccess;
  // float4 rows need hidden % 4 == 0 and 16-byte aligned bases (views may be offset).
  const bool vec4 =
      (hidden % 4 == 0) && ((reinterpret_cast<std::uintptr_t>(x) | reinterpret_cast<std::uintptr_t>(out)) & 15) == 0;
  dispatch_kernel<T><<<grid_1d(rows), 128, 0, stream>>>(x, row_source, weights, top_k, hidden, rows, vec4, out);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_combine(const T* src, const std::int64_t* dest_row, const float* weights, std::int64_t tokens,
                           std::int64_t top_k, std::int64_t hidden, T* y, cudaStream_t stream) {
  if (tokens == 0 || hidden == 0) return cudaSuccess;
  combine_kernel<T><<<grid_1d(tokens), 128, 0, stream>>>(src, dest_row, weights, tokens, top_k, hidden, y);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_gate_grad(const T* grad_y, const T* src, const std::int64_t* dest_row, std::int64_t tokens,
                             std::int64_t top_k, std::int64_t hidden, float* grad_w, cudaStream_t stream) {
  const std::int64_t assignments = tokens * top_k;
  if (assignments == 0) return cudaSuccess;
  gate_grad_kernel<T>
      <<<grid_1d((assignments + 7) / 8), 256, 0, stream>>>(grad_y, src, dest_row, assignments, top_k, hidden, grad_w);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_rows(bool b_nt, const T* A, const T* B, const std::int64_t* offsets, std::int64_t rows,
                        std::int64_t experts, std::int64_t cols, std::int64_t P, T* C, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((cols + BN - 1) / BN), static_cast<unsigned>((rows + BM - 1) / BM));
  if (grid.y > 65535u) return cudaErrorInvalidConfiguration;
  if (b_nt) {
    grouped_rows_kernel<true, T>
        <<<grid, kGemmThreads, 0, stream>>>(A, B, offsets, rows, static_cast<int>(experts), cols, P, C);
  } else {
    grouped_rows_kernel<false, T>
        <<<grid, kGemmThreads, 0, stream>>>(A, B, offsets, rows, static_cast<int>(experts), cols, P, C);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_wgrad(const T* A, const T* X, const std::int64_t* offsets, std::int64_t experts, std::int64_t N,
                         std::int64_t K, T* C, cudaStream_t stream) {
  if (experts == 0 || N == 0 || K == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((K + BN - 1) / BN), static_cast<unsigned>((N + BM - 1) / BM),
                  static_cast<unsigned>(experts));
  grouped_wgrad_kernel<T><<<grid, kGemmThreads, 0, stream>>>(A, X, offsets, static_cast<int>(experts), N, K, C);
  return cudaGetLastError();
}

}  // namespace

cudaError_t moe_dispatch_cuda(const float* x, const std::int64_t* row_source, const float* weights, std::int64_t tokens,
                              std::int64_t top_k, std::int64_t hidden, std::int64_t rows, float* out,
                              cudaStream_t stream) {
  (void)tokens;
  return launch_dispatch(x, row_source, weights, top_k, hidden, rows, out, stream);
}
cudaError_t moe_dispatch_cuda(const bfloat16* x, const std::int64_t* row_source, const float* weights,
                              std::int64_t tokens, std::int64_t top_k, std::int64_t hidden, std::int64_t rows,
                              bfloat16* out, cudaStream_t stream) {
  (void)tokens;
  return launch_dispatch(x, row_source, weights, top_k, hidden, rows, out, stream);
}

cudaError_t moe_combine_cuda(const float* src, const std::int64_t* dest_row, const float* weights, std::int64_t tokens,
                             std::int64_t top_k, std::int64_t hidden, float* y, cudaStream_t stream) {
  return launch_combine(src, dest_row, weights, tokens, top_k, hidden, y, stream);
}
cudaError_t moe_combine_cuda(const bfloat16* src, const std::int64_t* dest_row, const float* weights,
                             std::int64_t tokens, std::int64_t top_k, std::int64_t hidden, bfloat16* y,
                             cudaStream_t stream) {
  return launch_combine(src, dest_row, weights, tokens, top_k, hidden, y, stream);
}

cudaError_t moe_combine_gate_grad_cuda(const float* grad_y, const float* src, const std::int64_t* dest_row,
                                       std::int64_t tokens, std::int64_t top_k, std::int64_t hidden, float* grad_w,
                                       cudaStream_t stream) {
  return launch_gate_grad(grad_y, src, dest_row, tokens, top_k, hidden, grad_w, stream);
}
cudaError_t moe_combine_gate_grad_cuda(const bfloat16* grad_y, const bfloat16* src, const std::int64_t* dest_row,
                                       std::int64_t tokens, std::int64_t top_k, std::int64_t hidden, float* grad_w,
                                       cudaStream_t stream) {
  return launch_gate_grad(grad_y, src, dest_row, tokens, top_k, hidden, grad_w, stream);
}

cudaError_t moe_grouped_gemm_nt_cuda(const float* A, const float* B, const std::int64_t* offsets, std::int64_t rows,
                                     std::int64_t experts, std::int64_t N, std::int64_t K, float* C,
                                     cudaStream_t stream) {
  return launch_rows(true, A, B, offsets, rows, experts, N, K, C, stream);
}
cudaError_t moe_grouped_gemm_nt_cuda(const bfloat16* A, const bfloat16* B, const std::int64_t* offsets,
                                     std::int64_t rows, std::int64_t experts, std::int64_t N, std::int64_t K,
                                     bfloat16* C, cudaStream_t stream) {
  return launch_rows(true, A, B, offsets, rows, experts, N, K, C, stream);
}

cudaError_t moe_grouped_gemm_nn_cuda(const float* A, const float* B, const std::int64_t* offsets, std::int64_t rows,
                                     std::int64_t experts, std::int64_t N, std::int64_t K, float* C,
                                     cudaStream_t stream) {
  return launch_rows(false, A, B, offsets, rows, experts, K, N, C, stream);
}
cudaError_t moe_grouped_gemm_nn_cuda(const bfloat16* A, const bfloat16* B, const std::int64_t* offsets,
                                     std::int64_t rows, std::int64_t experts, std::int64_t N, std::int64_t K,
                                     bfloat16* C, cudaStream_t stream) {
  return launch_rows(false, A, B, offsets, rows, experts, K, N, C, stream);
}

cudaError_t moe_grouped_gemm_tn_cuda(const float* A, const float* X, const std::int64_t* offsets, std::int64_t rows,
                                     std::int64_t experts, std::int64_t N, std::int64_t K, float* C,
                                     cudaStream_t stream) {
  (void)rows;
  return launch_wgrad(A, X, offsets, experts, N, K, C, stream);
}
cudaError_t moe_grouped_gemm_tn_cuda(const bfloat16* A, const bfloat16* X, const std::int64_t* offsets,
                                     std::int64_t rows, std::int64_t experts, std::int64_t N, std::int64_t K,
                                     bfloat16* C, cudaStream_t stream) {
  (void)rows;
  return launch_wgrad(A, X, offsets, experts, N, K, C, stream);
}

}  // namespace moerl::kernels
