// CPU twins of the MoE kernels (see moerl_kernels/moe.h). Single-threaded by
// design: the LibTorch adapter splits rows/tokens into ranges and calls these
// from at::parallel_for, so that threading policy stays in one place.

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "moerl_kernels/moe.h"

namespace moerl::kernels {

std::int64_t moe_permuted_rows(std::int64_t tokens, std::int64_t top_k, std::int64_t experts, std::int64_t block_size) {
  const std::int64_t block = std::max<std::int64_t>(block_size, 1);
  return tokens * top_k + experts * (block - 1);
}

void moe_plan_cpu(const std::int64_t* expert_idx, std::int64_t tokens, std::int64_t top_k, std::int64_t experts,
                  std::int64_t capacity, std::int64_t block_size, std::int64_t* routed, std::int64_t* counts,
                  std::int64_t* offsets, std::int64_t* dest_row, std::int64_t* row_source, std::int64_t* dropped) {
  const std::int64_t assignments = tokens * top_k;
  const std::int64_t block = std::max<std::int64_t>(block_size, 1);
  const std::int64_t rows = moe_permuted_rows(tokens, top_k, experts, block_size);
  std::fill(routed, routed + experts, 0);
  for (std::int64_t a = 0; a < assignments; ++a) ++routed[expert_idx[a]];
  std::int64_t start = 0;
  std::int64_t total_dropped = 0;
  for (std::int64_t e = 0; e < experts; ++e) {
    const std::int64_t kept = capacity < 0 ? routed[e] : std::min(routed[e], capacity);
    counts[e] = kept;
    total_dropped += routed[e] - kept;
    offsets[e] = start;
    start += (kept + block - 1) / block * block;
  }
  offsets[experts] = start;
  dropped[0] = total_dropped;
  std::fill(row_source, row_source + rows, std::int64_t{-1});
  // Second pass: the running fill of each expert gives the stable order. The
  // counts array doubles as the cursor and is restored afterwards.
  for (std::int64_t e = 0; e < experts; ++e) counts[e] = 0;
  for (std::int64_t a = 0; a < assignments; ++a) {
    const std::int64_t e = expert_idx[a];
    const std::int64_t rank = counts[e];
    if (capacity >= 0 && rank >= capacity) {
      dest_row[a] = -1;
      continue;
    }
    counts[e] = rank + 1;
    dest_row[a] = offsets[e] + rank;
    row_source[offsets[e] + rank] = a;
  }
}

template <typename Scalar>
void moe_dispatch_cpu(const Scalar* x, const std::int64_t* row_source, const accum_t<Scalar>* weights,
                      std::int64_t tokens, std::int64_t top_k, std::int64_t hidden, std::int64_t rows, Scalar* out) {
  using Acc = accum_t<Scalar>;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t a = row_source[r];
    Scalar* dst = out + r * hidden;
    if (a < 0) {
      std::memset(dst, 0, sizeof(Scalar) * static_cast<std::size_t>(hidden));  // all-zero bits are +0 in bf16 too
      continue;
    }
    const Scalar* src = x + (a / top_k) * hidden;
    if (weights == nullptr) {
      std::memcpy(dst, src, sizeof(Scalar) * static_cast<std::size_t>(hidden));
    } else {
      const Acc w = weights[a];
      for (std::int64_t h = 0; h < hidden; ++h) dst[h] = narrow<Scalar>(w * widen(src[h]));
    }
  }
}

