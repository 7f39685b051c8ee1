#pragma once
// Policy: the decoder-only MoE transformer (weights and architecture only;
// the decode state lives in KVCache).
//
//   tokens -> embed_tokens -> N x DecoderLayer -> norm -> lm_head -> logits
//   DecoderLayer: h = x + self_attn(input_layernorm(x))
//                 y = h + mlp(post_attention_layernorm(h))
//   mlp is the MoE feed-forward in the layers is_moe_layer() names (from
//   moe.first_dense_layers on, every moe.sparse_step-th), else a dense SwiGLU
//   (every layer when moe.enabled is false).
//
// Ragged batches. Inputs are right-padded [B, S] token ids plus the number of
// real tokens per row; the model computes on the T real tokens only
// ("packed" order: row by row, position by position) and all per-token
// outputs (logits, expert indices) are packed [T, ...]. PolicyOutput::unpack
// lays them out as [B, S, ...] again.
//
// Parameter names and their Hugging Face checkpoint names (Mixtral,
// Qwen2-MoE, Qwen3-MoE, OLMoE; HF prefixes all but lm_head with "model."):
//   embed_tokens.weight                        [V, d]     model.embed_tokens.weight
//   layers.N.input_layernorm.weight            [d]        same name
//   layers.N.self_attn.{q,k,v,o}_proj.weight              same names
//   layers.N.self_attn.{q,k,v,o}_proj.bias                same names (model.qkv_bias / o_bias)
//   layers.N.self_attn.{q,k}_norm.weight                  same names (model.qk_norm)
//   layers.N.post_attention_layernorm.weight   [d]        same name
//   dense layer:  layers.N.mlp.{gate,up,down}_proj.weight same names (Llama/Qwen dense MLP)
//   MoE layer:    layers.N.mlp.gate.weight     [E, d]     Qwen: mlp.gate.weight;
//                                                         Mixtral: block_sparse_moe.gate.weight
//                 layers.N.mlp.experts.{gate,up,down}_proj  [E, ...] stacked; slice e is
//                   Qwen mlp.experts.e.{gate,up,down}_proj.weight,
//                   Mixtral block_sparse_moe.experts.e.{w1,w3,w2}.weight
//                 layers.N.mlp.shared_expert.*          Qwen mlp.shared_expert.*
//                 layers.N.mlp.shared_expert_gate.weight [1, d]  same name (moe.shared_expert_gate)
//   norm.weight                                [d]        model.norm.weight
//   lm_head.weight                             [V, d]     lm_head.weight (absent when tied)
// hf_checkpoint_names() spells this out per parameter.
//
// Rotary embedding uses the HF "rotate half" layout, so q_proj/k_proj need no
// permutation when loading those checkpoints.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "moerl/config/sections.h"
#include "moerl/model/attention.h"
#include "moerl/model/feed_forward.h"
#include "moerl/model/kv_cache.h"
#include "moerl/model/rms_norm.h"
#include "moerl/moe/moe_layer.h"

namespace moerl::model {

struct PolicyOutput {
  torch::Tensor logits;                        // [T, vocab] packed over the real tokens ([K, vocab] with
                                               // logit_rows); float32 for a bf16/fp16 model
  torch::Tensor logit_rows;                    // [K] int64: the packed positions `logits` covers; undefined = all T
  torch::Tensor hidden;                        // [T, d_model] final normed hidden state (for value heads)
  torch::Tensor expert_indices;                // [T, moe_layers, active_experts()] int64; undefined without MoE layers
  torch::Tensor aux_loss;                      // scalar: sum over MoE layers (already weighted); 0 without
                                               // them; undefined from forward_cached (rollouts)
  std::vector<moe::RouterStats> router_stats;  // one per MoE layer, in layer order
  torch::Tensor token_index;                   // [T] int64: b * S + s of each packed token
  torch::Tensor last_token;                    // [B] int64: packed index of each row's last real token
  std::int64_t batch = 0;                      // B
  std::int64_t max_new = 0;                    // S

