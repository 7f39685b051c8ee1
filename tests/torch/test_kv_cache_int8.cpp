// The int8 KV cache (model/kv_cache.h, rollout.kv_cache_dtype = "int8"):
// stored numbers within half a scale step, its bytes, pool growth that keeps
// what was stored, and decoding through it close to the float32 cache.

#include <catch2/catch.hpp>

#include "moerl/model/kv_cache.h"
#include "moerl/model/policy.h"

using moerl::model::KVCache;
using moerl::model::KVCacheDtype;
using moerl::model::PagedCacheOptions;
using moerl::model::Policy;
using moerl::model::SequenceId;

namespace {

moerl::config::ModelSection model_of(std::int64_t layers) {
  moerl::config::ModelSection m;
  m.vocab_size = 264;
  m.d_model = 48;
  m.num_layers = layers;
  m.num_heads = 4;
  m.num_kv_heads = 2;  // head_dim 12: not a power of two
  m.d_ff = 64;
  m.max_seq_len = 128;
  m.init_std = 0.1;
  return m;
}

KVCache cache_of(const moerl::config::ModelSection& m, KVCacheDtype dtype, std::int64_t initial_blocks) {
  PagedCacheOptions paged;
  paged.block_size = 4;
  paged.initial_blocks = initial_blocks;
  paged.dtype = dtype;
  return KVCache(m, torch::TensorOptions().dtype(torch::kFloat), paged);
}

// Writes positions [from, to) of keys/values [T, kvh, D] for one sequence.
void write_range(KVCache& cache, SequenceId id, std::int64_t layer, const torch::Tensor& k, const torch::Tensor& v,
                 std::int64_t from, std::int64_t to) {
  cache.prepare({id}, {to - from});
  const torch::Tensor slots = torch::full({to - from}, cache.slots_of({id})[0], torch::kLong);
  const torch::Tensor positions = torch::arange(from, to, torch::kLong);
  cache.write(layer, slots, positions, k.narrow(0, from, to - from), v.narrow(0, from, to - from));
  cache.advance({id}, {to - from});
}

}  // namespace

TEST_CASE("int8 KV entries come back within half a scale step of what was stored", "[kv_cache]") {
  const auto m = model_of(2);
  KVCache cache = cache_of(m, KVCacheDtype::Int8, 1);
  const SequenceId id = cache.add_sequence();
  torch::manual_seed(3);
  const std::int64_t T = 19, heads = m.num_kv_heads, D = m.d_model / m.num_heads;
  torch::Tensor k = torch::randn({T, heads, D}) * 3.0;
  torch::Tensor v = torch::randn({T, heads, D});
  k[5] = 0.0;         // an all-zero position stays zero
  v[7][1][3] = 40.0;  // an outlier coarsens its own vector only
  // Written in three pieces (a prefill, then decode steps): the pool grows
  // from 1 block to 8 along the way and must keep what it held.
  write_range(cache, id, 1, k, v, 0, 11);
  write_range(cache, id, 1, k, v, 11, 12);
  write_range(cache, id, 1, k, v, 12, T);
  const torch::Tensor slot = torch::tensor({cache.slots_of({id})[0]}, torch::kLong);
  const torch::Tensor k_back = cache.gather_keys(1, slot, T).squeeze(0);
  const torch::Tensor v_back = cache.gather_values(1, slot, T).squeeze(0);
  REQUIRE(k_back.sizes() == k.sizes());
  REQUIRE(k_back.scalar_type() == torch::kFloat);
  for (const auto& [stored, back] : {std::pair{k, k_back}, std::pair{v, v_back}}) {
    const torch::Tensor step = stored.abs().amax(-1, true) / 127.0;  // [T, kvh, 1]
    const torch::Tensor excess = (back - stored).abs() - step * 0.5 - 1e-6;
    CHECK(excess.max().item<double>() <= 0.0);
  }
  CHECK(k_back[5].abs().max().item<double>() == 0.0);
  // The outlier's own vector is coarse; the other head of that position is not.
  const double other_head = (v_back[7][0] - v[7][0]).abs().max().item<double>();
  CHECK(other_head <= v[7][0].abs().max().item<double>() / 254.0 + 1e-6);
  CHECK(cache.num_blocks() >= 5);
}

TEST_CASE("an int8 KV cache takes (head_dim + 4) / (4 head_dim) of the float32 bytes", "[kv_cache]") {
  const auto m = model_of(3);
  KVCache f32 = cache_of(m, KVCacheDtype::Float, 4);
  KVCache i8 = cache_of(m, KVCacheDtype::Int8, 4);
  const std::int64_t D = m.d_model / m.num_heads;
  // Per block: layers * block_size * kv_heads * (2 tensors) * (D bytes + one 4-byte scale).
  CHECK(i8.bytes_per_block() == 3 * 4 * 2 * 2 * (D + 4));
  CHECK(f32.bytes_per_block() == 3 * 4 * 2 * 2 * D * 4);
  CHECK(i8.memory_bytes() == 4 * i8.bytes_per_block());
  CHECK(i8.keys().scalar_type() == torch::kInt8);
  CHECK(i8.key_scales().sizes() == torch::IntArrayRef({3, 4, 4, 2}));
  CHECK(std::string(moerl::model::kv_cache_dtype_name(i8.dtype())) == "int8");
}

TEST_CASE("decoding through an int8 KV cache stays close to the float32 cache", "[kv_cache]") {
  torch::NoGradGuard no_grad;
  torch::manual_seed(11);
  const auto m = model_of(2);
  moerl::config::MoeSection moe;
  moe.enabled = true;
  moe.num_experts = 4;
  moe.top_k = 2;
  moe.d_expert = 16;
  Policy policy(m, moe);
  policy->eval();
  const std::int64_t rows = 3, length = 40;
  const torch::Tensor tokens = torch::randint(256, {rows, length}, torch::kLong);
  const auto full = policy->forward(tokens);
  const torch::Tensor reference = full.unpack(full.logits).log_softmax(-1);  // [rows, length, vocab]
  for (KVCacheDtype dtype : {KVCacheDtype::Float, KVCacheDtype::Int8}) {
    KVCache cache = cache_of(m, dtype, 1);
    std::vector<SequenceId> ids;
    for (std::int64_t r = 0; r < rows; ++r) ids.push_back(cache.add_sequence());
    auto out = policy->forward_cached(tokens.narrow(1, 0, 8), torch::Tensor(), cache, ids);
    std::vector<torch::Tensor> steps = {out.unpack(out.logits).log_softmax(-1)};
    for (std::int64_t t = 8; t < length; ++t) {
      out = policy->forward_cached(tokens.narrow(1, t, 1), torch::Tensor(), cache, ids);
      steps.push_back(out.unpack(out.logits).log_softmax(-1));
    }
    const torch::Tensor cached = torch::cat(steps, 1);
    const double gap = (cached - reference).abs().max().item<double>();
    INFO(moerl::model::kv_cache_dtype_name(dtype) << ": max |log-prob gap| " << gap);
    if (dtype == KVCacheDtype::Float) {
      CHECK(gap < 1e-4);
    } else {
      CHECK(gap > 1e-6);  // it does quantise...
      CHECK(gap < 0.05);  // ...by a few hundredths of a nat at most on this model
    }
  }
}
