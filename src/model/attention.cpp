#include "moerl/model/attention.h"

#include <algorithm>
#include <limits>

#include "moerl/core/check.h"
#include "moerl/model/causal_attention.h"
#include "moerl/model/kv_cache.h"
#include "moerl/model/rotary.h"

namespace moerl::model {
namespace {

// A host vector of indices as an int64 tensor on device.
torch::Tensor index_tensor(const std::vector<std::int64_t>& values, const torch::Device& device) {
  return torch::tensor(values, torch::TensorOptions().dtype(torch::kLong)).to(device);
}

}  // namespace

AttentionBatch AttentionBatch::make(const std::vector<std::int64_t>& lengths, const std::vector<std::int64_t>& past,
                                    const std::vector<std::int64_t>& slots, std::int64_t max_new,
                                    const torch::Device& device, std::int64_t sliding_window) {
  const auto rows = static_cast<std::int64_t>(lengths.size());
  MOERL_CHECK(rows > 0, "AttentionBatch: empty batch");
  MOERL_CHECK(static_cast<std::int64_t>(past.size()) == rows,
              "AttentionBatch: past lengths and lengths differ in size");
  MOERL_CHECK(slots.empty() || static_cast<std::int64_t>(slots.size()) == rows,
              "AttentionBatch: cache slots and lengths differ in size");
  AttentionBatch batch;
  batch.batch = rows;
  batch.max_new = max_new;
  batch.row_lengths = lengths;
  batch.row_past = past;
  batch.row_slots = slots;
  batch.any_past = std::any_of(past.begin(), past.end(), [](std::int64_t p) { return p != 0; });
  batch.sliding_window = sliding_window;
  std::vector<std::int64_t> token_index, token_row, positions, token_slots, last_token;
  for (std::int64_t b = 0; b < rows; ++b) {
    const std::int64_t len = lengths[static_cast<std::size_t>(b)];
    const std::int64_t p0 = past[static_cast<std::size_t>(b)];
    MOERL_CHECK(len >= 1 && len <= max_new, "row " + std::to_string(b) + " has length " + std::to_string(len) +
                                                "; every row needs between 1 and " + std::to_string(max_new) +
                                                " tokens");
    batch.max_total = std::max(batch.max_total, p0 + len);
    for (std::int64_t i = 0; i < len; ++i) {
      token_index.push_back(b * max_new + i);
      token_row.push_back(b);
      positions.push_back(p0 + i);
      if (!slots.empty()) token_slots.push_back(slots[static_cast<std::size_t>(b)]);
    }
    last_token.push_back(static_cast<std::int64_t>(token_index.size()) - 1);
  }
  batch.tokens = static_cast<std::int64_t>(token_index.size());
  batch.token_index = index_tensor(token_index, device);
  batch.token_row = index_tensor(token_row, device);
  batch.positions = index_tensor(positions, device);
  batch.last_token = index_tensor(last_token, device);
  if (!slots.empty()) {
    batch.cache_slots = index_tensor(slots, device);
    batch.token_slots = index_tensor(token_slots, device);
  }
  return batch;
}

const torch::Tensor& AttentionBatch::allowed() const {
  if (allowed_.defined()) return allowed_;
  const torch::Device device = positions.device();
  const auto i64 = torch::TensorOptions().dtype(torch::kLong);
  // allowed[b, i, j] = j <= past[b] + i  &&  j < past[b] + lengths[b]
  const torch::Tensor past_t = index_tensor(row_past, device);               // [B]
  const torch::Tensor total_t = past_t + index_tensor(row_lengths, device);  // [B]
  const torch::Tensor query_pos =
      past_t.unsqueeze(1) + torch::arange(max_new, i64.device(device)).unsqueeze(0);  // [B, S]
  const torch::Tensor key_pos = torch::arange(max_total, i64.device(device));         // [L]
  torch::Tensor mask =
      key_pos.view({1, 1, -1}).le(query_pos.unsqueeze(2)) & key_pos.view({1, 1, -1}).lt(total_t.view({-1, 1, 1}));
  if (sliding_window > 0) mask = mask & key_pos.view({1, 1, -1}).gt(query_pos.unsqueeze(2) - sliding_window);
  allowed_ = mask.view({batch, 1, 1, max_new, max_total});
  return allowed_;
}

const RotaryAngles& AttentionBatch::rotary_for(std::int64_t head_dim, double theta, torch::ScalarType dtype) const {
  if (!rotary_.cos.defined() || head_dim != rotary_head_dim_ || theta != rotary_theta_ || dtype != rotary_dtype_) {
    rotary_ = rotary_angles(positions, head_dim, theta, dtype);
    rotary_head_dim_ = head_dim;
    rotary_theta_ = theta;
    rotary_dtype_ = dtype;
  }
  return rotary_;
}

AttentionImpl::AttentionImpl(const config::ModelSection& model)
    : num_heads(model.num_heads),
      num_kv_heads(model.num_kv_heads),
      rope_theta(model.rope_theta),
      qk_norm_mode(model.qk_norm) {
  MOERL_CHECK(num_heads > 0 && (model.head_dim > 0 || model.d_model % num_heads == 0),
              "model.d_model (" + std::to_string(model.d_model) + ") must be a multiple of model.num_heads (" +
                  std::to_string(num_heads) + ") unless model.head_dim is set");
  MOERL_CHECK(num_kv_heads > 0 && num_heads % num_kv_heads == 0, "model.num_kv_heads (" + std::to_string(num_kv_heads) +
                                                                     ") must divide model.num_heads (" +
                                                                     std::to_string(num_heads) + ")");
  head_dim = attention_head_dim(model);
  MOERL_CHECK(head_dim % 2 == 0,
              "the attention head size must be even for rotary embedding, got " + std::to_string(head_dim));
  auto linear = [](std::int64_t in, std::int64_t out, bool bias) {
    return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
  };
  q_proj = register_module("q_proj", linear(model.d_model, num_heads * head_dim, model.qkv_bias));
  k_proj = register_module("k_proj", linear(model.d_model, num_kv_heads * head_dim, model.qkv_bias));
  v_proj = register_module("v_proj", linear(model.d_model, num_kv_heads * head_dim, model.qkv_bias));
  o_proj = register_module("o_proj", linear(num_heads * head_dim, model.d_model, model.o_bias));
  if (qk_norm_mode == config::QkNorm::PerHead) {
    q_norm = register_module("q_norm", RMSNorm(head_dim, model.norm_eps));
    k_norm = register_module("k_norm", RMSNorm(head_dim, model.norm_eps));
  } else if (qk_norm_mode == config::QkNorm::Full) {
    q_norm = register_module("q_norm", RMSNorm(num_heads * head_dim, model.norm_eps));
    k_norm = register_module("k_norm", RMSNorm(num_kv_heads * head_dim, model.norm_eps));
  }
}

torch::Tensor AttentionImpl::project_query(const torch::Tensor& x) {
  const std::int64_t T = x.size(0);
  torch::Tensor q = q_proj(x);  // [T, H*D]
  if (qk_norm_mode == config::QkNorm::Full) q = q_norm(q);
  q = q.view({T, num_heads, head_dim});
  if (qk_norm_mode == config::QkNorm::PerHead) q = q_norm(q);
  return q;
}

torch::Tensor AttentionImpl::project_key(const torch::Tensor& x) {
  const std::int64_t T = x.size(0);
  torch::Tensor k = k_proj(x);  // [T, kvH*D]
  if (qk_norm_mode == config::QkNorm::Full) k = k_norm(k);
  k = k.view({T, num_kv_heads, head_dim});
  if (qk_norm_mode == config::QkNorm::PerHead) k = k_norm(k);
  return k;
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const AttentionBatch& batch, KVCache* cache,
                                     std::int64_t layer) {
  const std::int64_t T = x.size(0);
  const std::int64_t B = batch.batch;
  const std::int64_t S = batch.max_new;
  const std::int64_t group = num_heads / num_kv_heads;
  MOERL_CHECK(T == batch.tokens,
              "attention: x has " + std::to_string(T) + " tokens, the batch describes " + std::to_string(batch.tokens));

  const RotaryAngles& rotary = batch.rotary_for(head_dim, rope_theta, x.scalar_type());
  const torch::Tensor q = apply_rotary(project_query(x), rotary);
  const torch::Tensor k = apply_rotary(project_key(x), rotary);
  const torch::Tensor v = v_proj(x).view({T, num_kv_heads, head_dim});
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));

  // Whole sequences on the CPU (a learner's update, pretraining, scoring):
  // the fused kernel, which neither pads nor stores scores.
  if (cache == nullptr && !batch.any_past && fused_causal_attention_supported(q)) {
    return o_proj(fused_causal_attention(q, k, v, batch.row_lengths, batch.sliding_window, scale)
                      .reshape({T, num_heads * head_dim}));
  }

  // Keys/values in the padded [B, L, kv_heads, head_dim] layout.
  torch::Tensor keys, values;
  std::int64_t L = 0;
  if (cache != nullptr) {
    cache->write(layer, batch.token_slots, batch.positions, k, v);
    // Rollouts on the CPU: the fused kernel reads the paged cache itself.
    if (fused_cached_attention_supported(q, *cache)) {
      return o_proj(fused_cached_attention(q, *cache, layer, batch.row_slots, batch.row_lengths, batch.row_past,
                                           batch.sliding_window, scale)
                        .reshape({T, num_heads * head_dim}));
    }
    L = batch.max_total;
    keys = cache->gather_keys(layer, batch.cache_slots, L).to(x.scalar_type());
    values = cache->gather_values(layer, batch.cache_slots, L).to(x.scalar_type());
  } else {
    L = S;
    keys = torch::zeros({B * S, num_kv_heads, head_dim}, k.options())
               .index_copy(0, batch.token_index, k)
               .view({B, S, num_kv_heads, head_dim});
    values = torch::zeros({B * S, num_kv_heads, head_dim}, v.options())
                 .index_copy(0, batch.token_index, v)
                 .view({B, S, num_kv_heads, head_dim});
  }

  // Queries of one kv head's group are stacked along the query axis, so one
  // batched matmul per (row, kv head) serves the whole group without copying
  // keys num_heads / num_kv_heads times. Head h uses kv head h / group (the
  // Llama/Mixtral/Qwen convention).
  const torch::Tensor q_padded = torch::zeros({B * S, num_heads, head_dim}, q.options())
                                     .index_copy(0, batch.token_index, q)
                                     .view({B, S, num_kv_heads, group, head_dim})
                                     .permute({0, 2, 3, 1, 4})  // [B, kvh, G, S, D]
                                     .reshape({B, num_kv_heads, group * S, head_dim});
  const bool upcast = x.scalar_type() == torch::kHalf || x.scalar_type() == torch::kBFloat16;
  const torch::Tensor k_t = keys.permute({0, 2, 3, 1});    // [B, kvh, D, L]
  const torch::Tensor v_t = values.permute({0, 2, 1, 3});  // [B, kvh, L, D]
  torch::Tensor scores = torch::matmul(q_padded, k_t).mul(scale).view({B, num_kv_heads, group, S, L});
  if (upcast) scores = scores.to(torch::kFloat);
  // A large finite fill instead of -inf: a padding query row may have every
  // key masked only if its sequence were empty (rejected above), but a finite
  // value also keeps gradients free of NaN should that ever change.
  scores = scores.masked_fill(batch.allowed().logical_not(), -std::numeric_limits<float>::max());
  const torch::Tensor probs = torch::softmax(scores, -1).to(x.scalar_type()).view({B, num_kv_heads, group * S, L});
  const torch::Tensor context = torch::matmul(probs, v_t)  // [B, kvh, G*S, D]
                                    .view({B, num_kv_heads, group, S, head_dim})
                                    .permute({0, 3, 1, 2, 4})  // [B, S, kvh, G, D]
                                    .reshape({B * S, num_heads * head_dim})
                                    .index_select(0, batch.token_index);  // [T, H*D]
  return o_proj(context);
}

}  // namespace moerl::model