  // Logits that predict each row's next token: [B, vocab] (a forward without logit_rows).
  torch::Tensor next_token_logits() const;
  // packed [T, ...] -> [B, S, ...]; padding positions hold `fill`.
  torch::Tensor unpack(const torch::Tensor& packed, double fill = 0.0) const;
};

// Qwen2-MoE, Qwen3-MoE and OLMoE share the CheckpointQwenMoe names.
enum class CheckpointFamily { CheckpointMixtral, CheckpointQwenMoe };

// Whether decoder layer `layer` has the MoE feed-forward: moe.enabled, at or
// past moe.first_dense_layers, and (layer + 1) % moe.sparse_step == 0 (the
// Qwen-MoE decoder_sparse_step rule).
bool is_moe_layer(const config::ModelSection& model, const config::MoeSection& moe, std::int64_t layer);

struct DecoderLayerOutput {
  torch::Tensor hidden;  // [T, d_model]
  bool has_moe = false;  // moe is filled only for MoE layers
  moe::MoeOutput moe;
};

class DecoderLayerImpl : public torch::nn::Module {
 public:
  // expert_group: null, or the members its routed experts are split over (moe_layer.h)
  DecoderLayerImpl(const config::ModelSection& model, const config::MoeSection& moe, std::int64_t layer_index,
                   std::shared_ptr<moe::ExpertExchange> expert_group = nullptr);

  // x: [T, d_model]; forced_experts: undefined or [T, top_k] (MoE layers only).
  DecoderLayerOutput forward(const torch::Tensor& x, const AttentionBatch& batch, KVCache* cache,
                             const torch::Tensor& forced_experts);

  bool is_moe() const { return !moe_mlp.is_empty(); }

  std::int64_t layer_index;
  RMSNorm input_layernorm{nullptr};  // weight [d_model]
  Attention self_attn{nullptr};
  RMSNorm post_attention_layernorm{nullptr};  // weight [d_model]
  SwiGluFeedForward dense_mlp{nullptr};       // registered as "mlp" in dense layers
  moe::MoeFeedForward moe_mlp{nullptr};       // registered as "mlp" in MoE layers
};
TORCH_MODULE(DecoderLayer);

class PolicyImpl : public torch::nn::Module {
 public:
  // expert_group: null for a policy that holds every expert; else every MoE
  // layer splits its routed experts over the group's members
  // (moe/expert_parallel.h), and every member must run each forward and
  // backward with the others. The weights are those of a whole policy built
  // with the same seed, sliced (reset_parameters draws every expert).
  PolicyImpl(const config::ModelSection& model, const config::MoeSection& moe,
             std::shared_ptr<moe::ExpertExchange> expert_group = nullptr);

  // Full forward without a cache (learner, evaluation). tokens: [B, S]
  // int64, right-padded; lengths: [B] int64 real tokens per row (each
  // >= 1), or undefined for "all S". forced_experts: undefined, or
  // [T, moe_layers, active_experts()] int64 in packed order -- pass a previous
  // PolicyOutput::expert_indices to replay its routing. logit_rows:
  // undefined for logits at every position, or [K] int64 packed positions:
  // the head then runs on those rows only. A learner reads log-probs of
  // generated tokens alone (a fifth of an episode's positions in the
  // quickstart), and the head with its log-softmax over the vocabulary,
  // forward and backward, is a large share of a small model's update.
  PolicyOutput forward(const torch::Tensor& tokens, const torch::Tensor& lengths = torch::Tensor(),
                       const torch::Tensor& forced_experts = torch::Tensor(),
                       const torch::Tensor& logit_rows = torch::Tensor());

  // One step of incremental decoding: row b appends lengths[b] tokens to
  // sequence sequences[b] of the cache (a prefill when that sequence is
  // new, one token per row in steady decoding, any mix in between). Rows
  // may be any subset of the cache's sequences, in any order. Positions
  // continue from each sequence's cached length. Gradients do not flow
  // through cached keys/values.
  // next_token_only: the head runs on each row's last token alone (a
  // sampler reads nothing else; a prefill of hundreds of tokens per row then
  // skips their logits), and next_token_logits() returns them.
  PolicyOutput forward_cached(const torch::Tensor& tokens, const torch::Tensor& lengths, KVCache& cache,
                              const std::vector<SequenceId>& sequences,
                              const torch::Tensor& forced_experts = torch::Tensor(), bool next_token_only = false);

