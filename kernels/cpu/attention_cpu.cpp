// Causal attention on the CPU, block by block of queries (see
// moerl_kernels/attention.h). The products go to BLAS through cpu_gemm
// straight from and into the packed layout (leading dimensions = strides);
// the soft-max runs row by row on a scratch block that stays in cache.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "moerl_kernels/attention.h"
#include "moerl_kernels/cpu_gemm.h"
#include "vector_lanes.h"

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
  // (A decode token needs only its scores, [group, positions], in the rest.)
  return 2 * (task.past + task.tokens) * task.head_dim + task.tokens * task.group +
         std::max(causal_attention_scratch(task), task.group * (task.past + task.tokens));
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

namespace {

// One decode token's attention read in place from the paged cache. A decode
// step has one query per sequence, so the GEMMs of the general path shrink to
// dot products over a few dozen elements, and copying the keys and values out
// of the cache first was most of the attention (memmove was 24-36% of a
// 256-session decode run, `perf`). Here each pool block is walked front to
// back, every cached row read once for all the query heads it serves. The
// float loops are written for the compiler to vectorise, and paged_decode
// below is cloned for the CPU's vector width.

using lanes::fold_sum;
using lanes::load16;

template <typename Scalar>
[[gnu::always_inline]] inline Scalar dot(const Scalar* a, const Scalar* b, std::int64_t n) {
  Scalar sum = 0;
  for (std::int64_t d = 0; d < n; ++d) sum += a[d] * b[d];
  return sum;
}

template <>
[[gnu::always_inline]] inline float dot<float>(const float* a, const float* b, std::int64_t n) {
  lanes::Float16 acc = {};
  std::int64_t d = 0;
  for (; d + 16 <= n; d += 16) acc += load16(a + d) * load16(b + d);
  float sum = fold_sum(acc);
  for (; d < n; ++d) sum += a[d] * b[d];
  return sum;
}

template <typename Scalar>
[[gnu::always_inline]] inline Scalar sum_of(const Scalar* x, std::int64_t n) {
  return std::accumulate(x, x + n, Scalar(0));
}

template <>
[[gnu::always_inline]] inline float sum_of<float>(const float* x, std::int64_t n) {
  lanes::Float16 acc = {};
  std::int64_t j = 0;
  for (; j + 16 <= n; j += 16) acc += load16(x + j);
  float sum = fold_sum(acc);
  for (; j < n; ++j) sum += x[j];
  return sum;
}

// The maximum is exact in any order, so a plain loop may vectorise it; the
// serial one was a compare's latency per key.
template <typename Scalar>
[[gnu::always_inline]] inline Scalar max_of(const Scalar* x, std::int64_t n) {
  Scalar lanes[16];
  std::fill(lanes, lanes + 16, x[0]);
  std::int64_t j = 0;
  for (; j + 16 <= n; j += 16)
    for (int l = 0; l < 16; ++l) lanes[l] = std::max(lanes[l], x[j + l]);
  Scalar max = *std::max_element(lanes, lanes + 16);
  for (; j < n; ++j) max = std::max(max, x[j]);
  return max;
}

// Asks for a row's cache lines ahead of their use. Pool blocks are pages of
// their own, and the hardware prefetchers do not follow a block table.
template <typename Scalar>
[[gnu::always_inline]] inline void prefetch_row(const Scalar* row, std::int64_t elements) {
  const char* bytes = reinterpret_cast<const char*>(row);
  const std::int64_t size = elements * static_cast<std::int64_t>(sizeof(Scalar));
  for (std::int64_t at = 0; at < size; at += 64) __builtin_prefetch(bytes + at);
}

// The positions [first, first + keys) block by block: fn(j, row) for each,
// j counted from first and row its cached row in `pool`; each row of the
// next block is asked for one block ahead.
template <typename Scalar, typename Fn>
[[gnu::always_inline]] inline void for_each_cached_row(const PagedKeys<Scalar>& cache, const Scalar* pool,
                                                       std::int64_t first, std::int64_t keys, Fn&& fn) {
  const std::int64_t stride = cache.position_stride, size = cache.block_size;
  const std::int64_t end = first + keys;
  for (std::int64_t block_start = first - first % size; block_start < end; block_start += size) {
    const Scalar* block = pool + cache.blocks[block_start / size] * size * stride;
    const Scalar* next =
        block_start + size < end ? pool + cache.blocks[block_start / size + 1] * size * stride : nullptr;
    const std::int64_t from = std::max(first, block_start), to = std::min(end, block_start + size);
    for (std::int64_t p = from; p < to; ++p) {
      if (next != nullptr) prefetch_row(next + (p - block_start) * stride, stride);
      fn(p - first, block + (p - block_start) * stride);
    }
  }
}

template <typename Scalar>
[[gnu::always_inline]] inline void paged_decode_body(const CausalAttentionTask& task, std::int64_t kv_heads,
                                                     Scalar scale, const Scalar* q, const PagedKeys<Scalar>& cache,
                                                     Scalar* out, Scalar* lse, Scalar* scores) {
  const std::int64_t D = task.head_dim, G = task.group, heads = kv_heads * G;
  const std::int64_t first = first_key_of_block(task, task.past), keys = task.past + 1 - first;
  // scores[h * keys + j]: query head h against key first + j.
  for_each_cached_row(cache, cache.keys, first, keys, [&](std::int64_t j, const Scalar* k) {
    for (std::int64_t kv = 0; kv < kv_heads; ++kv)
      for (std::int64_t g = 0; g < G; ++g) {
        const std::int64_t h = kv * G + g;
        scores[h * keys + j] = scale * dot(q + h * D, k + kv * D, D);
      }
  });
  for (std::int64_t h = 0; h < heads; ++h) {
    Scalar* s = scores + h * keys;
    const Scalar max = max_of(s, keys);
    for (std::int64_t j = 0; j < keys; ++j) s[j] -= max;
    exp_of_nonpositive(s, keys);
    const Scalar sum = sum_of(s, keys);
    const Scalar inverse = Scalar(1) / sum;
    for (std::int64_t j = 0; j < keys; ++j) s[j] *= inverse;
    if (lse != nullptr) lse[h] = max + std::log(sum);
  }
  std::fill(out, out + heads * D, Scalar(0));
  for_each_cached_row(cache, cache.values, first, keys, [&](std::int64_t j, const Scalar* v) {
    for (std::int64_t kv = 0; kv < kv_heads; ++kv)
      for (std::int64_t g = 0; g < G; ++g) {
        const std::int64_t h = kv * G + g;
        const Scalar p = scores[h * keys + j];
        Scalar* o = out + h * D;
        const Scalar* v_head = v + kv * D;
        for (std::int64_t d = 0; d < D; ++d) o[d] += p * v_head[d];
      }
  });
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void paged_decode(const CausalAttentionTask& task,
                                                                               std::int64_t kv_heads, float scale,
                                                                               const float* q,
                                                                               const PagedKeys<float>& cache,
                                                                               float* out, float* lse, float* scores) {
  paged_decode_body(task, kv_heads, scale, q, cache, out, lse, scores);
}

void paged_decode(const CausalAttentionTask& task, std::int64_t kv_heads, double scale, const double* q,
                  const PagedKeys<double>& cache, double* out, double* lse, double* scores) {
  paged_decode_body(task, kv_heads, scale, q, cache, out, lse, scores);
}

}  // namespace

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
  if (task.tokens == 1) {  // one query's heads sit side by side in q, out and lse
    paged_decode(task, 1, scale, q, cache, out, lse, rest);
    return;
  }
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

std::int64_t causal_attention_paged_decode_scratch(const CausalAttentionTask& task, std::int64_t kv_heads) {
  return kv_heads * task.group * (task.past + 1);
}

template <typename Scalar>
void causal_attention_paged_decode_cpu(const CausalAttentionTask& task, std::int64_t kv_heads, Scalar scale,
                                       const Scalar* q, const PagedKeys<Scalar>& cache, Scalar* out, Scalar* scratch) {
  paged_decode(task, kv_heads, scale, q, cache, out, nullptr, scratch);
}

#define MOERL_INSTANTIATE_ATTENTION(Scalar)                                                                            \
  template void causal_attention_forward_cpu<Scalar>(const CausalAttentionTask&, Scalar, const Scalar*, const Scalar*, \
                                                     const Scalar*, Scalar*, Scalar*, Scalar*);                        \
  template void causal_attention_backward_cpu<Scalar>(const CausalAttentionTask&, Scalar, const Scalar*,               \
                                                      const Scalar*, const Scalar*, const Scalar*, const Scalar*,      \
                                                      const Scalar*, Scalar*, Scalar*, Scalar*, Scalar*);              \
  template void causal_attention_paged_forward_cpu<Scalar>(const CausalAttentionTask&, Scalar, const Scalar*,          \
                                                           const PagedKeys<Scalar>&, Scalar*, Scalar*, Scalar*);       \
  template void causal_attention_paged_decode_cpu<Scalar>(const CausalAttentionTask&, std::int64_t, Scalar,            \
                                                          const Scalar*, const PagedKeys<Scalar>&, Scalar*, Scalar*);
MOERL_INSTANTIATE_ATTENTION(float)
MOERL_INSTANTIATE_ATTENTION(double)
#undef MOERL_INSTANTIATE_ATTENTION

}  // namespace moerl::kernels
