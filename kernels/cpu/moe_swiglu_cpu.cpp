// CPU grouped SwiGLU on one expert's rows (see moerl_kernels/moe.h): the
// products go to BLAS through cpu_gemm, straight into column slices of the
// caller's buffers; the SwiGLU is applied in place, row by row, while the
// rows are still in cache. No allocation here.

#include <algorithm>
#include <cmath>

#include "moerl_kernels/cpu_gemm.h"
#include "moerl_kernels/moe.h"

namespace moerl::kernels {
namespace {

template <typename Scalar>
inline Scalar sigmoid(Scalar v) {
  return Scalar(1) / (Scalar(1) + std::exp(-v));
}

}  // namespace

template <typename Scalar>
void moe_swiglu_forward_rows_cpu(const Scalar* x, const Scalar* w_gate, const Scalar* w_up, const Scalar* w_down,
                                 std::int64_t n, std::int64_t hidden, std::int64_t d_expert, Scalar* gu, Scalar* h,
                                 Scalar* y) {
  if (n == 0) return;
  const std::int64_t D = d_expert, H = hidden;
  cpu_gemm<Scalar>(false, true, n, D, H, Scalar(1), x, H, w_gate, H, Scalar(0), gu, 2 * D);
  cpu_gemm<Scalar>(false, true, n, D, H, Scalar(1), x, H, w_up, H, Scalar(0), gu + D, 2 * D);
  for (std::int64_t r = 0; r < n; ++r) {
    const Scalar* g = gu + r * 2 * D;
    const Scalar* u = g + D;
    Scalar* hr = h + r * D;
    for (std::int64_t i = 0; i < D; ++i) hr[i] = g[i] * sigmoid(g[i]) * u[i];
  }
  cpu_gemm<Scalar>(false, true, n, H, D, Scalar(1), h, D, w_down, D, Scalar(0), y, H);
}

template <typename Scalar>
void moe_swiglu_backward_rows_cpu(const Scalar* x, const Scalar* gu, const Scalar* h, const Scalar* dy,
                                  const Scalar* w_gate, const Scalar* w_up, const Scalar* w_down, std::int64_t n,
                                  std::int64_t hidden, std::int64_t d_expert, Scalar* scratch, Scalar* dx,
                                  Scalar* dw_gate, Scalar* dw_up, Scalar* dw_down) {
  const std::int64_t D = d_expert, H = hidden;
  if (n == 0) {
    std::fill(dw_gate, dw_gate + D * H, Scalar(0));
    std::fill(dw_up, dw_up + D * H, Scalar(0));
    std::fill(dw_down, dw_down + H * D, Scalar(0));
    return;
  }
  // scratch [n, 2D] = [dG | dU]. dH = dY W_down lands in the dU half first.
  Scalar* dg = scratch;
  Scalar* du = scratch + D;
  cpu_gemm<Scalar>(false, false, n, D, H, Scalar(1), dy, H, w_down, D, Scalar(0), du, 2 * D);
  cpu_gemm<Scalar>(true, false, H, D, n, Scalar(1), dy, H, h, D, Scalar(0), dw_down, D);
  // h = g s u with s = sigmoid(g): dU = dH g s, dG = dH u s (1 + g (1 - s)).
  for (std::int64_t r = 0; r < n; ++r) {
    const Scalar* g = gu + r * 2 * D;
    const Scalar* u = g + D;
    Scalar* dgr = dg + r * 2 * D;
    Scalar* dur = du + r * 2 * D;
    for (std::int64_t i = 0; i < D; ++i) {
      const Scalar s = sigmoid(g[i]);
      const Scalar dh = dur[i];
      dur[i] = dh * g[i] * s;
      dgr[i] = dh * u[i] * s * (Scalar(1) + g[i] * (Scalar(1) - s));
    }
  }
  cpu_gemm<Scalar>(false, false, n, H, D, Scalar(1), dg, 2 * D, w_gate, H, Scalar(0), dx, H);
  cpu_gemm<Scalar>(false, false, n, H, D, Scalar(1), du, 2 * D, w_up, H, Scalar(1), dx, H);
  cpu_gemm<Scalar>(true, false, D, H, n, Scalar(1), dg, 2 * D, x, H, Scalar(0), dw_gate, H);
  cpu_gemm<Scalar>(true, false, D, H, n, Scalar(1), du, 2 * D, x, H, Scalar(0), dw_up, H);
}

#define MOERL_MOE_SWIGLU_INSTANTIATE(Scalar)                                                                    \
  template void moe_swiglu_forward_rows_cpu<Scalar>(const Scalar*, const Scalar*, const Scalar*, const Scalar*, \
                                                    std::int64_t, std::int64_t, std::int64_t, Scalar*, Scalar*, \
                                                    Scalar*);                                                   \
  template void moe_swiglu_backward_rows_cpu<Scalar>(                                                           \
      const Scalar*, const Scalar*, const Scalar*, const Scalar*, const Scalar*, const Scalar*, const Scalar*,  \
      std::int64_t, std::int64_t, std::int64_t, Scalar*, Scalar*, Scalar*, Scalar*, Scalar*);

MOERL_MOE_SWIGLU_INSTANTIATE(float)
MOERL_MOE_SWIGLU_INSTANTIATE(double)
#undef MOERL_MOE_SWIGLU_INSTANTIATE

}  // namespace moerl::kernels
