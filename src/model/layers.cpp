// The weight-light building blocks of the policy: RMSNorm, rotary position
// embedding and the dense SwiGLU feed-forward.

#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

#include "moerl/core/check.h"
#include "moerl/model/feed_forward.h"
#include "moerl/model/rms_norm.h"
#include "moerl/model/rotary.h"
#include "moerl_kernels/row_ops.h"

namespace moerl::model {

namespace {
bool is_reduced_precision(const torch::Tensor& x) {
  return x.scalar_type() == torch::kHalf || x.scalar_type() == torch::kBFloat16;
}

// True when the row kernels (moerl_kernels/row_ops.h) may stand in for the
// tensor-op chain: float32 CPU tensors that no gradient flows through (a
// rollout step, an evaluation). Training keeps the chain and its autograd.
bool row_kernel_applies(std::initializer_list<torch::Tensor> tensors) {
  for (const torch::Tensor& t : tensors) {
    if (!t.device().is_cpu() || t.scalar_type() != torch::kFloat) return false;
    if (torch::GradMode::is_enabled() && t.requires_grad()) return false;
  }
  return true;
}

// Splits rows of `elements_per_row` across LibTorch's threads in pieces of
// at least 4096 elements (below that a fork and join costs about what the
// work does).
template <typename Fn>
void for_row_ranges(std::int64_t rows, std::int64_t elements_per_row, Fn&& fn) {
  const std::int64_t grain = std::max<std::int64_t>(1, 4096 / std::max<std::int64_t>(elements_per_row, 1));
  at::parallel_for(0, rows, grain, fn);
}
}  // namespace

RMSNormImpl::RMSNormImpl(std::int64_t dim, double eps_) : eps(eps_) {
  MOERL_CHECK(dim > 0, "RMSNorm dimension must be positive, got " + std::to_string(dim));
  weight = register_parameter("weight", torch::ones({dim}));
}

void RMSNormImpl::reset_parameters() {
  torch::NoGradGuard no_grad;
  weight.fill_(1.0);
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  if (row_kernel_applies({x, weight})) {
    const torch::Tensor input = x.contiguous();
    torch::Tensor out = torch::empty_like(input);
    const std::int64_t dim = input.size(-1), rows = input.numel() / std::max<std::int64_t>(dim, 1);
    for_row_ranges(rows, dim, [&](std::int64_t first, std::int64_t last) {
      kernels::rms_norm_rows_cpu(input.data_ptr<float>(), weight.data_ptr<float>(), out.data_ptr<float>(), dim,
                                 static_cast<float>(eps), first, last);
    });
    return out;
  }
  const torch::Tensor xf = is_reduced_precision(x) ? x.to(torch::kFloat) : x;
  const torch::Tensor inv_rms = torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return (xf * inv_rms).to(x.scalar_type()) * weight;
}

namespace {
// rotary_angles for host positions as one loop (a decode step computes them
// for a few dozen positions, where the dozen tensor ops of the general form
// cost more than the trigonometry). The same float64 math.
RotaryAngles rotary_angles_on_host(const torch::Tensor& positions, std::int64_t head_dim, double theta,
                                   torch::ScalarType dtype) {
  const std::int64_t half = head_dim / 2, tokens = positions.size(0);
  const torch::Tensor position = positions.to(torch::kDouble).contiguous();
  std::vector<double> inverse_frequency(static_cast<std::size_t>(half));
  for (std::int64_t i = 0; i < half; ++i)
    inverse_frequency[static_cast<std::size_t>(i)] =
        std::pow(theta, static_cast<double>(i) * (-2.0 / static_cast<double>(head_dim)));
  torch::Tensor cos = torch::empty({tokens, 1, half}, torch::kDouble), sin = torch::empty_like(cos);
  const double* p = position.data_ptr<double>();
  double* c = cos.data_ptr<double>();
  double* s = sin.data_ptr<double>();
  for (std::int64_t t = 0; t < tokens; ++t)
    for (std::int64_t i = 0; i < half; ++i) {
      const double angle = p[t] * inverse_frequency[static_cast<std::size_t>(i)];
      c[t * half + i] = std::cos(angle);
      s[t * half + i] = std::sin(angle);
    }
  return {cos.to(dtype), sin.to(dtype)};
}
}  // namespace

RotaryAngles rotary_angles(const torch::Tensor& positions, std::int64_t head_dim, double theta,
                           torch::ScalarType dtype) {
  MOERL_CHECK(head_dim % 2 == 0, "rotary head_dim must be even, got " + std::to_string(head_dim));
  MOERL_CHECK(positions.dim() == 1, "rotary: positions must be [T]");
  const std::int64_t half = head_dim / 2;
  // Angles in float64: identical for the same position whatever the batch
  // composition, and accurate at long positions.
  if (positions.device().is_cpu()) return rotary_angles_on_host(positions, head_dim, theta, dtype);
  const auto f64 = torch::TensorOptions().dtype(torch::kDouble).device(positions.device());
  const torch::Tensor inv_freq =
      torch::pow(theta, torch::arange(0, half, f64).mul(-2.0 / static_cast<double>(head_dim)));
  const torch::Tensor angles = positions.to(f64).unsqueeze(1) * inv_freq.unsqueeze(0);  // [T, half]
  return {angles.cos().to(dtype).unsqueeze(1), angles.sin().to(dtype).unsqueeze(1)};    // [T, 1, half] each
}

torch::Tensor apply_rotary(const torch::Tensor& x, const RotaryAngles& angles) {
  MOERL_CHECK(x.dim() == 3, "apply_rotary expects x as [T, heads, head_dim], got " + std::to_string(x.dim()) + " dims");
  const std::int64_t half = x.size(2) / 2;
  MOERL_CHECK(angles.cos.dim() == 3 && angles.cos.size(0) == x.size(0) && angles.cos.size(2) == half &&
                  angles.cos.scalar_type() == x.scalar_type(),
              "apply_rotary: the angles are not [T, 1, head_dim / 2] of x's dtype for x of " +
                  std::to_string(x.size(0)) + " tokens");
  if (row_kernel_applies({x, angles.cos, angles.sin})) {
    const torch::Tensor input = x.contiguous(), cos = angles.cos.contiguous(), sin = angles.sin.contiguous();
    torch::Tensor out = torch::empty_like(input);
    const std::int64_t heads = input.size(1), head_dim = input.size(2);
    for_row_ranges(input.size(0), heads * head_dim, [&](std::int64_t first, std::int64_t last) {
      kernels::rotary_rows_cpu(input.data_ptr<float>(), cos.data_ptr<float>(), sin.data_ptr<float>(),
                               out.data_ptr<float>(), heads, head_dim, first, last);
    });
    return out;
  }
  const torch::Tensor x1 = x.narrow(2, 0, half);
  const torch::Tensor x2 = x.narrow(2, half, half);
  return torch::cat({x1 * angles.cos - x2 * angles.sin, x2 * angles.cos + x1 * angles.sin}, /*dim=*/2);
}

torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& positions, double theta) {
  MOERL_CHECK(x.dim() == 3, "apply_rotary expects x as [T, heads, head_dim], got " + std::to_string(x.dim()) + " dims");
  MOERL_CHECK(positions.dim() == 1 && positions.size(0) == x.size(0),
              "apply_rotary: positions must be [T] with T = " + std::to_string(x.size(0)));
  return apply_rotary(x, rotary_angles(positions, x.size(2), theta, x.scalar_type()));
}

SwiGluFeedForwardImpl::SwiGluFeedForwardImpl(std::int64_t d_model, std::int64_t d_ff) {
  MOERL_CHECK(d_model > 0 && d_ff > 0,
              "SwiGLU sizes must be positive: d_model=" + std::to_string(d_model) + " d_ff=" + std::to_string(d_ff));
  gate_proj = register_module("gate_proj", torch::nn::Linear(torch::nn::LinearOptions(d_model, d_ff).bias(false)));
  up_proj = register_module("up_proj", torch::nn::Linear(torch::nn::LinearOptions(d_model, d_ff).bias(false)));
  down_proj = register_module("down_proj", torch::nn::Linear(torch::nn::LinearOptions(d_ff, d_model).bias(false)));
}

torch::Tensor SwiGluFeedForwardImpl::forward(const torch::Tensor& x) {
  return down_proj(torch::silu(gate_proj(x)) * up_proj(x));
}

}  // namespace moerl::model
