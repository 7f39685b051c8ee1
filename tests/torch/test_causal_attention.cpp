// The fused CPU attention (model/causal_attention.h) against a plain
// per-sequence reference: values and gradients, in double and float, at odd
// lengths around the kernel's 64-query blocks, with grouped kv heads and a
// sliding window; and the cached variant, fed a paged KV cache chunk by
// chunk as the rollout engine feeds it, against the same reference.

#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <vector>

#include "moerl/model/causal_attention.h"
#include "moerl/model/kv_cache.h"

namespace {

using namespace moerl;

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

// Feeds sequences step by step (steps[s][b]: tokens of sequence b in step s)
// through a paged cache with blocks of 4 positions, so that keys come from
// several pool blocks that are not in order, and returns the largest
// difference from the whole-sequence reference computed in double.
double paged_difference(const std::vector<std::vector<std::int64_t>>& steps, std::int64_t heads, std::int64_t kv_heads,
                        std::int64_t head_dim, torch::ScalarType dtype, std::int64_t window) {
  const double scale = 0.4;
  const std::size_t sequences = steps.front().size();
  std::vector<std::int64_t> totals(sequences, 0);
  for (const auto& step : steps)
    for (std::size_t b = 0; b < sequences; ++b) totals[b] += step[b];
  const std::int64_t tokens = std::accumulate(totals.begin(), totals.end(), std::int64_t{0});
  const Inputs in = random_inputs(tokens, heads, kv_heads, head_dim, dtype);
  torch::NoGradGuard no_grad;
  const torch::Tensor expected = reference_attention(in.q.to(torch::kDouble), in.k.to(torch::kDouble),
                                                     in.v.to(torch::kDouble), totals, window, scale);
  config::ModelSection model;
  model.num_layers = 1;
  model.num_heads = heads;
  model.num_kv_heads = kv_heads;
  model.head_dim = head_dim;
  model.d_model = heads * head_dim;
  model.max_seq_len = 128;
  model::PagedCacheOptions paged;
  paged.block_size = 4;
  model::KVCache cache(model, torch::TensorOptions().dtype(dtype), paged);
  std::vector<model::SequenceId> ids;
  for (std::size_t b = 0; b < sequences; ++b) ids.push_back(cache.add_sequence());
  std::vector<std::int64_t> first_token(sequences, 0);  // of each sequence in the packed inputs
  for (std::size_t b = 1; b < sequences; ++b) first_token[b] = first_token[b - 1] + totals[b - 1];
  std::vector<std::int64_t> done(sequences, 0);
  double worst = 0;
  for (const auto& lengths : steps) {
    std::vector<std::int64_t> rows, positions, token_slots;
    const auto slots = cache.slots_of(ids);
    for (std::size_t b = 0; b < sequences; ++b)
      for (std::int64_t i = 0; i < lengths[b]; ++i) {
        rows.push_back(first_token[b] + done[b] + i);
        positions.push_back(done[b] + i);
        token_slots.push_back(slots[b]);
      }
    const auto index = torch::tensor(rows);
    cache.prepare(ids, lengths);
    cache.write(0, torch::tensor(token_slots), torch::tensor(positions), in.k.index_select(0, index),
                in.v.index_select(0, index));
    const torch::Tensor q = in.q.index_select(0, index);
    REQUIRE(model::fused_cached_attention_supported(q, cache));
    const torch::Tensor out = model::fused_cached_attention(q, cache, 0, slots, lengths, done, window, scale);
    worst = std::max(worst, max_difference(out, expected.index_select(0, index)));
    cache.advance(ids, lengths);
    for (std::size_t b = 0; b < sequences; ++b) done[b] += lengths[b];
  }
  return worst;
}

TEST_CASE("fused attention over a paged KV cache equals the whole-sequence reference, chunk by chunk",
          "[model][attention][kvcache]") {
  // A prefill, a second chunk, then a step of one decode token each (the
  // decode path, every kv head of a sequence at once); mixed steps take a
  // decode token through the per-kv-head path.
  const std::vector<std::vector<std::int64_t>> steps{{5, 9, 2}, {3, 1, 6}, {1, 1, 1}};
  for (std::int64_t window : {0, 4}) {
    CAPTURE(window);
    CHECK(paged_difference(steps, 4, 2, 6, torch::kDouble, window) < 1e-12);
  }
}

TEST_CASE("decoding from a paged KV cache in float stays within float rounding of the double reference",
          "[model][attention][kvcache]") {
  // Head sizes below, at and past the 16-float vector of the decode kernel,
  // and 40 decode steps, so that every sequence reads many pool blocks.
  std::vector<std::vector<std::int64_t>> steps{{7, 1, 12}};
  for (int i = 0; i < 40; ++i) steps.push_back({1, 1, 1});
  for (std::int64_t head_dim : {6, 32, 40}) {
    for (std::int64_t window : {0, 9}) {
      CAPTURE(head_dim, window);
      CHECK(paged_difference(steps, 6, 2, head_dim, torch::kFloat, window) < 2e-5);
    }
  }
}
