#include "moerl/model/policy.h"

#include <algorithm>
#include <cmath>

#include "moerl/core/check.h"
#include "moerl/core/string_affixes.h"
#include "moerl/hf/hf_weights.h"

namespace moerl::model {

torch::Tensor PolicyOutput::unpack(const torch::Tensor& packed, double fill) const {
  MOERL_CHECK(packed.dim() >= 1 && packed.size(0) == token_index.size(0),
              "PolicyOutput::unpack: expected " + std::to_string(token_index.size(0)) + " packed rows, got " +
                  (packed.dim() ? std::to_string(packed.size(0)) : "a scalar"));
  std::vector<std::int64_t> flat_shape{batch * max_new};
  std::vector<std::int64_t> shape{batch, max_new};
  for (std::int64_t d = 1; d < packed.dim(); ++d) {
    flat_shape.push_back(packed.size(d));
    shape.push_back(packed.size(d));
  }
  return torch::full(flat_shape, fill, packed.options()).index_copy(0, token_index, packed).view(shape);
}

torch::Tensor PolicyOutput::next_token_logits() const {
  if (!logit_rows.defined()) return logits.index_select(0, last_token);
  MOERL_CHECK(logit_rows.is_same(last_token),
              "PolicyOutput::next_token_logits: the forward computed logits at other chosen rows only");
  return logits;
}

// ---------------------------------------------------------------- layer

bool is_moe_layer(const config::ModelSection& model, const config::MoeSection& moe, std::int64_t layer) {
  (void)model;
  if (!moe.enabled || layer < moe.first_dense_layers) return false;
  return (layer + 1) % std::max<std::int64_t>(moe.sparse_step, 1) == 0;
}

DecoderLayerImpl::DecoderLayerImpl(const config::ModelSection& model, const config::MoeSection& moe, std::int64_t index,
                                   std::shared_ptr<moe::ExpertExchange> expert_group)
    : layer_index(index) {
  input_layernorm = register_module("input_layernorm", RMSNorm(model.d_model, model.norm_eps));
  self_attn = register_module("self_attn", Attention(model));
  post_attention_layernorm = register_module("post_attention_layernorm", RMSNorm(model.d_model, model.norm_eps));
  if (is_moe_layer(model, moe, index)) {
    moe_mlp = register_module("mlp", moe::MoeFeedForward(model, moe, std::move(expert_group)));
  } else {
    dense_mlp = register_module("mlp", SwiGluFeedForward(model.d_model, model.d_ff));
  }
}

DecoderLayerOutput DecoderLayerImpl::forward(const torch::Tensor& x, const AttentionBatch& batch, KVCache* cache,
                                             const torch::Tensor& forced_experts) {
  DecoderLayerOutput out;
  const torch::Tensor h = x + self_attn(input_layernorm(x), batch, cache, layer_index);
  const torch::Tensor normed = post_attention_layernorm(h);
  if (is_moe()) {
    // A cached forward is a rollout step: nothing trains on its losses.
    out.moe = moe_mlp->forward(normed, forced_experts, /*with_losses=*/cache == nullptr);
    out.has_moe = true;
    out.hidden = h + out.moe.hidden;
  } else {
    out.hidden = h + dense_mlp(normed);
  }
  return out;
}

// ---------------------------------------------------------------- policy

namespace {

// The MoE layer whose split routed experts the parameter `name`
// ("layers.L.mlp.experts.*") is, or null (any other parameter, or a layer
// that holds all its experts).
const moe::MoeFeedForwardImpl* split_layer_of_experts(const std::vector<DecoderLayer>& layers,
                                                      const std::string& name) {
  const std::string prefix = "layers.";
  const auto dot = name.find('.', prefix.size());
  if (name.rfind(prefix, 0) != 0 || dot == std::string::npos) return nullptr;
  if (name.compare(dot, 13, ".mlp.experts.") != 0) return nullptr;
  const auto index = static_cast<size_t>(std::stoll(name.substr(prefix.size(), dot - prefix.size())));
  if (index >= layers.size() || !layers[index]->is_moe()) return nullptr;
  const moe::MoeFeedForwardImpl& layer = *layers[index]->moe_mlp;
  return layer.expert_group() != nullptr ? &layer : nullptr;
}

}  // namespace

PolicyImpl::PolicyImpl(const config::ModelSection& model, const config::MoeSection& moe,
                       std::shared_ptr<moe::ExpertExchange> expert_group)
    : model_(model), moe_(moe), expert_group_(expert_group) {
  MOERL_CHECK(model.vocab_size > 0 && model.d_model > 0 && model.num_layers > 0,
              "model.vocab_size, model.d_model and model.num_layers must be positive");
  MOERL_CHECK(model.max_seq_len > 0, "model.max_seq_len must be positive");
  if (moe.enabled) {
    MOERL_CHECK(moe.first_dense_layers >= 0, "moe.first_dense_layers must be >= 0");
    MOERL_CHECK(moe.top_k >= 1 && moe.top_k <= moe.num_experts,
                "moe.top_k (" + std::to_string(moe.top_k) +
                    ") must be in [1, moe.num_experts = " + std::to_string(moe.num_experts) + "]");
  }
  embed_tokens = register_module("embed_tokens",
                                 torch::nn::Embedding(torch::nn::EmbeddingOptions(model.vocab_size, model.d_model)));
  layers = register_module("layers", torch::nn::ModuleList());
  for (std::int64_t l = 0; l < model.num_layers; ++l) {
    DecoderLayer layer(model, moe, l, expert_group);
    layers->push_back(layer);
    decoder_layers.push_back(layer);
    if (layer->is_moe()) moe_layers_.push_back(l);
  }
  active_experts_ = moe_layers_.empty() ? 0 : moe.top_k;
  norm = register_module("norm", RMSNorm(model.d_model, model.norm_eps));
  if (!model.tie_embeddings) {
    lm_head = register_module("lm_head",
                              torch::nn::Linear(torch::nn::LinearOptions(model.d_model, model.vocab_size).bias(false)));
  }
  reset_parameters();
}

void PolicyImpl::reset_parameters() {
  torch::NoGradGuard no_grad;
  const double std_dev = model_.init_std;
  const double residual_std = std_dev / std::sqrt(2.0 * static_cast<double>(model_.num_layers));
  for (auto& item : named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    torch::Tensor& p = item.value();
    if (p.dim() < 2) {
      // RMSNorm weights (and any bias a submodule may add).
      if (ends_with(name, "norm.weight")) {
        p.fill_(1.0);
      } else {
        p.zero_();
      }
      continue;
    }
    // Residual branch outputs: each layer adds two of them to the stream;
    // scaling keeps the stream's variance from growing with depth.
    const bool residual_output =
        ends_with(name, "o_proj.weight") || ends_with(name, "down_proj.weight") || ends_with(name, "down_proj");
    const double std = residual_output ? residual_std : std_dev;
    // A split layer's experts: every expert drawn, this member's kept, so
    // the random stream (and the policy) is that of the whole model.
    if (const moe::MoeFeedForwardImpl* split = split_layer_of_experts(decoder_layers, name)) {
      moe::normal_expert_share_(p, split->expert_shard(), moe_.num_experts, std);
    } else {
      p.normal_(0.0, std);
    }
  }
}

std::vector<torch::Tensor> PolicyImpl::split_expert_parameters() const {
  std::vector<torch::Tensor> split;
  for (const auto& item : named_parameters(/*recurse=*/true))
    if (split_layer_of_experts(decoder_layers, item.key()) != nullptr) split.push_back(item.value());
  return split;
}

std::vector<torch::Tensor> PolicyImpl::replicated_parameters() const {
  std::vector<torch::Tensor> replicated;
  for (const auto& item : named_parameters(/*recurse=*/true))
    if (split_layer_of_experts(decoder_layers, item.key()) == nullptr) replicated.push_back(item.value());
  return replicated;
}

torch::Tensor PolicyImpl::idle_expert_pass() {
  if (!expert_group_) return {};
  const torch::Tensor& w = embed_tokens->weight;
  // Zero rows in the policy's compute dtype; requires_grad so that the
  // backward reaches every layer's exchanges, in reverse layer order.
  torch::Tensor x = torch::zeros({0, model_.d_model}, w.options().requires_grad(torch::GradMode::is_enabled()));
  for (std::int64_t l : moe_layers_) x = x + decoder_layers[static_cast<size_t>(l)]->moe_mlp->forward(x).hidden;
  return x;
}

Policy share_of(const PolicyImpl& whole, std::shared_ptr<moe::ExpertExchange> expert_group) {
  Policy split(whole.model_config(), whole.moe_config(), std::move(expert_group));
  torch::NoGradGuard no_grad;
  const auto source = whole.named_parameters(/*recurse=*/true);
  for (auto& item : split->named_parameters(/*recurse=*/true)) {
    torch::Tensor from = source[item.key()];
    if (const moe::MoeFeedForwardImpl* layer = split_layer_of_experts(split->decoder_layers, item.key()))
      from = from.narrow(0, layer->expert_shard().first, layer->expert_shard().count);
    item.value().copy_(from);
  }
  split->to(whole.embed_tokens->weight.device());
  return split;
}

void PolicyImpl::set_active_experts(std::int64_t k) {
  if (moe_layers_.empty()) {
    MOERL_CHECK(k == 0, "policy: " + std::to_string(k) + " active experts asked of a model without MoE layers");
    return;
  }
  MOERL_CHECK(k >= 0 && k <= moe_.num_experts,
              "policy: active experts must be 0 (moe.top_k = " + std::to_string(moe_.top_k) +
                  ") or in [1, moe.num_experts = " + std::to_string(moe_.num_experts) + "], got " + std::to_string(k));
  for (auto& layer : decoder_layers)
    if (layer->is_moe()) layer->moe_mlp->set_active_experts(k);
  active_experts_ = k == 0 ? moe_.top_k : k;
}

KVCache PolicyImpl::make_cache(std::int64_t initial_slots, std::int64_t initial_capacity) const {
  const torch::Tensor& w = embed_tokens->weight;
  return KVCache(model_, w.options().requires_grad(false), initial_slots, initial_capacity);
}

std::vector<std::int64_t> PolicyImpl::row_lengths(const torch::Tensor& tokens, const torch::Tensor& lengths) const {
  MOERL_CHECK(tokens.dim() == 2, "policy: tokens must be [B, S], got " + std::to_string(tokens.dim()) + " dims");
  MOERL_CHECK(tokens.scalar_type() == torch::kLong, "policy: tokens must be int64");
  const std::int64_t rows = tokens.size(0);
  const std::int64_t width = tokens.size(1);
  if (!lengths.defined()) return std::vector<std::int64_t>(static_cast<std::size_t>(rows), width);
  MOERL_CHECK(lengths.dim() == 1 && lengths.size(0) == rows,
              "policy: lengths must be [B] with B = " + std::to_string(rows));
  const torch::Tensor host = lengths.to(torch::kCPU, torch::kLong).contiguous();
  const std::int64_t* data = host.data_ptr<std::int64_t>();
  return std::vector<std::int64_t>(data, data + rows);
}

PolicyOutput PolicyImpl::forward(const torch::Tensor& tokens, const torch::Tensor& lengths,
                                 const torch::Tensor& forced_experts, const torch::Tensor& logit_rows) {
  const std::vector<std::int64_t> lens = row_lengths(tokens, lengths);
  MOERL_CHECK(tokens.size(1) <= model_.max_seq_len,
              "policy: sequence width " + std::to_string(tokens.size(1)) +
                  " exceeds model.max_seq_len = " + std::to_string(model_.max_seq_len));
  const AttentionBatch batch = AttentionBatch::make(lens, std::vector<std::int64_t>(lens.size(), 0), {}, tokens.size(1),
                                                    tokens.device(), model_.sliding_window);
  return run(tokens, batch, nullptr, forced_experts, logit_rows);
}

PolicyOutput PolicyImpl::forward_cached(const torch::Tensor& tokens, const torch::Tensor& lengths, KVCache& cache,
                                        const std::vector<SequenceId>& sequences, const torch::Tensor& forced_experts,
                                        bool next_token_only) {
  const std::vector<std::int64_t> lens = row_lengths(tokens, lengths);
  MOERL_CHECK(lens.size() == sequences.size(), "policy: " + std::to_string(lens.size()) + " token rows but " +
                                                   std::to_string(sequences.size()) + " sequence ids");
  MOERL_CHECK(cache.num_layers() == model_.num_layers, "policy: KV cache built for another model");
  const std::vector<std::int64_t> slots = cache.slots_of(sequences);
  const std::vector<std::int64_t> past = cache.lengths_of(sequences);
  // Allocates the blocks the new positions need (throws before any change
  // when max_seq_len would be exceeded or a capped pool is full).
  cache.prepare(sequences, lens);
  const AttentionBatch batch =
      AttentionBatch::make(lens, past, slots, tokens.size(1), tokens.device(), model_.sliding_window);
  PolicyOutput out = run(tokens, batch, &cache, forced_experts, next_token_only ? batch.last_token : torch::Tensor());
  cache.advance(sequences, lens);  // only after the whole step succeeded
  return out;
}

namespace {
bool token_ids_in_vocabulary(const torch::Tensor& ids, std::int64_t vocab_size) {
  if (!ids.device().is_cpu() || ids.scalar_type() != torch::kLong)
    return !ids.lt(0).logical_or(ids.ge(vocab_size)).any().item<bool>();
  const torch::Tensor flat = ids.contiguous();
  const std::int64_t* id = flat.data_ptr<std::int64_t>();
  return std::all_of(id, id + flat.numel(), [&](std::int64_t t) { return t >= 0 && t < vocab_size; });
}
}  // namespace

PolicyOutput PolicyImpl::run(const torch::Tensor& tokens, const AttentionBatch& batch, KVCache* cache,
                             const torch::Tensor& forced_experts, const torch::Tensor& logit_rows) {
  const std::int64_t T = batch.tokens;
  const std::int64_t num_moe = num_moe_layers();
  if (forced_experts.defined()) {
    MOERL_CHECK(num_moe > 0, "policy: forced_experts given but the model has no MoE layer");
    MOERL_CHECK(forced_experts.dim() == 3 && forced_experts.size(0) == T && forced_experts.size(1) == num_moe &&
                    forced_experts.size(2) == active_experts_,
                "policy: forced_experts must be [T, moe_layers, active experts] = [" + std::to_string(T) + ", " +
                    std::to_string(num_moe) + ", " + std::to_string(active_experts_) + "], got " +
                    std::to_string(forced_experts.dim()) + " dims");
  }
  const torch::Tensor ids = tokens.reshape({-1}).index_select(0, batch.token_index);  // [T]
  // One host sync per step for the check (a loop on the host: no tensor ops
  // there); the range is only computed on failure.
  if (!token_ids_in_vocabulary(ids, model_.vocab_size)) {
    const std::int64_t lo = ids.min().item<std::int64_t>();
    const std::int64_t hi = ids.max().item<std::int64_t>();
    MOERL_CHECK(false, "policy: token ids span [" + std::to_string(lo) + ", " + std::to_string(hi) +
                           "], outside the vocabulary [0, " + std::to_string(model_.vocab_size) + ")");
  }
  PolicyOutput out;
  out.batch = batch.batch;
  out.max_new = batch.max_new;
  out.token_index = batch.token_index;
  out.last_token = batch.last_token;

  torch::Tensor h = embed_tokens(ids);  // [T, d_model]
  std::vector<torch::Tensor> indices;
  torch::Tensor aux;  // defined once a MoE layer returns a loss (not in a cached forward)
  std::int64_t m = 0;
  for (auto& layer : decoder_layers) {
    torch::Tensor forced;
    if (forced_experts.defined() && layer->is_moe()) forced = forced_experts.select(1, m).contiguous();
    DecoderLayerOutput step = layer->forward(h, batch, cache, forced);
    h = step.hidden;
    if (step.has_moe) {
      indices.push_back(step.moe.expert_indices);
      if (step.moe.aux_loss.defined()) aux = aux.defined() ? aux + step.moe.aux_loss : step.moe.aux_loss;
      out.router_stats.push_back(std::move(step.moe.stats));
      ++m;
    }
  }
  out.hidden = norm(h);
  torch::Tensor head_input = out.hidden;
  if (logit_rows.defined()) {
    MOERL_CHECK(logit_rows.dim() == 1 && logit_rows.scalar_type() == torch::kLong,
                "policy: logit_rows must be [K] int64 packed positions");
    out.logit_rows = logit_rows.device() == out.hidden.device() ? logit_rows : logit_rows.to(out.hidden.device());
    head_input = out.hidden.index_select(0, out.logit_rows);  // index_select checks the range
  }
  out.logits =
      lm_head.is_empty() ? torch::nn::functional::linear(head_input, embed_tokens->weight) : lm_head(head_input);
  // Log-probs, sampling and losses read float32 logits: a bfloat16 model's
  // are widened here, once, so that no caller takes a log-softmax over 8
  // mantissa bits (model/precision.h).
  const auto logits_dtype = out.logits.scalar_type();
  if (logits_dtype == torch::kBFloat16 || logits_dtype == torch::kHalf) out.logits = out.logits.to(torch::kFloat);
  if (!indices.empty()) out.expert_indices = torch::stack(indices, 1);  // [T, moe_layers, active experts]
  // 0 for a model without MoE layers; undefined for a cached forward.
  out.aux_loss = aux.defined() || cache != nullptr ? aux : torch::zeros({}, h.options());
  return out;
}

// ---------------------------------------------------------------- checkpoint names

std::vector<std::string> hf_checkpoint_names(const std::string& parameter_name, std::int64_t num_experts,
                                             CheckpointFamily family) {
  // One mapping for the whole code base: hf/hf_weights.h's, which export and
  // import use.
  const bool mixtral = family == CheckpointFamily::CheckpointMixtral;
  MOERL_CHECK(!mixtral || parameter_name.find(".mlp.shared_expert") == std::string::npos,
              "Mixtral checkpoints have no shared expert: " + parameter_name);
  return hf::hf_tensor_names(parameter_name, num_experts,
                             mixtral ? hf::Architecture::Mixtral : hf::Architecture::Qwen2Moe);
}

}  // namespace moerl::model
