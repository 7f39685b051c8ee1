#pragma once
// The MoE feed-forward module: route -> dispatch -> grouped SwiGLU experts ->
// combine, each an explicit operator (see moe_ops.h) with forward and backward
// on CPU and GPU. Include after the LibTorch precompiled header.
//
// Parameter names map one-to-one onto Hugging Face Mixtral / Qwen-MoE layouts
// (per layer, prefix `model.layers.N.mlp.` in Qwen2-MoE,
// `model.layers.N.block_sparse_moe.` in Mixtral):
//   gate.weight                 [E, d_model]          = gate.weight (router)
//   experts.gate_proj           [E, d_expert, d_model] slice e = experts.e.gate_proj.weight
//                                                       (Mixtral: experts.e.w1.weight)
//   experts.up_proj             [E, d_expert, d_model] slice e = experts.e.up_proj.weight
//                                                       (Mixtral: experts.e.w3.weight)
//   experts.down_proj           [E, d_model, d_expert] slice e = experts.e.down_proj.weight
//                                                       (Mixtral: experts.e.w2.weight)
//   shared_expert.gate_proj.weight [S*d_expert, d_model]  (Qwen2-MoE shared_expert.*,
//   shared_expert.up_proj.weight   [S*d_expert, d_model]   S = moe.shared_experts;
//   shared_expert.down_proj.weight [d_model, S*d_expert]   absent when S = 0)
//   shared_expert_gate.weight      [1, d_model]  (Qwen2-MoE; moe.shared_expert_gate):
//     the shared expert's output is scaled by sigmoid(x . w) per token
//     (without the gate it is added with weight 1). The shared expert's
//     hidden size is moe.d_shared_expert, or S*d_expert when that is 0.
// Router equivalences: Mixtral = SoftmaxThenTopK with renormalize (identical to
// TopKThenSoftmax); Qwen2-MoE = SoftmaxThenTopK, renormalize = norm_topk_prob.
//
// Dtypes (moe_compute_dtype): the layer computes in its input's dtype when
// that is the parameters' dtype (float32, bfloat16; double on CPU for
// gradient checks). Mixed float32/bfloat16 computes in bfloat16, whichever
// side is which:
//   - bf16 activations, float32 parameters (a learner with float32 master
//     weights running forward/backward in bf16): the router and expert
//     weights are cast to bf16 inside forward, differentiably, so their
//     gradients reach the float32 parameters as float32 tensors.
//   - float32 activations, bf16 parameters (an actor holding bf16 weights):
//     the activations follow the weights and are cast to bf16.
// MoeOutput::hidden is then bf16; aux_loss stays float32 (a loss term). The
// router runs in float32 whatever the activations: its logits are computed in
// float32 from the bf16 activations (cheap: E columns; bf16 logits would flip
// near-tied expert choices), and its softmax, top-k, gates and gate gradients
// are float32 too (moe_ops.h), so bf16 activations pick the same experts as
// float32 activations holding the same values. Other mixes (double with float32,
// float16) are rejected. Under CUDA autocast nothing changes: the layer does
// not consult the autocast state, so the caller picks the activations' dtype.

#include <cstdint>
#include <memory>
#include <vector>

#include "moerl/config/sections.h"
#include "moerl/moe/expert_exchange.h"
#include "moerl/moe/expert_parallel.h"

namespace moerl::moe {

struct RouterStats {                            // per layer, per forward
  std::vector<std::int64_t> tokens_per_expert;  // [E] assignments routed to each expert
  double imbalance = 0;                         // max/mean load
  double load_entropy = 0;                      // entropy of the load distribution (nats)
  std::int64_t dropped_tokens = 0;              // assignments dropped by capacity
};

struct MoeOutput {
  torch::Tensor hidden;          // [T, d_model]
  torch::Tensor expert_indices;  // [T, top_k] int64: the experts actually used
  torch::Tensor aux_loss;        // scalar: aux_loss_weight*balance + z_loss_weight*z; undefined
                                 // when forward ran without losses
  RouterStats stats;
};

// The routed experts' stacked SwiGLU weights (a module so that the parameter
// names read `experts.gate_proj` etc.).
class MoeExpertsImpl : public torch::nn::Module {
 public:
  MoeExpertsImpl(std::int64_t num_experts, std::int64_t d_model, std::int64_t d_expert);
  torch::Tensor gate_proj;  // [E, d_expert, d_model]
  torch::Tensor up_proj;    // [E, d_expert, d_model]
  torch::Tensor down_proj;  // [E, d_model, d_expert]
};
TORCH_MODULE(MoeExperts);

// A dense SwiGLU: down(silu(gate(x)) * up(x)), used for the shared expert.
// Computes in x's dtype: weights of another dtype are cast to it (differentiably).
class SwiGluImpl : public torch::nn::Module {
 public:
  SwiGluImpl(std::int64_t d_model, std::int64_t d_hidden);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Linear gate_proj{nullptr};  // weight [d_hidden, d_model]
  torch::nn::Linear up_proj{nullptr};    // weight [d_hidden, d_model]
  torch::nn::Linear down_proj{nullptr};  // weight [d_model, d_hidden]
};
TORCH_MODULE(SwiGlu);

class MoeFeedForwardImpl : public torch::nn::Module {
 public:
  // expert_group: null for a layer that holds all its experts; else the
  // members this layer's routed experts are split over (moe/expert_parallel.h):
  // `experts` then holds this member's E/P of them, initialised as the same
  // slice of a whole layer built with the same seed, so that a job gives the
  // same model whatever its expert-parallel size.
  MoeFeedForwardImpl(const config::ModelSection& model, const config::MoeSection& moe,
                     std::shared_ptr<ExpertExchange> expert_group = nullptr);
  // x: [T, d_model] (dtype rule above); forced_experts: undefined, or
  // [T, active_experts()] int64 (routing replay). with_losses = false
  // leaves aux_loss undefined and skips computing it (a decode step trains
  // on nothing; the losses were about 15 small serial tensor ops per layer).
  MoeOutput forward(const torch::Tensor& x, const torch::Tensor& forced_experts = torch::Tensor(),
                    bool with_losses = true);

