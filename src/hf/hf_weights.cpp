// Parameter names <-> Hugging Face tensor names, and the export of a
// policy's float32 parameters as a Hugging Face model directory.

#include "moerl/hf/hf_weights.h"

#include <filesystem>
#include <map>
#include <set>

#include "moerl/core/string_affixes.h"
#include "moerl/hf/safetensors.h"
#include "moerl/storage/atomic_file.h"

namespace moerl::hf {
namespace {

namespace fs = std::filesystem;

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::int64_t numel(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

bool moe_layer(const config::MoeSection& moe, std::int64_t layer) {
  // Mirrors model::is_moe_layer (moerl_torch); policy_parameter_shapes'
  // test holds them equal.
  if (!moe.enabled || layer < moe.first_dense_layers) return false;
  return (layer + 1) % std::max<std::int64_t>(moe.sparse_step, 1) == 0;
}

}  // namespace

std::vector<std::string> hf_tensor_names(const std::string& parameter, std::int64_t num_experts, Architecture arch) {
  if (parameter == "lm_head.weight") return {parameter};
  std::string name = "model." + parameter;
  const auto experts_pos = name.find(".mlp.experts.");
  const bool router = name.find(".mlp.gate.") != std::string::npos;
  const bool mixtral = arch == Architecture::Mixtral;
  if (mixtral && (router || experts_pos != std::string::npos)) {
    name.replace(name.find(".mlp."), 5, ".block_sparse_moe.");
  }
  if (experts_pos == std::string::npos) return {name};
  // Stacked experts: layers.N.mlp.experts.<proj> -> one name per expert.
  const std::string marker = ".experts.";
  const auto pos = name.find(marker);
  const std::string prefix = name.substr(0, pos + marker.size());
  std::string proj = name.substr(pos + marker.size());
  if (mixtral) {
    proj = proj == "gate_proj" ? "w1" : proj == "down_proj" ? "w2" : proj == "up_proj" ? "w3" : proj;
  }
  std::vector<std::string> names;
  for (std::int64_t e = 0; e < num_experts; ++e) names.push_back(prefix + std::to_string(e) + "." + proj + ".weight");
  return names;
}

bool is_ignorable_tensor(const std::string& name) { return ends_with(name, "rotary_emb.inv_freq"); }

std::vector<ParameterShape> policy_parameter_shapes(const config::ModelSection& m, const config::MoeSection& e) {
  const std::int64_t d = m.d_model;
  const std::int64_t hd = m.head_dim > 0 ? m.head_dim : m.d_model / m.num_heads;
  const std::int64_t q = m.num_heads * hd, kv = m.num_kv_heads * hd;
  std::vector<ParameterShape> out;
  out.push_back({"embed_tokens.weight", {m.vocab_size, d}});
  for (std::int64_t l = 0; l < m.num_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    out.push_back({p + "input_layernorm.weight", {d}});
    const std::pair<const char*, std::int64_t> projections[] = {{"q_proj", q}, {"k_proj", kv}, {"v_proj", kv}};
    for (const auto& [proj, rows] : projections) {
      out.push_back({p + "self_attn." + proj + ".weight", {rows, d}});
      if (m.qkv_bias) out.push_back({p + "self_attn." + proj + ".bias", {rows}});
    }
    out.push_back({p + "self_attn.o_proj.weight", {d, q}});
    if (m.o_bias) out.push_back({p + "self_attn.o_proj.bias", {d}});
    if (m.qk_norm == config::QkNorm::PerHead) {
      out.push_back({p + "self_attn.q_norm.weight", {hd}});
      out.push_back({p + "self_attn.k_norm.weight", {hd}});
    } else if (m.qk_norm == config::QkNorm::Full) {
      out.push_back({p + "self_attn.q_norm.weight", {q}});
      out.push_back({p + "self_attn.k_norm.weight", {kv}});
    }
    out.push_back({p + "post_attention_layernorm.weight", {d}});
    if (moe_layer(e, l)) {
      out.push_back({p + "mlp.gate.weight", {e.num_experts, d}});
      out.push_back({p + "mlp.experts.gate_proj", {e.num_experts, e.d_expert, d}});
      out.push_back({p + "mlp.experts.up_proj", {e.num_experts, e.d_expert, d}});
      out.push_back({p + "mlp.experts.down_proj", {e.num_experts, d, e.d_expert}});
      if (e.shared_experts > 0) {
        const std::int64_t ds = e.d_shared_expert > 0 ? e.d_shared_expert : e.shared_experts * e.d_expert;
        out.push_back({p + "mlp.shared_expert.gate_proj.weight", {ds, d}});
        out.push_back({p + "mlp.shared_expert.up_proj.weight", {ds, d}});
        out.push_back({p + "mlp.shared_expert.down_proj.weight", {d, ds}});
        if (e.shared_expert_gate) out.push_back({p + "mlp.shared_expert_gate.weight", {1, d}});
      }
    } else {
      out.push_back({p + "mlp.gate_proj.weight", {m.d_ff, d}});
      out.push_back({p + "mlp.up_proj.weight", {m.d_ff, d}});
      out.push_back({p + "mlp.down_proj.weight", {d, m.d_ff}});
    }
  }
  out.push_back({"norm.weight", {d}});
  if (!m.tie_embeddings) out.push_back({"lm_head.weight", {m.vocab_size, d}});
  return out;
}

std::vector<TensorSource> plan_hf_load(const SafetensorsDirectory& files, const std::vector<ParameterShape>& parameters,
                                       std::int64_t num_experts, Architecture arch, bool tied_embeddings) {
  std::vector<TensorSource> plan;
  std::set<std::string> used;
  std::string problems;
  for (std::size_t p = 0; p < parameters.size(); ++p) {
    const ParameterShape& parameter = parameters[p];
    const std::vector<std::string> names = hf_tensor_names(parameter.name, num_experts, arch);
    const bool stacked = parameter.name.find(".mlp.experts.") != std::string::npos;
    const std::vector<std::int64_t> want(parameter.shape.begin() + (stacked ? 1 : 0), parameter.shape.end());
    for (std::size_t i = 0; i < names.size(); ++i) {
      const std::string& name = names[i];
      used.insert(name);
      if (!files.contains(name)) {
        problems += "\n  missing tensor '" + name + "' (moerl parameter " + parameter.name + ")";
        continue;
      }
      const SafetensorsFile& file = files.file_of(name);
      const TensorInfo& info = file.info(name);
      if (info.shape != want) {
        problems += "\n  " + file.path() + ": tensor '" + name + "' has shape " + shape_text(info.shape) +
                    ", config.json's architecture needs " + shape_text(want);
        continue;
      }
      plan.push_back({p, stacked ? static_cast<std::int64_t>(i) : -1, &file, &info});
    }
  }
  for (const std::string& name : files.tensor_names()) {
    if (used.count(name) || is_ignorable_tensor(name) || (tied_embeddings && name == "lm_head.weight")) continue;
    problems += "\n  " + files.file_of(name).path() + ": unexpected tensor '" + name + "' (not part of the " +
                architecture_class(arch) + " described by config.json)";
  }
  if (!problems.empty()) {
    throw HfConfigError(files.directory() + ": cannot load the weights; nothing was loaded:" + problems);
  }
  return plan;
}

std::vector<OwnedParameter> read_hf_parameters(const std::string& dir, const config::ModelSection& model,
                                               const config::MoeSection& moe) {
  const Architecture arch = read_hf_model(dir).architecture;
  const SafetensorsDirectory files(dir);
  const std::vector<ParameterShape> shapes = policy_parameter_shapes(model, moe);
  const std::vector<TensorSource> plan = plan_hf_load(files, shapes, moe.num_experts, arch, model.tie_embeddings);
  std::vector<OwnedParameter> out;
  for (const ParameterShape& s : shapes) {
    out.push_back({s.name, s.shape, std::vector<float>(static_cast<std::size_t>(numel(s.shape)))});
  }
  for (const TensorSource& source : plan) {
    OwnedParameter& p = out[source.parameter];
    const std::size_t count = static_cast<std::size_t>(source.tensor->numel());
    float* dst = p.values.data() + (source.slice < 0 ? 0 : static_cast<std::size_t>(source.slice) * count);
    to_float32(source.tensor->dtype, source.file->data(*source.tensor), count, dst);
  }
  return out;
}

const std::vector<std::string>& tokenizer_file_names() {
  static const std::vector<std::string> names = {
      "tokenizer.json", "tokenizer_config.json",  "special_tokens_map.json", "added_tokens.json", "vocab.json",
      "merges.txt",     "generation_config.json", "chat_template.jinja"};
  return names;
}

ExportResult export_hf_model(const std::vector<ParameterView>& parameters, const config::ModelSection& model,
                             const config::MoeSection& moe, const std::string& out_dir, std::uint64_t max_shard_bytes) {
  ExportResult result;
  result.architecture = export_architecture(model, moe);
  const Architecture arch = result.architecture;

  // The parameters must be exactly the policy's: checked before writing.
  std::map<std::string, const ParameterView*> given;
  for (const ParameterView& p : parameters) given[p.name] = &p;
  std::string problems;
  std::set<std::string> expected_names;
  for (const ParameterShape& want : policy_parameter_shapes(model, moe)) {
    expected_names.insert(want.name);
    const auto it = given.find(want.name);
    if (it == given.end()) {
      problems += "\n  missing parameter " + want.name;
    } else if (it->second->shape != want.shape) {
      problems += "\n  " + want.name + " has shape " + shape_text(it->second->shape) + ", the model needs " +
                  shape_text(want.shape);
    }
  }
  for (const auto& [name, view] : given) {
    if (!expected_names.count(name)) problems += "\n  unexpected parameter " + name;
  }
  if (!problems.empty()) throw HfConfigError("cannot export to " + out_dir + ":" + problems);

  // Qwen2-MoE always has q/k/v biases: a policy without them exports zeros.
  std::vector<std::vector<float>> zeros;
  std::vector<TensorToWrite> tensors;
  for (const ParameterShape& want : policy_parameter_shapes(model, moe)) {
    const ParameterView& p = *given.at(want.name);
    const std::vector<std::string> names = hf_tensor_names(p.name, moe.num_experts, arch);
    std::vector<std::int64_t> shape = p.shape;
    std::size_t count = static_cast<std::size_t>(numel(shape));
    if (names.size() > 1 || p.name.find(".mlp.experts.") != std::string::npos) {
      shape.erase(shape.begin());
      count /= names.size();
    }
    for (std::size_t i = 0; i < names.size(); ++i) {
      tensors.push_back({names[i], DType::F32, shape, p.data + i * count, count * sizeof(float)});
    }
    const bool add_bias = arch == Architecture::Qwen2Moe && !model.qkv_bias &&
                          (ends_with(p.name, "q_proj.weight") || ends_with(p.name, "k_proj.weight") ||
                           ends_with(p.name, "v_proj.weight"));
    if (add_bias) {
      zeros.emplace_back(static_cast<std::size_t>(p.shape[0]), 0.0f);
      std::string bias = names[0];
      bias.replace(bias.size() - 6, 6, "bias");
      tensors.push_back({bias, DType::F32, {p.shape[0]}, zeros.back().data(), zeros.back().size() * sizeof(float)});
    }
  }
  const std::string source = hf_directory(model.source);
  const HfModel source_model = source.empty() ? HfModel{} : read_hf_model(source);
  fs::create_directories(out_dir);
  storage::write_file_atomically(
      (fs::path(out_dir) / "config.json").string(),
      hf_config_json(arch, model, moe, source.empty() ? nullptr : &source_model.json) + "\n");
  result.shards = write_sharded_safetensors(out_dir, tensors, max_shard_bytes, {{"format", "pt"}});
  for (const TensorToWrite& t : tensors) result.tensor_bytes += t.bytes;
  result.tensors = tensors.size();
  if (!source.empty()) {
    for (const std::string& file : tokenizer_file_names()) {
      const fs::path from = fs::path(source) / file;
      if (!fs::exists(from)) continue;
      fs::copy_file(from, fs::path(out_dir) / file, fs::copy_options::overwrite_existing);
      result.copied.push_back(file);
    }
  }
  return result;
}

}  // namespace moerl::hf
