// RMSNorm, rotary embedding and KV-cache bookkeeping.

#include <catch2/catch.hpp>

#include <functional>

#include "moerl/model/attention.h"
#include "moerl/model/kv_cache.h"
#include "moerl/model/rms_norm.h"
#include "moerl/model/rotary.h"

namespace {

using TensorFn = std::function<torch::Tensor(const torch::Tensor&)>;

// Central-difference gradient check of L = sum(f(x) * w) for a fixed random w,
// in double. Returns the largest |analytic - numeric| over all elements of x.
double max_gradient_error(const TensorFn& f, torch::Tensor x, double h = 1e-6) {
  x = x.detach().clone().set_requires_grad(true);
  torch::Tensor w = torch::randn_like(f(x).detach());
  torch::Tensor loss = (f(x) * w).sum();
  loss.backward();
  const torch::Tensor analytic = x.grad().clone();
  torch::NoGradGuard no_grad;
  torch::Tensor flat = x.detach().view({-1});
  torch::Tensor numeric = torch::zeros_like(flat);
  for (std::int64_t i = 0; i < flat.size(0); ++i) {
    const double orig = flat[i].item<double>();
    flat[i] = orig + h;
    const double plus = (f(x.detach()) * w).sum().item<double>();
    flat[i] = orig - h;
    const double minus = (f(x.detach()) * w).sum().item<double>();
    flat[i] = orig;
    numeric[i] = (plus - minus) / (2 * h);
  }
  return (analytic.view({-1}) - numeric).abs().max().item<double>();
}

}  // namespace

TEST_CASE("RMSNorm gradients match central differences in double", "[model][layers]") {
  torch::manual_seed(1);
  moerl::model::RMSNorm norm(7, 1e-6);
  norm->to(torch::kDouble);
  {
    torch::NoGradGuard g;
    norm->weight.normal_(1.0, 0.3);
  }
  const torch::Tensor x = torch::randn({3, 7}, torch::kDouble);
  const double err_x = max_gradient_error([&](const torch::Tensor& in) { return norm(in); }, x);
  INFO("max |analytic - numeric| for dL/dx = " << err_x);
  CHECK(err_x < 1e-7);

  // dL/dweight: treat the weight as the input.
  const torch::Tensor w0 = norm->weight.detach().clone();
  const double err_w = max_gradient_error(
      [&](const torch::Tensor& w) {
        torch::Tensor saved = norm->weight;
        norm->weight = w;  // forward reads the member
        torch::Tensor y = norm(x);
        norm->weight = saved;
        return y;
      },
      w0);
  INFO("max |analytic - numeric| for dL/dweight = " << err_w);
  CHECK(err_w < 1e-7);

  // Value: unit weight gives rows of unit RMS.
  moerl::model::RMSNorm plain(7, 0.0);
  plain->to(torch::kDouble);
  const torch::Tensor rms = plain(x).pow(2).mean(-1).sqrt();
  CHECK(torch::allclose(rms, torch::ones({3}, torch::kDouble), 1e-12, 1e-12));
}

