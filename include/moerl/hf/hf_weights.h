#pragma once
// moerl parameter names <-> Hugging Face tensor names, and writing a policy's
// weights as a Hugging Face model directory. No LibTorch (moerl_core): the
// export runs from checkpoint arrays; the loader into a live Policy is in
// model/hf_policy_loader.h.
//
// Names: HF prefixes all but lm_head.weight with "model."; Mixtral calls the
// MoE block block_sparse_moe and the expert projections w1 (gate), w3 (up),
// w2 (down); the Qwen families and OLMoE keep mlp.gate / mlp.experts.e.
// {gate,up,down}_proj. moerl stacks the experts of a layer into one
// [E, ...] parameter, which maps to E tensors.

#include <cstdint>
#include <string>
#include <vector>

#include "moerl/config/sections.h"
#include "moerl/hf/hf_config.h"
#include "moerl/hf/safetensors.h"

namespace moerl::hf {

// The tensor name(s) of a moerl parameter: one, or E for stacked experts
// (slice e along dim 0 is the e-th name).
std::vector<std::string> hf_tensor_names(const std::string& parameter, std::int64_t num_experts, Architecture arch);

// Tensors a checkpoint may hold that carry no weights moerl needs (rotary
// caches of old transformers versions).
bool is_ignorable_tensor(const std::string& name);

// The policy's parameters for these sections, by moerl name, in the order
// of model::Policy's named_parameters() (a torch test holds the two equal).
struct ParameterShape {
  std::string name;
  std::vector<std::int64_t> shape;
};
std::vector<ParameterShape> policy_parameter_shapes(const config::ModelSection& model, const config::MoeSection& moe);

// Where one parameter (or one expert's slice of a stacked parameter) comes
// from in a model directory.
struct TensorSource {
  std::size_t parameter = 0;  // index into the parameter list
  std::int64_t slice = -1;    // expert e of a stacked parameter; -1 = the whole parameter
  const SafetensorsFile* file = nullptr;
  const TensorInfo* tensor = nullptr;
};

// Matches every parameter to its tensor in `files` (named as `arch` names
// them). Throws HfConfigError listing every missing, mis-shaped or unexpected
// tensor with its file, so that a caller can check everything before it
// copies anything. A tied model ignores a stored lm_head.weight.
std::vector<TensorSource> plan_hf_load(const SafetensorsDirectory& files, const std::vector<ParameterShape>& parameters,
                                       std::int64_t num_experts, Architecture arch, bool tied_embeddings);

// A parameter with its own float32 values.
struct OwnedParameter {
  std::string name;
  std::vector<std::int64_t> shape;
  std::vector<float> values;
};

// The policy's parameters read from an hf: directory (F16/BF16 converted to
// float32), all checked first. For tools that need no LibTorch (import into
// a checkpoint store); the policy itself loads through model/hf_policy_loader.h.
std::vector<OwnedParameter> read_hf_parameters(const std::string& dir, const config::ModelSection& model,
                                               const config::MoeSection& moe);

// One float32 parameter (row-major), borrowed.
struct ParameterView {
  std::string name;  // moerl name, e.g. "layers.0.mlp.experts.gate_proj"
  std::vector<std::int64_t> shape;
  const float* data = nullptr;
};

struct ExportResult {
  Architecture architecture = Architecture::Mixtral;
  std::vector<std::string> shards;  // file names in out_dir
  std::vector<std::string> copied;  // tokenizer files copied from the hf: source
  std::uint64_t tensor_bytes = 0;
  std::size_t tensors = 0;
};

// Writes out_dir/config.json, sharded float32 safetensors
// (model-0000i-of-0000n.safetensors, at most max_shard_bytes of tensor data
// each) with model.safetensors.index.json, and copies the tokenizer and
// generation files when model.source is an hf: directory. Refuses (before
// writing anything) a policy no supported architecture represents exactly,
// and a parameter list that is not the policy's.
ExportResult export_hf_model(const std::vector<ParameterView>& parameters, const config::ModelSection& model,
                             const config::MoeSection& moe, const std::string& out_dir, std::uint64_t max_shard_bytes);

// The files copied from an hf: source next to the weights.
const std::vector<std::string>& tokenizer_file_names();

}  // namespace moerl::hf
