// Causal attention on the CPU, block by block of queries (see
// moerl_kernels/attention.h). The products go to BLAS through cpu_gemm
// straight from and into the packed layout (leading dimensions = strides);
// the soft-max runs row by row on a scratch block that stays in cache.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "moerl_kernels/attention.h"
#include "moerl_kernels/cpu_gemm.h"

namespace moerl::kernels {
namespace {

// Queries per block: 64 rows of scores over a few hundred keys stay in L2,
// and the GEMMs are still large enough for BLAS to pay off.
constexpr std::int64_t kBlockRows = 64;

// exp(x[i]) for x[i] <= 0 (soft-max arguments after the row maximum is taken
// off), written so that the compiler vectorises the loop: std::exp is a call
// per element and was most of a soft-max's time. Cody-Waite range reduction
// x = n ln2 + r and a degree-6 polynomial for exp(r) (the Cephes expf
// coefficients), relative error about 2e-7; below -87 the result is the
// smallest normal float's neighbourhood instead of 0, which no soft-max sum
// can tell apart. The loop vectorises only without trapping math (this file
// is compiled with -fno-trapping-math, kernels/CMakeLists.txt); the AVX2 clone
// runs where the CPU has it, twice the width of x86-64's baseline SSE2.
__attribute__((target_clones("avx2", "default"))) void exp_of_nonpositive(float* x, std::int64_t n) {
  constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = std::max(x[i], -87.0f);
    // Round to nearest for v <= 0: truncation of t - 0.5 (toward zero).
    const auto k = static_cast<std::int32_t>(v * kLog2e - 0.5f);
    const auto kf = static_cast<float>(k);
    const float r = v - kf * kLn2Hi - kf * kLn2Lo;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const std::int32_t bits = (k + 127) << 23;  // 2^k
    float two_k;
    std::memcpy(&two_k, &bits, sizeof two_k);
    x[i] = p * two_k;
  }
}

void exp_of_nonpositive(double* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) x[i] = std::exp(x[i]);
}

// The keys [first, last] the query at position t may see, as columns of a
// block whose first column is key `base`.
struct KeyRange {
  std::int64_t first = 0, last = 0;  // inclusive
};

KeyRange visible_keys(const CausalAttentionTask& task, std::int64_t t, std::int64_t base) {
  const std::int64_t lo = task.window > 0 ? std::max<std::int64_t>(0, t - task.window + 1) : 0;
  return {lo - base, t - base};
}

// The first key any query at position first_query or later may see.
std::int64_t first_key_of_block(const CausalAttentionTask& task, std::int64_t first_query) {
  return task.window > 0 ? std::max<std::int64_t>(0, first_query - task.window + 1) : 0;
}

// The keys a block of queries [i0, i0 + rows) reads: [first, first + count).
struct BlockKeys {
  std::int64_t first = 0, count = 0;
};

BlockKeys keys_of_block(const CausalAttentionTask& task, std::int64_t i0, std::int64_t rows) {
  const std::int64_t first = first_key_of_block(task, task.past + i0);
  return {first, task.past + i0 + rows - first};
}

// scores[rows, cols] = scale * q[queries] k[keys]^T for one query head.
template <typename Scalar>
void block_scores(const CausalAttentionTask& task, Scalar scale, const Scalar* q_head, const Scalar* k, std::int64_t i0,
                  std::int64_t rows, std::int64_t k0, std::int64_t cols, Scalar* scores) {
  cpu_gemm<Scalar>(false, true, rows, cols, task.head_dim, scale, q_head + i0 * task.q_stride, task.q_stride,
                   k + k0 * task.kv_stride, task.kv_stride, Scalar(0), scores, cols);
}

// Zero every column of a score row outside the visible range.
template <typename Scalar>
void zero_outside(Scalar* row, std::int64_t cols, const KeyRange& r) {
  std::fill(row, row + r.first, Scalar(0));
  std::fill(row + r.last + 1, row + cols, Scalar(0));
}

}  // namespace

std::int64_t causal_attention_scratch(const CausalAttentionTask& task) {
  return 2 * kBlockRows * std::max<std::int64_t>(task.past + task.tokens, 1) + kBlockRows;
}

