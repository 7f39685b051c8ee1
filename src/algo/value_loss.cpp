// Clipped value loss (see value_loss.h).

#include "moerl/algo/value_loss.h"

#include <string>
#include <vector>

#include "moerl/core/check.h"

namespace moerl::algo {

ValueLossResult value_loss(const torch::Tensor& values, const torch::Tensor& old_values, const torch::Tensor& returns,
                           const ValueLossOptions& options, const torch::Tensor& mask) {
  MOERL_CHECK(values.dim() == 1 && values.is_floating_point(), "value_loss: values must be a floating [K] tensor");
  const auto k = values.size(0);
  MOERL_CHECK(old_values.dim() == 1 && old_values.size(0) == k,
              "value_loss: old_values must be [K] with K = " + std::to_string(k));
  MOERL_CHECK(returns.dim() == 1 && returns.size(0) == k,
              "value_loss: returns must be [K] with K = " + std::to_string(k));
  MOERL_CHECK(!mask.defined() || (mask.dim() == 1 && mask.size(0) == k),
              "value_loss: mask must be [K] with K = " + std::to_string(k));
  const auto dtype = values.scalar_type();
  auto keep = mask.defined() ? mask.ne(0) : torch::ones({k}, values.options().dtype(torch::kBool));
  auto zero = torch::zeros_like(values);
  // Masked entries become 0 before any arithmetic: finite forward, zero gradient.
  auto v = torch::where(keep, values, zero);
  auto v_old = torch::where(keep, old_values.detach().to(dtype), zero);
  auto ret = torch::where(keep, returns.detach().to(dtype), zero);

  auto unclipped = (v - ret).pow(2);
  torch::Tensor per_elem = unclipped;
  torch::Tensor clip_used = torch::zeros_like(keep);
  if (options.clip > 0) {
    auto v_clip = v_old + (v - v_old).clamp(-options.clip, options.clip);
    auto clipped = (v_clip - ret).pow(2);
    per_elem = torch::max(unclipped, clipped);
    clip_used = clipped > unclipped;
  }
  auto keep_f = keep.to(dtype);
  auto count = keep_f.sum();
  ValueLossResult result;
  result.loss = 0.5 * (per_elem * keep_f).sum() / count.clamp_min(1.0);
  {
    torch::NoGradGuard no_grad;
    auto kd = keep.to(torch::kDouble);
    auto cnt = kd.sum().clamp_min(1.0);
    auto vd = v.detach().to(torch::kDouble);
    auto rd = ret.to(torch::kDouble);
    auto masked_var = [&](const torch::Tensor& x) {
      auto mean = (x * kd).sum() / cnt;
      return ((x - mean).pow(2) * kd).sum() / cnt;
    };
    auto var_r = masked_var(rd);
    auto ev = torch::where(var_r > 0, 1.0 - masked_var(rd - vd) / var_r.clamp_min(1e-300), torch::zeros_like(var_r));
    std::vector<torch::Tensor> stats = {(clip_used.to(torch::kDouble) * kd).sum() / cnt, (vd * kd).sum() / cnt, ev,
                                        kd.sum()};
    auto host = torch::stack(stats).to(torch::kCPU).contiguous();
    const auto* h = host.data_ptr<double>();
    result.clip_fraction = h[0];
    result.value_mean = h[1];
    result.explained_variance = h[2];
    result.count = static_cast<std::int64_t>(h[3] + 0.5);
  }
  return result;
}

}  // namespace moerl::algo
