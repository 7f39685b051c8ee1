// The fused CPU attention (model/causal_attention.h) against a plain
// per-sequence reference: values and gradients, in double and float, at odd
// lengths around the kernel's 64-query blocks, with grouped kv heads and a
// sliding window; and a Policy's forward against its KV-cache path.

#include <catch2/catch.hpp>

#include <vector>

#include "moerl/model/causal_attention.h"

namespace {

// softmax(scale q k^T + causal/window mask) v, one sequence at a time.
torch::Tensor reference_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                  const std::vector<std::int64_t>& lengths, std::int64_t window, double scale) {
  const std::int64_t heads = q.size(1), group = heads / k.size(1);
  std::vector<torch::Tensor> outputs;
  std::int64_t first = 0;
  for (std::int64_t n : lengths) {
    auto qs = q.narrow(0, first, n).transpose(0, 1);                              // [H, n, D]
    auto ks = k.narrow(0, first, n).repeat_interleave(group, 1).transpose(0, 1);  // [H, n, D]
    auto vs = v.narrow(0, first, n).repeat_interleave(group, 1).transpose(0, 1);  // [H, n, D]
    auto i = torch::arange(n).unsqueeze(1), j = torch::arange(n).unsqueeze(0);
    auto allowed = j.le(i);
    if (window > 0) allowed = allowed & j.gt(i - window);
    auto scores = torch::matmul(qs, ks.transpose(1, 2)).mul(scale).masked_fill(allowed.logical_not(), -1e300);
    outputs.push_back(torch::matmul(torch::softmax(scores, -1), vs).transpose(0, 1));  // [n, H, D]
    first += n;
  }
  return torch::cat(outputs, 0);
}

struct Inputs {
  torch::Tensor q, k, v;
};

Inputs random_inputs(std::int64_t tokens, std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim,
                     torch::ScalarType dtype) {
  torch::manual_seed(7);
  auto make = [&](std::int64_t h) {
    return torch::randn({tokens, h, head_dim}, torch::kDouble).mul(1.5).to(dtype).set_requires_grad(true);
  };
  return {make(heads), make(kv_heads), make(kv_heads)};
}

struct Gradients {
  torch::Tensor out, dq, dk, dv;
};

template <typename Fn>
Gradients run(const Inputs& in, const torch::Tensor& weight, Fn&& attention) {
  for (auto t : {in.q, in.k, in.v})
    if (t.grad().defined()) t.mutable_grad().zero_();
  auto out = attention(in.q, in.k, in.v);
  (out * weight).sum().backward();
  return {out.detach().clone(), in.q.grad().clone(), in.k.grad().clone(), in.v.grad().clone()};
}

double max_difference(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

}  // namespace

TEST_CASE("fused causal attention equals the per-sequence reference, values and gradients", "[model][attention]") {
  const std::vector<std::int64_t> lengths{1, 19, 64, 65, 99, 130, 2};
  std::int64_t tokens = 0;
  for (auto n : lengths) tokens += n;
  const double scale = 0.29;
  for (std::int64_t window : {0, 7, 70}) {
    for (auto [heads, kv_heads] : {std::pair<std::int64_t, std::int64_t>{4, 2}, {3, 3}, {6, 1}}) {
      CAPTURE(window, heads, kv_heads);
      const Inputs in = random_inputs(tokens, heads, kv_heads, 10, torch::kDouble);
      const torch::Tensor weight = torch::randn({tokens, heads, 10}, torch::kDouble);
      const Gradients fused = run(in, weight, [&](auto& q, auto& k, auto& v) {
        return moerl::model::fused_causal_attention(q, k, v, lengths, window, scale);
      });
      const Gradients reference = run(
          in, weight, [&](auto& q, auto& k, auto& v) { return reference_attention(q, k, v, lengths, window, scale); });
      CHECK(max_difference(fused.out, reference.out) < 1e-12);
      CHECK(max_difference(fused.dq, reference.dq) < 1e-11);
      CHECK(max_difference(fused.dk, reference.dk) < 1e-11);
      CHECK(max_difference(fused.dv, reference.dv) < 1e-11);
    }
  }
}

TEST_CASE("fused causal attention in float stays within float rounding of double", "[model][attention]") {
  const std::vector<std::int64_t> lengths{3, 200, 64, 127};
  std::int64_t tokens = 0;
  for (auto n : lengths) tokens += n;
  const Inputs exact = random_inputs(tokens, 4, 2, 32, torch::kDouble);
  const Inputs single = random_inputs(tokens, 4, 2, 32, torch::kFloat);
  const torch::Tensor weight = torch::randn({tokens, 4, 32}, torch::kDouble);
  auto fused = [&](auto& q, auto& k, auto& v) {
    return moerl::model::fused_causal_attention(q, k, v, lengths, 0, 0.18);
  };
  const Gradients d = run(exact, weight, fused);
  const Gradients f = run(single, weight.to(torch::kFloat), fused);
  // Scale of the values compared: outputs about 1, gradients up to a few.
  CHECK(max_difference(f.out, d.out) < 2e-5);
  CHECK(max_difference(f.dq, d.dq) < 1e-4);
  CHECK(max_difference(f.dk, d.dk) < 1e-4);
  CHECK(max_difference(f.dv, d.dv) < 1e-4);
}

TEST_CASE("fused causal attention refuses what it cannot take, naming it", "[model][attention]") {
  const auto q = torch::randn({5, 2, 4}), kv = torch::randn({5, 1, 4});
  CHECK_THROWS_WITH(moerl::model::fused_causal_attention(q, kv, kv, {2, 2}, 0, 1.0),
                    Catch::Contains("lengths sum to 4, q has 5 tokens"));
  CHECK_THROWS_WITH(moerl::model::fused_causal_attention(q, kv, kv, {5, 0}, 0, 1.0),
                    Catch::Contains("at least one token"));
  CHECK_THROWS_WITH(moerl::model::fused_causal_attention(q.to(torch::kInt), kv, kv, {5}, 0, 1.0),
                    Catch::Contains("float or double"));
  CHECK_FALSE(moerl::model::fused_causal_attention_supported(q.to(torch::kBFloat16)));
}