  // A cache with this policy's dtype and device.
  KVCache make_cache(std::int64_t initial_slots = 4, std::int64_t initial_capacity = 64) const;

  // normal(0, init_std) for every matrix, with the residual output
  // projections (o_proj, down_proj of dense, shared and routed experts)
  // scaled by 1/sqrt(2 * num_layers); norms = 1.
  void reset_parameters();

  // With an expert group: the parameters that are this member's share of
  // split experts, and all the others (replicated on every member), each in
  // parameters() order. Without one, every parameter is replicated.
  std::vector<torch::Tensor> split_expert_parameters() const;
  std::vector<torch::Tensor> replicated_parameters() const;
  // The group the MoE layers' experts are split over; null for a whole policy.
  const std::shared_ptr<moe::ExpertExchange>& expert_group() const { return expert_group_; }

  // With an expert group: this member's part in a forward (and backward)
  // that the other members run while it has no tokens of its own. Every MoE
  // layer runs in order on zero rows, which still joins the layer's
  // exchanges and computes this member's experts over the rows the others
  // send. Returns the last layer's [0, d_model] output; backward() of its
  // sum() joins the backward exchanges (and gives this member's experts the
  // gradients of the others' rows). The caller decides grad mode, as for
  // forward(). Without an expert group it does nothing and returns an
  // undefined tensor.
  torch::Tensor idle_expert_pass();

  // Experts per token every MoE layer routes to from now on: 0 = moe.top_k
  // (the trained routing), else 1..moe.num_experts. Actors set it on their
  // inference copy from rollout.moe_top_k (GenerationEngine does, from
  // EngineOptions::moe_top_k); expert_indices and forced_experts are then
  // [T, moe_layers, active_experts()]. Without MoE layers only 0 is accepted.
  void set_active_experts(std::int64_t k);
  // The k of the routing in use: moe.top_k unless set_active_experts chose
  // another; 0 without MoE layers.
  std::int64_t active_experts() const { return active_experts_; }

  const config::ModelSection& model_config() const { return model_; }
  const config::MoeSection& moe_config() const { return moe_; }
  std::int64_t num_moe_layers() const { return static_cast<std::int64_t>(moe_layers_.size()); }
  const std::vector<std::int64_t>& moe_layer_indices() const { return moe_layers_; }

  torch::nn::Embedding embed_tokens{nullptr};  // weight [vocab, d_model]
  torch::nn::ModuleList layers{nullptr};       // num_layers x DecoderLayer
  std::vector<DecoderLayer> decoder_layers;    // typed views of `layers`
  RMSNorm norm{nullptr};                       // weight [d_model]
  torch::nn::Linear lm_head{nullptr};          // weight [vocab, d_model]; null when tied

 private:
  PolicyOutput run(const torch::Tensor& tokens, const AttentionBatch& batch, KVCache* cache,
                   const torch::Tensor& forced_experts, const torch::Tensor& logit_rows = torch::Tensor());
  std::vector<std::int64_t> row_lengths(const torch::Tensor& tokens, const torch::Tensor& lengths) const;

  config::ModelSection model_;
  config::MoeSection moe_;
  std::vector<std::int64_t> moe_layers_;  // indices of the MoE layers
  std::shared_ptr<moe::ExpertExchange> expert_group_;
  std::int64_t active_experts_ = 0;  // see active_experts()
};
TORCH_MODULE(Policy);

// A policy split over `expert_group` holding the member's share of `whole`'s
// weights (its experts' slice, everything else as is).
Policy share_of(const PolicyImpl& whole, std::shared_ptr<moe::ExpertExchange> expert_group);

// The checkpoint tensor(s) a moerl parameter corresponds to. Stacked expert
// tensors [E, ...] map to E names (slice e along dim 0 is the e-th name);
// every other parameter maps to exactly one name.
std::vector<std::string> hf_checkpoint_names(const std::string& parameter_name, std::int64_t num_experts,
                                             CheckpointFamily family);

}  // namespace moerl::model
