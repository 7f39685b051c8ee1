// Swap-mode weight sync on a real model: module_rebind() re-points every
// parameter into a flat buffer; the model then computes with those bytes
// (its own members included), and a buffer the parameters left is no longer
// held, so a WeightReceiver may land the next version in it.
#include <catch2/catch.hpp>

#include <cstring>

#include "moerl/model/policy.h"
#include "moerl/sync/module_weights.h"

using namespace moerl;

namespace {

model::Policy tiny_policy(std::uint64_t seed) {
  torch::manual_seed(seed);
  config::ModelSection m;
  m.vocab_size = 264;
  m.d_model = 32;
  m.num_layers = 2;
  m.num_heads = 4;
  m.num_kv_heads = 2;
  m.d_ff = 48;
  m.max_seq_len = 64;
  m.init_std = 0.1;
  config::MoeSection e;
  e.enabled = true;
  e.num_experts = 4;
  e.top_k = 2;
  e.d_expert = 16;
  model::Policy policy(m, e);
  policy->eval();
  return policy;
}

sync::FlatWeights flatten(model::PolicyImpl& policy) {
  size_t total = 0;
  for (const auto& v : sync::module_weight_views(policy)) total += v.bytes;
  auto flat = std::make_shared<PageAlignedBytes>(total);
  size_t at = 0;
  for (const auto& v : sync::module_weight_views(policy)) {
    std::memcpy(flat->data() + at, v.data, v.bytes);
    at += v.bytes;
  }
  return flat;
}

torch::Tensor logits_of(model::Policy& policy) {
  torch::NoGradGuard no_grad;
  const torch::Tensor tokens = torch::arange(3, 40, torch::kLong).remainder(264).view({1, -1});
  return policy(tokens).logits;
}

}  // namespace

TEST_CASE("a model re-pointed into flat weights computes with exactly those bytes", "[sync]") {
  model::Policy policy = tiny_policy(1), other = tiny_policy(2);
  const torch::Tensor own_logits = logits_of(policy), other_logits = logits_of(other);
  REQUIRE_FALSE(torch::equal(own_logits, other_logits));
  const sync::Rebind rebind = sync::module_rebind(*policy);

  // Its own bytes, moved into a flat buffer: the same model.
  sync::FlatWeights first = flatten(*policy);
  rebind(first);
  const auto* base = first->data();
  for (const auto& v : sync::module_weight_views(*policy)) {
    CHECK(static_cast<const std::uint8_t*>(v.data) >= base);
    CHECK(static_cast<const std::uint8_t*>(v.data) + v.bytes <= base + first->size());
  }
  CHECK(torch::equal(logits_of(policy), own_logits));
  CHECK(first.use_count() > 1);  // the parameters hold it

  // Another model's bytes: computes as that model, members and all.
  sync::FlatWeights second = flatten(*other);
  rebind(second);
  CHECK(torch::equal(logits_of(policy), other_logits));
  CHECK(first.use_count() == 1);  // nothing holds the old buffer: it can take the next version
  for (const auto& p : policy->parameters()) CHECK(p.requires_grad());

  // The flat layout must match the module's.
  auto short_buffer = std::make_shared<PageAlignedBytes>(second->size() - 4);
  CHECK_THROWS_WITH(rebind(short_buffer), Catch::Contains("smaller than the module's parameters"));
}