TEST_CASE("rotary embedding: gradients, norm preservation, relative positions", "[model][layers]") {
  torch::manual_seed(2);
  const double theta = 10000.0;
  const torch::Tensor positions = torch::tensor({0, 3, 17, 250}, torch::kLong);
  const torch::Tensor x = torch::randn({4, 3, 8}, torch::kDouble);

  const double err =
      max_gradient_error([&](const torch::Tensor& in) { return moerl::model::apply_rotary(in, positions, theta); }, x);
  INFO("max |analytic - numeric| for rotary dL/dx = " << err);
  CHECK(err < 1e-7);

  // A rotation keeps each head vector's norm; position 0 is the identity.
  const torch::Tensor y = moerl::model::apply_rotary(x, positions, theta);
  CHECK(torch::allclose(y.norm(2, -1), x.norm(2, -1), 1e-12, 1e-12));
  CHECK(torch::allclose(y[0], x[0], 0, 0));

  // <rope(q, m), rope(k, n)> depends only on m - n.
  const torch::Tensor q = torch::randn({1, 1, 8}, torch::kDouble);
  const torch::Tensor k = torch::randn({1, 1, 8}, torch::kDouble);
  auto dot = [&](std::int64_t m, std::int64_t n) {
    const auto qm = moerl::model::apply_rotary(q, torch::tensor({m}, torch::kLong), theta);
    const auto kn = moerl::model::apply_rotary(k, torch::tensor({n}, torch::kLong), theta);
    return (qm * kn).sum().item<double>();
  };
  const double a = dot(5, 2), b = dot(105, 102), c = dot(9, 2);
  INFO("dot(5,2)=" << a << " dot(105,102)=" << b << " dot(9,2)=" << c);
  CHECK(std::abs(a - b) < 1e-10);
  CHECK(std::abs(a - c) > 1e-6);

  // Rotate-half layout: channel i pairs with i + head_dim/2 at angle pos * theta^(-2i/D).
  const torch::Tensor e0 = torch::zeros({1, 1, 8}, torch::kDouble);
  e0[0][0][1] = 1.0;  // channel 1
  const auto r = moerl::model::apply_rotary(e0, torch::tensor({3}, torch::kLong), theta);
  const double angle = 3.0 * std::pow(theta, -2.0 / 8.0);
  CHECK(r[0][0][1].item<double>() == Approx(std::cos(angle)).epsilon(1e-12));
  CHECK(r[0][0][5].item<double>() == Approx(std::sin(angle)).epsilon(1e-12));
}

TEST_CASE("rotary angles computed once per batch rotate as the one-shot call does", "[model][layers]") {
  const double theta = 10000.0;
  const auto batch = moerl::model::AttentionBatch::make({3, 1}, {0, 5}, {}, 3, torch::kCPU);
  const torch::Tensor x = torch::randn({4, 2, 8}, torch::kDouble);
  const auto& angles = batch.rotary_for(8, theta, torch::kDouble);
  CHECK(torch::equal(moerl::model::apply_rotary(x, angles), moerl::model::apply_rotary(x, batch.positions, theta)));
  // A second layer asking for the same sizes gets the same tensors, not new ones.
  CHECK(batch.rotary_for(8, theta, torch::kDouble).cos.is_same(angles.cos));
  // Other sizes or dtypes are computed afresh.
  const auto& wider = batch.rotary_for(16, theta, torch::kFloat);
  CHECK(wider.cos.size(2) == 8);
  CHECK(wider.cos.scalar_type() == torch::kFloat);
  // Angles that do not fit x are refused with the reason.
  CHECK_THROWS_WITH(moerl::model::apply_rotary(x, wider), Catch::Contains("head_dim / 2"));
}