template <typename Scalar>
void moe_combine_cpu(const Scalar* src, const std::int64_t* dest_row, const accum_t<Scalar>* weights,
                     std::int64_t tokens, std::int64_t top_k, std::int64_t hidden, Scalar* y) {
  using Acc = accum_t<Scalar>;
  // The k source rows of a token sit at unrelated places in the permuted
  // buffer (each a page of its own at H=1024). Walking them in interleaved
  // chunks of two cache lines, rather than one whole row after another, keeps
  // k memory streams in flight and the partial sums in L1: 8 -> 17 GB/s
  // measured at T=4096, H=1024, k=8 (a single-thread copy does 18). float and
  // double sum in y's chunk itself; bf16 sums in a float chunk and rounds
  // once on store (the same speed per byte for float as before bf16 came in:
  // 8.6 against 8.4 GB/s, measured on a busier 2-core machine).
  constexpr std::int64_t kChunk = 32;
  constexpr bool kWiden = !std::is_same_v<Acc, Scalar>;
  Acc widened[kChunk];
  for (std::int64_t t = 0; t < tokens; ++t) {
    Scalar* __restrict__ dst = y + t * hidden;
    const std::int64_t* rows = dest_row + t * top_k;
    const Acc* w = weights == nullptr ? nullptr : weights + t * top_k;
    for (std::int64_t h0 = 0; h0 < hidden; h0 += kChunk) {
      const std::int64_t n = std::min(hidden - h0, kChunk);
      // Without widening the chunk of y itself holds the sums (no extra pass).
      Acc* __restrict__ acc;
      if constexpr (kWiden) {
        acc = widened;
      } else {
        acc = dst + h0;
      }
      bool any = false;
      for (std::int64_t j = 0; j < top_k; ++j) {
        const std::int64_t r = rows[j];
        if (r < 0) continue;
        const Scalar* __restrict__ row = src + r * hidden + h0;
        const Acc wj = w == nullptr ? Acc(1) : w[j];
        if (!any) {
          for (std::int64_t i = 0; i < n; ++i) acc[i] = wj * widen(row[i]);
          any = true;
        } else {
          for (std::int64_t i = 0; i < n; ++i) acc[i] += wj * widen(row[i]);
        }
      }
      if (!any) {
        for (std::int64_t i = 0; i < n; ++i) dst[h0 + i] = narrow<Scalar>(Acc(0));
      } else if constexpr (kWiden) {
        for (std::int64_t i = 0; i < n; ++i) dst[h0 + i] = narrow<Scalar>(acc[i]);
      }
    }
  }
}

template <typename Scalar>
void moe_combine_gate_grad_cpu(const Scalar* grad_y, const Scalar* src, const std::int64_t* dest_row,
                               std::int64_t tokens, std::int64_t top_k, std::int64_t hidden, accum_t<Scalar>* grad_w) {
  using Acc = accum_t<Scalar>;
  for (std::int64_t a = 0; a < tokens * top_k; ++a) {
    const std::int64_t r = dest_row[a];
    if (r < 0) {
      grad_w[a] = Acc(0);
      continue;
    }
    const Scalar* g = grad_y + (a / top_k) * hidden;
    const Scalar* row = src + r * hidden;
    // Eight independent partial sums: the compiler may not reorder a single
    // floating-point sum, and one serial chain ran at a quarter of the speed.
    constexpr std::int64_t kLanes = 8;
    Acc part[kLanes] = {};
    std::int64_t h = 0;
    for (; h + kLanes <= hidden; h += kLanes) {
      for (std::int64_t l = 0; l < kLanes; ++l) part[l] += widen(g[h + l]) * widen(row[h + l]);
    }
    Acc acc = 0;
    for (; h < hidden; ++h) acc += widen(g[h]) * widen(row[h]);
    for (std::int64_t l = 0; l < kLanes; ++l) acc += part[l];
    grad_w[a] = acc;
  }
}

namespace {
// Expert owning row r, or -1 when r is past the last segment.
std::int64_t expert_of_row(const std::int64_t* offsets, std::int64_t experts, std::int64_t r) {
  if (r >= offsets[experts]) return -1;
  // upper_bound over the E+1 starts: the last start <= r (empty segments skipped).
  const std::int64_t* it = std::upper_bound(offsets, offsets + experts + 1, r);
  return (it - offsets) - 1;
}
}  // namespace

