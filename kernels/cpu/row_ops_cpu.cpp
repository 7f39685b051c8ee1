// RMSNorm and rotary embedding rows (moerl_kernels/row_ops.h), written for
// the compiler to vectorise and cloned for AVX-512, AVX2 and the baseline.

#include <cmath>

#include "moerl_kernels/row_ops.h"
#include "vector_lanes.h"

namespace moerl::kernels {
namespace {

[[gnu::always_inline]] inline float sum_of_squares(const float* x, std::int64_t n) {
  lanes::Float16 acc = {};
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const lanes::Float16 v = lanes::load16(x + i);
    acc += v * v;
  }
  float sum = lanes::fold_sum(acc);
  for (; i < n; ++i) sum += x[i] * x[i];
  return sum;
}

}  // namespace

__attribute__((target_clones("avx512f", "avx2", "default"))) void rms_norm_rows_cpu(const float* x, const float* weight,
                                                                                    float* out, std::int64_t dim,
                                                                                    float eps, std::int64_t first,
                                                                                    std::int64_t last) {
  for (std::int64_t r = first; r < last; ++r) {
    const float* row = x + r * dim;
    float* o = out + r * dim;
    const float inverse_rms = 1.0f / std::sqrt(sum_of_squares(row, dim) / static_cast<float>(dim) + eps);
    for (std::int64_t i = 0; i < dim; ++i) o[i] = row[i] * inverse_rms * weight[i];
  }
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void rotary_rows_cpu(
    const float* x, const float* cos, const float* sin, float* out, std::int64_t heads, std::int64_t head_dim,
    std::int64_t first, std::int64_t last) {
  const std::int64_t half = head_dim / 2;
  for (std::int64_t t = first; t < last; ++t) {
    const float* c = cos + t * half;
    const float* s = sin + t * half;
    for (std::int64_t h = 0; h < heads; ++h) {
      const float* x1 = x + (t * heads + h) * head_dim;
      const float* x2 = x1 + half;
      float* o1 = out + (t * heads + h) * head_dim;
      float* o2 = o1 + half;
      for (std::int64_t i = 0; i < half; ++i) {
        o1[i] = x1[i] * c[i] - x2[i] * s[i];
        o2[i] = x2[i] * c[i] + x1[i] * s[i];
      }
    }
  }
}

}  // namespace moerl::kernels