TEST_CASE("RMSNorm and rotary without gradient (the row kernels) agree with their tensor-op forms", "[model][layers]") {
  // Without gradient, float32 CPU inputs take the row kernels
  // (moerl_kernels/row_ops.h), split across threads; with gradient, the
  // tensor-op chain. Both against the chain in double. Sizes are off the
  // kernels' 16-float vectors and span several row ranges.
  torch::manual_seed(11);
  const std::int64_t rows = 300, dim = 200;
  moerl::model::RMSNorm norm(dim, 1e-5);
  {
    torch::NoGradGuard no_grad;
    norm->weight.copy_(torch::randn({dim}).mul(0.5).add(1.0));
  }
  const torch::Tensor x = torch::randn({rows, dim}).mul(3.0);
  const torch::Tensor reference = [&] {
    const torch::Tensor xd = x.to(torch::kDouble);
    return xd * torch::rsqrt(xd.pow(2).mean(-1, true) + 1e-5) * norm->weight.detach().to(torch::kDouble);
  }();
  torch::Tensor kernel;
  {
    torch::NoGradGuard no_grad;
    kernel = norm(x);
  }
  const torch::Tensor chain = norm(x).detach();  // the weight wants a gradient here
  const double scale = reference.abs().max().item<double>();
  CHECK((kernel.to(torch::kDouble) - reference).abs().max().item<double>() < 2e-6 * scale);
  CHECK((chain.to(torch::kDouble) - reference).abs().max().item<double>() < 2e-6 * scale);

  const std::int64_t heads = 3, head_dim = 38;
  const torch::Tensor positions = torch::randint(0, 5000, {rows}, torch::kLong);
  const torch::Tensor q = torch::randn({rows, heads, head_dim});
  const auto angles = moerl::model::rotary_angles(positions, head_dim, 10000.0, torch::kFloat);
  const auto angles_double = moerl::model::rotary_angles(positions, head_dim, 10000.0, torch::kDouble);
  const torch::Tensor rotated_reference = moerl::model::apply_rotary(q.to(torch::kDouble), angles_double);
  torch::Tensor rotated_kernel;
  {
    torch::NoGradGuard no_grad;
    rotated_kernel = moerl::model::apply_rotary(q, angles);
  }
  const torch::Tensor rotated_chain = moerl::model::apply_rotary(q.clone().set_requires_grad(true), angles).detach();
  CHECK((rotated_kernel.to(torch::kDouble) - rotated_reference).abs().max().item<double>() < 1e-5);
  CHECK((rotated_chain.to(torch::kDouble) - rotated_reference).abs().max().item<double>() < 1e-5);
  CHECK((rotated_kernel - rotated_chain).abs().max().item<float>() < 1e-5f);
}

TEST_CASE("KV cache bookkeeping: add, grow, remove, reuse", "[model][kvcache]") {
  moerl::config::ModelSection model;
  model.num_layers = 2;
  model.d_model = 16;
  model.num_heads = 4;
  model.num_kv_heads = 2;
  model.max_seq_len = 40;
  moerl::model::KVCache cache(model, torch::TensorOptions().dtype(torch::kDouble), 1, 8);
  CHECK(cache.num_slots() == 1);
  const auto a = cache.add_sequence();
  const auto b = cache.add_sequence();  // grows the slots
  CHECK(cache.num_slots() >= 2);
  CHECK(cache.num_sequences() == 2);
  CHECK(cache.length(a) == 0);
  cache.reserve(20);
  CHECK(cache.capacity() >= 20);
  CHECK_THROWS(cache.reserve(41));
  cache.advance({a, b}, {3, 5});
  CHECK(cache.length(a) == 3);
  CHECK(cache.length(b) == 5);
  CHECK_THROWS(cache.slots_of({a, a}));
  const auto slot_a = cache.slots_of({a})[0];
  cache.remove_sequence(a);
  CHECK_FALSE(cache.contains(a));
  CHECK_THROWS(cache.length(a));
  CHECK_THROWS(cache.remove_sequence(a));
  const auto c = cache.add_sequence();
  CHECK(c != a);                            // ids are never reused
  CHECK(cache.slots_of({c})[0] == slot_a);  // slots are
  CHECK(cache.length(c) == 0);
  CHECK(cache.sequences() == std::vector<moerl::model::SequenceId>{b, c});
  // The stored tensor shape: [layers, slots, capacity, kv_heads, head_dim].
  CHECK(cache.keys().size(0) == 2);
  CHECK(cache.keys().size(3) == 2);
  CHECK(cache.keys().size(4) == 4);
  // A write past the block table names the slot and the position.
  const auto kv = torch::ones({1, 2, 4}, torch::kDouble);
  CHECK_THROWS_WITH(cache.write(0, torch::tensor({std::int64_t{0}}), torch::tensor({cache.capacity()}), kv, kv),
                    Catch::Contains("slot 0, position " + std::to_string(cache.capacity())));
}
