#pragma once
// Causal grouped-query self-attention over a ragged batch.
//
// Activations travel through the model *packed*: [T, d_model] holds only the
// real (non-padding) tokens of all B sequences, in row-major order. On the
// CPU in float or double, attention works on that layout directly
// (model/causal_attention.h: whole sequences, and the paged KV cache of a
// float cache). Elsewhere (GPUs, bf16, an int8 cache) it scatters q/k/v into
// a padded [B, S] view, masks every key that is padding, in the future, or
// past the sequence's own length, and packs the result again. Padding
// therefore never reaches the MoE router statistics or the LM head.

#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "moerl/config/sections.h"
#include "moerl/model/rms_norm.h"
#include "moerl/model/rotary.h"

namespace moerl::model {

class KVCache;

// Describes one ragged step: row b has lengths[b] >= 1 new tokens at
// positions past[b] .. past[b] + lengths[b) - 1 of its sequence.
struct AttentionBatch {
  std::int64_t batch = 0;                 // B
  std::int64_t max_new = 0;               // S: padded width of the new tokens
  std::int64_t max_total = 0;             // L: max over rows of past + lengths (key length)
  std::int64_t tokens = 0;                // T: sum of lengths
  torch::Tensor token_index;              // [T] int64: b * S + i of each packed token
  torch::Tensor token_row;                // [T] int64: b of each packed token
  torch::Tensor positions;                // [T] int64: past[b] + i
  torch::Tensor last_token;               // [B] int64: packed index of row b's last token
  torch::Tensor cache_slots;              // [B] int64: KV-cache slot of each row; undefined without cache
  torch::Tensor token_slots;              // [T] int64: cache slot of each packed token; undefined without cache
  std::vector<std::int64_t> row_lengths;  // [B] on the host: lengths, for the fused CPU paths
  std::vector<std::int64_t> row_past;     // [B] on the host: past
  std::vector<std::int64_t> row_slots;    // [B] on the host: cache slots (empty without cache)
  bool any_past = false;                  // some row has cached positions
  std::int64_t sliding_window = 0;        // as given to make

  // lengths: new tokens per row (each >= 1, at most max_new); past: cached
  // positions per row (all 0 without a cache); slots: empty without a cache.
  // sliding_window > 0: query position p sees only keys at p - window < j <= p
  // (the Mistral/Mixtral convention).
  static AttentionBatch make(const std::vector<std::int64_t>& lengths, const std::vector<std::int64_t>& past,
                             const std::vector<std::int64_t>& slots, std::int64_t max_new, const torch::Device& device,
                             std::int64_t sliding_window = 0);

  // [B, 1, 1, S, L] bool: query (b, i) may attend key j. Only the padded
  // attention path reads it (GPUs, bf16, an int8 cache): built on first use.
  const torch::Tensor& allowed() const;

  // RoPE angles of `positions` for heads of head_dim in dtype: computed by
  // the first layer that asks and reused by every later one (all layers
  // rotate the same positions), recomputed if one asks for other sizes.
  const RotaryAngles& rotary_for(std::int64_t head_dim, double theta, torch::ScalarType dtype) const;

 private:
  // Caches of one forward, which uses a batch from one thread: filled
  // lazily behind the const accessors above.
  mutable torch::Tensor allowed_;
  mutable RotaryAngles rotary_;
  mutable std::int64_t rotary_head_dim_ = 0;
  mutable double rotary_theta_ = 0;
  mutable torch::ScalarType rotary_dtype_ = torch::kFloat;
};

// model.head_dim, or d_model / num_heads when that is 0.
inline std::int64_t attention_head_dim(const config::ModelSection& model) {
  if (model.head_dim > 0) return model.head_dim;
  return model.num_heads > 0 ? model.d_model / model.num_heads : 0;
}

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const config::ModelSection& model);

  // x: [T, d_model] packed -> [T, d_model]. With a cache, this layer's new
  // keys/values are written to it first and all keys are read back from it.
  torch::Tensor forward(const torch::Tensor& x, const AttentionBatch& batch, KVCache* cache, std::int64_t layer);

  // x [T, d_model] -> [T, heads, head_dim] before rotary, QK-norm applied.
  torch::Tensor project_query(const torch::Tensor& x);
  torch::Tensor project_key(const torch::Tensor& x);

  std::int64_t num_heads;
  std::int64_t num_kv_heads;
  std::int64_t head_dim;
  double rope_theta;
  config::QkNorm qk_norm_mode;
  // Biases ([out]) exist when model.qkv_bias / model.o_bias say so.
  torch::nn::Linear q_proj{nullptr};  // weight [num_heads * head_dim, d_model]
  torch::nn::Linear k_proj{nullptr};  // weight [num_kv_heads * head_dim, d_model]
  torch::nn::Linear v_proj{nullptr};  // weight [num_kv_heads * head_dim, d_model]
  torch::nn::Linear o_proj{nullptr};  // weight [d_model, num_heads * head_dim]; residual output
  // QK-norm (null without): weight [head_dim] per head (Qwen3-MoE), or
  // [num_heads * head_dim] / [num_kv_heads * head_dim] over the projection (OLMoE).
  RMSNorm q_norm{nullptr};
  RMSNorm k_norm{nullptr};
};
TORCH_MODULE(Attention);

}  // namespace moerl::model