  const config::MoeSection& moe_config() const { return moe_; }
  // The routed experts this layer holds: all of them without an expert group.
  ExpertShard expert_shard() const { return shard_; }
  ExpertExchange* expert_group() const { return expert_group_.get(); }

  // Experts each token is routed to from now on: 0 = moe.top_k (what the
  // layer is trained with), else 1..num_experts. An inference-time choice
  // (rollout.moe_top_k): the router keeps its weights and picks the k' most
  // likely experts, gates renormalised over those k' as with moe.top_k, and
  // expert capacity follows k'; the layer then computes exactly what a
  // layer configured with top_k = k' and the same weights computes.
  // forced_experts must then be [T, k'].
  void set_active_experts(std::int64_t k);
  std::int64_t active_experts() const { return routing_.top_k; }

  // RouterStats are host values: on GPU, filling them costs one small
  // device-to-host copy (a stream sync) per forward. Callers that never read
  // them (e.g. decode steps) can switch them off; `stats` then stays empty.
  void set_collect_stats(bool on) { collect_stats_ = on; }
  bool collect_stats() const { return collect_stats_; }

  torch::nn::Linear gate{nullptr};  // router, weight [E, d_model]
  MoeExperts experts{nullptr};
  SwiGlu shared_expert{nullptr};                  // null when moe.shared_experts == 0
  torch::nn::Linear shared_expert_gate{nullptr};  // weight [1, d_model]; null without the gate

 private:
  config::MoeSection moe_;
  config::MoeSection routing_;  // moe_ with top_k = the active experts (set_active_experts)
  std::shared_ptr<ExpertExchange> expert_group_;
  ExpertShard shard_;
  std::int64_t d_model_ = 0;
  bool collect_stats_ = true;
};
TORCH_MODULE(MoeFeedForward);

// The textbook per-expert loop over the same parameters and routing, as
// Mixtral-style model code writes it: for each expert one mask (nonzero), one
// index_select, the expert's SwiGLU on per-expert weight views (unbind, like a
// ModuleList of Linear layers) and one in-place index_add_. Obviously right;
// the tests compare against it and the benchmark uses it as the baseline.
// Capacity drops the same assignments (the first `capacity` per expert in
// token order are kept). Only for a layer that holds all its experts.
MoeOutput reference_moe_forward(MoeFeedForwardImpl& layer, const torch::Tensor& x,
                                const torch::Tensor& forced_experts = torch::Tensor());

// The shared expert's contribution: shared_expert(x), scaled per token by
// sigmoid(shared_expert_gate(x)) when the layer has that gate. [T, d_model].
// Computes in x's dtype (the weights are cast to it).
torch::Tensor shared_expert_output(MoeFeedForwardImpl& layer, const torch::Tensor& x);

// The dtype the layer computes in for input x and parameter `weight` (the
// rule above): their common dtype, or bfloat16 for a float32/bfloat16 mix;
// throws for any other mix.
torch::ScalarType moe_compute_dtype(const torch::Tensor& x, const torch::Tensor& weight);

// Capacity of one expert for a batch of T tokens: ceil(capacity_factor*T*k/E),
// or -1 (unbounded, dropless) when capacity_factor <= 0.
std::int64_t expert_capacity(const config::MoeSection& moe, std::int64_t num_tokens);

}  // namespace moerl::moe