std::int64_t causal_attention_paged_scratch(const CausalAttentionTask& task) {
  // The copied keys and values, one lse per query and head, and the rest.
  return 2 * (task.past + task.tokens) * task.head_dim + task.tokens * task.group + causal_attention_scratch(task);
}

template <typename Scalar>
void causal_attention_forward_cpu(const CausalAttentionTask& task, Scalar scale, const Scalar* q, const Scalar* k,
                                  const Scalar* v, Scalar* out, Scalar* lse, Scalar* scratch) {
  const std::int64_t n = task.tokens, D = task.head_dim;
  for (std::int64_t g = 0; g < task.group; ++g) {
    const Scalar* q_head = q + g * D;
    for (std::int64_t i0 = 0; i0 < n; i0 += kBlockRows) {
      const std::int64_t rows = std::min(kBlockRows, n - i0);
      const auto [k0, cols] = keys_of_block(task, i0, rows);
      Scalar* p = scratch;  // [rows, cols]: scores, then probabilities
      block_scores(task, scale, q_head, k, i0, rows, k0, cols, p);
      for (std::int64_t r = 0; r < rows; ++r) {
        Scalar* row = p + r * cols;
        const KeyRange keys = visible_keys(task, task.past + i0 + r, k0);
        const Scalar max = *std::max_element(row + keys.first, row + keys.last + 1);
        for (std::int64_t j = keys.first; j <= keys.last; ++j) row[j] -= max;
        exp_of_nonpositive(row + keys.first, keys.last - keys.first + 1);
        Scalar sum = 0;
        for (std::int64_t j = keys.first; j <= keys.last; ++j) sum += row[j];
        const Scalar inverse = Scalar(1) / sum;
        for (std::int64_t j = keys.first; j <= keys.last; ++j) row[j] *= inverse;
        zero_outside(row, cols, keys);
        lse[(i0 + r) * task.lse_stride + g] = max + std::log(sum);
      }
      cpu_gemm<Scalar>(false, false, rows, D, cols, Scalar(1), p, cols, v + k0 * task.kv_stride, task.kv_stride,
                       Scalar(0), out + i0 * task.q_stride + g * D, task.q_stride);
    }
  }
}

template <typename Scalar>
void causal_attention_backward_cpu(const CausalAttentionTask& task, Scalar scale, const Scalar* q, const Scalar* k,
                                   const Scalar* v, const Scalar* out, const Scalar* lse, const Scalar* dout,
                                   Scalar* dq, Scalar* dk, Scalar* dv, Scalar* scratch) {
  const std::int64_t n = task.tokens, D = task.head_dim, qs = task.q_stride, kvs = task.kv_stride;
  for (std::int64_t g = 0; g < task.group; ++g) {
    const Scalar* q_head = q + g * D;
    for (std::int64_t i0 = 0; i0 < n; i0 += kBlockRows) {
      const std::int64_t rows = std::min(kBlockRows, n - i0);
      const auto [k0, cols] = keys_of_block(task, i0, rows);
      const std::int64_t keys = task.past + n;
      Scalar* p = scratch;                                // [rows, cols] probabilities
      Scalar* ds = scratch + kBlockRows * keys;           // [rows, cols] dP, then dS
      Scalar* delta = scratch + 2 * kBlockRows * keys;    // [rows] dout . out
      const Scalar* dout_block = dout + i0 * qs + g * D;  // [rows, D] with stride qs
      // The probabilities again, from the forward's log-sum-exp.
      block_scores(task, scale, q_head, k, i0, rows, k0, cols, p);
      for (std::int64_t r = 0; r < rows; ++r) {
        Scalar* row = p + r * cols;
        const KeyRange keys = visible_keys(task, task.past + i0 + r, k0);
        const Scalar row_lse = lse[(i0 + r) * task.lse_stride + g];
        for (std::int64_t j = keys.first; j <= keys.last; ++j) row[j] -= row_lse;
        exp_of_nonpositive(row + keys.first, keys.last - keys.first + 1);
        zero_outside(row, cols, keys);
        const Scalar* o = out + (i0 + r) * qs + g * D;
        const Scalar* d_o = dout_block + r * qs;
        Scalar dot = 0;
        for (std::int64_t d = 0; d < D; ++d) dot += o[d] * d_o[d];
        delta[r] = dot;
      }
      // dP = dout v^T; dS = P (dP - delta) scale (the soft-max's backward,
      // with the score scale folded in).
      cpu_gemm<Scalar>(false, true, rows, cols, D, Scalar(1), dout_block, qs, v + k0 * kvs, kvs, Scalar(0), ds, cols);
      for (std::int64_t r = 0; r < rows; ++r) {
        const Scalar* pr = p + r * cols;
        Scalar* dr = ds + r * cols;
        const Scalar shift = delta[r];
        for (std::int64_t j = 0; j < cols; ++j) dr[j] = pr[j] * (dr[j] - shift) * scale;
      }
      cpu_gemm<Scalar>(true, false, cols, D, rows, Scalar(1), p, cols, dout_block, qs, Scalar(1), dv + k0 * kvs, kvs);
      cpu_gemm<Scalar>(false, false, rows, D, cols, Scalar(1), ds, cols, k + k0 * kvs, kvs, Scalar(0),
                       dq + i0 * qs + g * D, qs);
      cpu_gemm<Scalar>(true, false, cols, D, rows, Scalar(1), ds, cols, q_head + i0 * qs, qs, Scalar(1), dk + k0 * kvs,
                       kvs);
    }
  }
}

