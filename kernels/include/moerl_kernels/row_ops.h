#pragma once
// Row-wise kernels of a decoder layer that LibTorch runs as chains of small
// tensor ops: RMSNorm and rotary position embedding. In a decode step each
// op of such a chain is a few microseconds on a [batch, d_model] tensor, too
// small for LibTorch to split across threads, and together they were a
// serial stretch of every step that a second thread waited through
// (docs/performance.md). These take raw pointers over a range of rows, so
// that a caller can split rows across its threads; they are the inference
// forms only (no gradient).

#include <cstdint>

namespace moerl::kernels {

// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight for rows [first, last)
// of a row-major [rows, dim] x and out.
void rms_norm_rows_cpu(const float* x, const float* weight, float* out, std::int64_t dim, float eps, std::int64_t first,
                       std::int64_t last);

// Rotary embedding of tokens [first, last) of x, [tokens, heads, head_dim]
// row-major: with half = head_dim / 2, c = cos[t][i], s = sin[t][i] (both
// [tokens, half]), out[t][h][i] = x1 c - x2 s and out[t][h][half + i] =
// x2 c + x1 s, where x1 = x[t][h][i] and x2 = x[t][h][half + i].
void rotary_rows_cpu(const float* x, const float* cos, const float* sin, float* out, std::int64_t heads,
                     std::int64_t head_dim, std::int64_t first, std::int64_t last);

}  // namespace moerl::kernels
