#pragma once
// Hugging Face model directories as a model source: `[model] source =
// "hf:DIR"` reads DIR/config.json and sets the architecture keys of [model]
// and [moe] from it, for the architectures below. Also the reverse: the
// config.json that describes a policy, for `moerl checkpoint export-hf`.
// No LibTorch here (part of moerl_core); the weights are in hf/policy_io.h.
//
// config.json field              -> moerl key
//   hidden_size                     model.d_model
//   num_hidden_layers               model.num_layers
//   num_attention_heads             model.num_heads
//   num_key_value_heads             model.num_kv_heads
//   head_dim (when present)         model.head_dim
//   vocab_size                      model.vocab_size
//   max_position_embeddings         model.max_seq_len (unless set lower in the run config)
//   rope_theta / rope_parameters    model.rope_theta (rope scaling other than "default" is refused)
//   rms_norm_eps                    model.norm_eps
//   tie_word_embeddings             model.tie_embeddings
//   attention_bias / Qwen2's q,k,v  model.qkv_bias, model.o_bias
//   Qwen3 q_norm/k_norm per head    model.qk_norm = "head"; OLMoE over the projection: "full"
//   sliding_window (Mixtral)        model.sliding_window
//   num_local_experts / num_experts moe.num_experts
//   num_experts_per_tok             moe.top_k
//   intermediate_size (Mixtral, OLMoE) / moe_intermediate_size (Qwen)   moe.d_expert
//   intermediate_size (Qwen dense layers)                               model.d_ff
//   shared_expert_intermediate_size moe.shared_experts = 1, moe.d_shared_expert, moe.shared_expert_gate
//   norm_topk_prob (Mixtral: always) moe.renormalize
//   decoder_sparse_step             moe.sparse_step
//   mlp_only_layers (a prefix 0..n-1) moe.first_dense_layers = n

#include <cstdint>
#include <optional>
#include <string>

#include "moerl/config/config.h"
#include "moerl/core/error.h"
#include "moerl/core/json_value.h"

namespace moerl::hf {

class HfConfigError : public Error {
 public:
  using Error::Error;
};

enum class Architecture { Mixtral, Qwen2Moe, Qwen3Moe, Olmoe };

const char* architecture_class(Architecture arch);       // "MixtralForCausalLM", ...
const char* architecture_model_type(Architecture arch);  // "mixtral", "qwen2_moe", ...

// "hf:DIR" -> DIR; "" for any other source (the built-in model).
std::string hf_directory(const std::string& source);

struct HfModel {
  Architecture architecture = Architecture::Mixtral;
  config::ModelSection model;  // architecture keys from config.json, the rest at defaults
  config::MoeSection moe;
  JsonValue json;  // config.json as read
};

// Reads DIR/config.json. Throws HfConfigError naming the file and the field
// for an unknown architecture, a missing or mistyped field, a size out of
// range (negative, zero where that means nothing, beyond 2^53), or a feature
// moerl does not implement (rope scaling, Qwen sliding window, clip_qkv,
// an activation other than SiLU, non-prefix mlp_only_layers); and naming
// every size when together they overflow the parameter count or their
// float32 parameters exceed this machine's physical memory (sysconf).
HfModel read_hf_model(const std::string& dir);

// How many parameters a policy with these sections has (every tensor of
// policy_parameter_shapes in hf_weights.h, counted without listing them);
// nullopt when the count or a product on the way overflows 64 bits.
std::optional<std::uint64_t> parameter_count(const config::ModelSection& model, const config::MoeSection& moe);

// Copies the architecture keys of read_hf_model(DIR) into `config` when
// config.model.source is "hf:DIR" (no-op otherwise). A key the run config
// set explicitly to another value is an error (the checkpoint decides the
// architecture), except model.max_seq_len, which may be set lower.
void apply_hf_source(config::Config& config);

// The architecture a policy with these sections exports as: its source's
// when it came from an hf: directory, else the one that represents it
// exactly; throws naming the feature no supported architecture has.
Architecture export_architecture(const config::ModelSection& model, const config::MoeSection& moe);

// config.json text for these sections, with torch_dtype "float32". The
// special token ids (bos/eos/pad_token_id) are copied from `source` (the
// hf: source's config.json) when given, else written as null so that no
// architecture default (OLMoE's eos 50279) applies to another vocabulary.
std::string hf_config_json(Architecture arch, const config::ModelSection& model, const config::MoeSection& moe,
                           const JsonValue* source = nullptr);

}  // namespace moerl::hf