// The grouped GEMM twins are reference loops for the CUDA tests (the CPU
// operators use BLAS through moe_swiglu_*_rows_cpu): each output element is
// one Acc sum in ascending order of the reduced index, stored once.
template <typename Scalar>
void moe_grouped_gemm_nt_cpu(const Scalar* A, const Scalar* B, const std::int64_t* offsets, std::int64_t rows,
                             std::int64_t experts, std::int64_t N, std::int64_t K, Scalar* C) {
  using Acc = accum_t<Scalar>;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t e = expert_of_row(offsets, experts, r);
    for (std::int64_t n = 0; n < N; ++n) {
      Acc acc = 0;
      if (e >= 0) {
        const Scalar* a = A + r * K;
        const Scalar* b = B + (e * N + n) * K;
        for (std::int64_t q = 0; q < K; ++q) acc += widen(a[q]) * widen(b[q]);
      }
      C[r * N + n] = narrow<Scalar>(acc);
    }
  }
}

template <typename Scalar>
void moe_grouped_gemm_nn_cpu(const Scalar* A, const Scalar* B, const std::int64_t* offsets, std::int64_t rows,
                             std::int64_t experts, std::int64_t N, std::int64_t K, Scalar* C) {
  using Acc = accum_t<Scalar>;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t e = expert_of_row(offsets, experts, r);
    Scalar* c = C + r * K;
    for (std::int64_t q = 0; q < K; ++q) {
      Acc acc = 0;
      if (e >= 0) {
        for (std::int64_t n = 0; n < N; ++n) acc += widen(A[r * N + n]) * widen(B[(e * N + n) * K + q]);
      }
      c[q] = narrow<Scalar>(acc);
    }
  }
}

template <typename Scalar>
void moe_grouped_gemm_tn_cpu(const Scalar* A, const Scalar* X, const std::int64_t* offsets, std::int64_t rows,
                             std::int64_t experts, std::int64_t N, std::int64_t K, Scalar* C) {
  using Acc = accum_t<Scalar>;
  for (std::int64_t e = 0; e < experts; ++e) {
    const std::int64_t begin = std::min(offsets[e], rows), end = std::min(offsets[e + 1], rows);
    Scalar* c = C + e * N * K;
    for (std::int64_t n = 0; n < N; ++n) {
      for (std::int64_t q = 0; q < K; ++q) {
        Acc acc = 0;
        for (std::int64_t r = begin; r < end; ++r) acc += widen(A[r * N + n]) * widen(X[r * K + q]);
        c[n * K + q] = narrow<Scalar>(acc);
      }
    }
  }
}

#define MOERL_MOE_INSTANTIATE(Scalar)                                                                              \
  template void moe_dispatch_cpu<Scalar>(const Scalar*, const std::int64_t*, const accum_t<Scalar>*, std::int64_t, \
                                         std::int64_t, std::int64_t, std::int64_t, Scalar*);                       \
  template void moe_combine_cpu<Scalar>(const Scalar*, const std::int64_t*, const accum_t<Scalar>*, std::int64_t,  \
                                        std::int64_t, std::int64_t, Scalar*);                                      \
  template void moe_combine_gate_grad_cpu<Scalar>(const Scalar*, const Scalar*, const std::int64_t*, std::int64_t, \
                                                  std::int64_t, std::int64_t, accum_t<Scalar>*);                   \
  template void moe_grouped_gemm_nt_cpu<Scalar>(const Scalar*, const Scalar*, const std::int64_t*, std::int64_t,   \
                                                std::int64_t, std::int64_t, std::int64_t, Scalar*);                \
  template void moe_grouped_gemm_nn_cpu<Scalar>(const Scalar*, const Scalar*, const std::int64_t*, std::int64_t,   \
                                                std::int64_t, std::int64_t, std::int64_t, Scalar*);                \
  template void moe_grouped_gemm_tn_cpu<Scalar>(const Scalar*, const Scalar*, const std::int64_t*, std::int64_t,   \
                                                std::int64_t, std::int64_t, std::int64_t, Scalar*);

MOERL_MOE_INSTANTIATE(float)
MOERL_MOE_INSTANTIATE(double)
MOERL_MOE_INSTANTIATE(bfloat16)
#undef MOERL_MOE_INSTANTIATE

}  // namespace moerl::kernels