template <typename Scalar>
void causal_attention_paged_forward_cpu(const CausalAttentionTask& task, Scalar scale, const Scalar* q,
                                        const PagedKeys<Scalar>& cache, Scalar* out, Scalar* lse, Scalar* scratch) {
  const std::int64_t D = task.head_dim, positions = task.past + task.tokens;
  // Only the keys some query sees (a sliding window skips the older ones).
  const std::int64_t first = first_key_of_block(task, task.past);
  Scalar* keys = scratch;                     // [positions, D], from first on
  Scalar* values = keys + positions * D;      // [positions, D]
  Scalar* lse_rows = values + positions * D;  // [tokens, group] when lse is null
  Scalar* rest = lse_rows + task.tokens * task.group;
  for (std::int64_t j = first; j < positions; ++j) {
    const std::int64_t at = cache.blocks[j / cache.block_size] * cache.block_size * cache.position_stride +
                            (j % cache.block_size) * cache.position_stride;
    std::memcpy(keys + j * D, cache.keys + at, static_cast<std::size_t>(D) * sizeof(Scalar));
    std::memcpy(values + j * D, cache.values + at, static_cast<std::size_t>(D) * sizeof(Scalar));
  }
  CausalAttentionTask contiguous = task;
  contiguous.kv_stride = D;
  if (lse == nullptr) contiguous.lse_stride = task.group;
  causal_attention_forward_cpu<Scalar>(contiguous, scale, q, keys, values, out, lse ? lse : lse_rows, rest);
}

#define MOERL_INSTANTIATE_ATTENTION(Scalar)                                                                            \
  template void causal_attention_forward_cpu<Scalar>(const CausalAttentionTask&, Scalar, const Scalar*, const Scalar*, \
                                                     const Scalar*, Scalar*, Scalar*, Scalar*);                        \
  template void causal_attention_backward_cpu<Scalar>(const CausalAttentionTask&, Scalar, const Scalar*,               \
                                                      const Scalar*, const Scalar*, const Scalar*, const Scalar*,      \
                                                      const Scalar*, Scalar*, Scalar*, Scalar*, Scalar*);              \
  template void causal_attention_paged_forward_cpu<Scalar>(const CausalAttentionTask&, Scalar, const Scalar*,          \
                                                           const PagedKeys<Scalar>&, Scalar*, Scalar*, Scalar*);
MOERL_INSTANTIATE_ATTENTION(float)
MOERL_INSTANTIATE_ATTENTION(double)
#undef MOERL_INSTANTIATE_ATTENTION

}  // namespace moerl::kernels
