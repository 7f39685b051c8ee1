// config.json <-> [model]/[moe] for the supported Hugging Face MoE
// architectures (field names as transformers writes them; see hf_config.h).

#include "moerl/hf/hf_config.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "moerl/config/schema.h"
#include "moerl/core/json_writer.h"
#include "moerl/storage/atomic_file.h"

namespace moerl::hf {
namespace {

namespace fs = std::filesystem;

// Reads typed fields of one config.json; every error names the file and field.
class Fields {
 public:
  Fields(const JsonValue& json, std::string path) : json_(json), path_(std::move(path)) {}

  [[noreturn]] void fail(const std::string& field, const std::string& message) const {
    throw HfConfigError(path_ + ": " + (field.empty() ? "" : "field '" + field + "': ") + message);
  }

  std::optional<JsonValue> get(const std::string& field) const {
    std::optional<JsonValue> v = json_.find(field);
    if (v && v->is_null()) return std::nullopt;
    return v;
  }
  bool has(const std::string& field) const { return get(field).has_value(); }

  std::int64_t integer(const std::string& field) const {
    const std::optional<JsonValue> v = get(field);
    if (!v) fail(field, "missing");
    return to_integer(field, *v);
  }
  std::int64_t integer_or(const std::string& field, std::int64_t fallback) const {
    return has(field) ? integer(field) : fallback;
  }
  double number(const std::string& field) const {
    const std::optional<JsonValue> v = get(field);
    if (!v) fail(field, "missing");
    if (v->kind() != JsonValue::Kind::Number) fail(field, "expected a number");
    return v->as_number();
  }
  double number_or(const std::string& field, double fallback) const { return has(field) ? number(field) : fallback; }
  bool boolean_or(const std::string& field, bool fallback) const {
    const std::optional<JsonValue> v = get(field);
    if (!v) return fallback;
    if (v->kind() != JsonValue::Kind::Boolean) fail(field, "expected true or false");
    return v->as_bool();
  }
  std::string string_or(const std::string& field, const std::string& fallback) const {
    const std::optional<JsonValue> v = get(field);
    if (!v) return fallback;
    if (v->kind() != JsonValue::Kind::String) fail(field, "expected a string");
    return v->as_string();
  }
  std::int64_t to_integer(const std::string& field, const JsonValue& v) const {
    if (v.kind() != JsonValue::Kind::Number || std::floor(v.as_number()) != v.as_number()) {
      fail(field, "expected an integer");
    }
    // Beyond 2^53 a JSON number is no longer an exact integer (and beyond
    // 2^63 the conversion below would be undefined); no size is that large.
    constexpr double kLargestExact = 9007199254740992.0;  // 2^53
    if (std::fabs(v.as_number()) > kLargestExact) {
      fail(field, "expected an integer of at most 2^53, got " + number_text(v.as_number()));
    }
    return static_cast<std::int64_t>(v.as_number());
  }

  // A size: an integer >= minimum.
  std::int64_t size(const std::string& field, std::int64_t minimum, const std::string& hint = "") const {
    const std::int64_t value = integer(field);
    if (value < minimum) fail(field, "must be >= " + std::to_string(minimum) + ", got " + std::to_string(value) + hint);
    return value;
  }
  std::int64_t size_or(const std::string& field, std::int64_t fallback, std::int64_t minimum) const {
    return has(field) ? size(field, minimum) : fallback;
  }
  // A size that is a dimension of parameter tensors, remembered for the
  // parameter-count check's message.
  std::int64_t dimension(const std::string& field, std::int64_t minimum, const std::string& hint = "") {
    const std::int64_t value = size(field, minimum, hint);
    sizes_.emplace_back(field, value);
    return value;
  }
  std::int64_t dimension_or(const std::string& field, std::int64_t fallback, std::int64_t minimum) {
    return has(field) ? dimension(field, minimum) : fallback;
  }
  // "hidden_size 32, num_hidden_layers 3, ...": every dimension read, in reading order.
  std::string sizes_text() const {
    std::string text;
    for (const auto& [field, value] : sizes_) text += (text.empty() ? "" : ", ") + field + " " + std::to_string(value);
    return text;
  }

  const JsonValue& json() const { return json_; }

 private:
  static std::string number_text(double value) {
    char text[32];
    std::snprintf(text, sizeof text, "%.6g", value);
    return text;
  }

  JsonValue json_;
  std::string path_;
  std::vector<std::pair<std::string, std::int64_t>> sizes_;
};

Architecture architecture_of(const Fields& f) {
  const std::string type = f.string_or("model_type", "");
  if (type == "mixtral") return Architecture::Mixtral;
  if (type == "qwen2_moe") return Architecture::Qwen2Moe;
  if (type == "qwen3_moe") return Architecture::Qwen3Moe;
  if (type == "olmoe") return Architecture::Olmoe;
  f.fail("model_type", "unknown architecture '" + type + "' (supported: mixtral, qwen2_moe, qwen3_moe, olmoe)");
}

// rope_theta lives at the top level (transformers 4) or in rope_parameters
// (transformers 5); only unscaled rotary is implemented.
double rope_theta_of(const Fields& f, double fallback) {
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    const std::optional<JsonValue> rope = f.get(key);
    if (!rope) continue;
    if (!rope->is_object()) f.fail(key, "expected an object");
    Fields r(*rope, "");
    const std::string type = r.string_or("rope_type", r.string_or("type", "default"));
    if (type != "default") f.fail(key, "rope scaling '" + type + "' is not implemented (only unscaled rotary is)");
    if (r.has("rope_theta")) return r.number("rope_theta");
  }
  return f.number_or("rope_theta", fallback);
}

// Qwen layers: MoE unless listed in mlp_only_layers, every sparse_step-th.
// moerl describes dense layers as a prefix, so mlp_only_layers must be one.
void read_layer_pattern(Fields& f, config::ModelSection& m, config::MoeSection& e) {
  e.sparse_step = f.integer_or("decoder_sparse_step", 1);
  if (e.sparse_step < 1) f.fail("decoder_sparse_step", "must be >= 1");
  e.first_dense_layers = 0;
  if (const std::optional<JsonValue> only = f.get("mlp_only_layers")) {
    if (only->kind() != JsonValue::Kind::Array) f.fail("mlp_only_layers", "expected an array of layer indices");
    std::set<std::int64_t> layers;
    for (const JsonValue& v : only->as_array()) layers.insert(f.to_integer("mlp_only_layers", v));
    const auto n = static_cast<std::int64_t>(layers.size());
    if (n > 0 && (*layers.begin() != 0 || *layers.rbegin() != n - 1)) {
      f.fail("mlp_only_layers", "only a prefix 0..n-1 of dense layers is implemented");
    }
    e.first_dense_layers = n;
  }
  m.d_ff = f.dimension("intermediate_size", 1);
}

// Sliding windows: Mixtral's applies to every layer; Qwen's only with
// use_sliding_window, and then per layer (layer_types) -- moerl implements
// one window for all layers.
void read_sliding_window(const Fields& f, Architecture arch, config::ModelSection& m) {
  m.sliding_window = 0;
  if (arch == Architecture::Mixtral) {
    m.sliding_window = f.size_or("sliding_window", 0, 0);
    return;
  }
  if (!f.boolean_or("use_sliding_window", false)) return;
  if (arch == Architecture::Qwen2Moe) {
    const std::optional<JsonValue> types = f.get("layer_types");
    if (!types || types->kind() != JsonValue::Kind::Array) {
      f.fail("use_sliding_window", "needs layer_types to say which layers slide");
    }
    for (const JsonValue& t : types->as_array()) {
      if (t.kind() != JsonValue::Kind::String || t.as_string() != "sliding_attention") {
        f.fail("layer_types", "a mix of sliding and full attention layers is not implemented");
      }
    }
  }
  m.sliding_window = f.size("sliding_window", 0);
}

// transformers aliases num_experts and num_local_experts (which one a
// config.json holds depends on the architecture and the library version).
std::int64_t num_experts_of(Fields& f) {
  const char* hint = " (a dense model is not an MoE model)";
  return f.has("num_experts") ? f.dimension("num_experts", 1, hint) : f.dimension("num_local_experts", 1, hint);
}

// sysconf's physical memory; 0 when it cannot tell (then nothing is refused).
double physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page_size > 0 ? static_cast<double>(pages) * static_cast<double>(page_size) : 0.0;
}

// "4.0 GiB": byte counts for messages.
std::string bytes_text(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 6) {
    bytes /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.1f %s", bytes, units[unit]);
  return text;
}

// Sizes that overflow or whose float32 parameters would not fit this
// machine's physical memory are refused here, naming the sizes: otherwise
// they reach LibTorch's allocator (or wrap around in a product) and end as
// an allocation failure with a stack trace.
void check_parameter_budget(const Fields& f, const config::ModelSection& m, const config::MoeSection& e) {
  const std::optional<std::uint64_t> count = parameter_count(m, e);
  if (!count) f.fail("", "the sizes (" + f.sizes_text() + ") give more parameters than a 64-bit count holds");
  const double bytes = static_cast<double>(*count) * sizeof(float);
  const double memory = physical_memory_bytes();
  if (memory > 0 && bytes > memory) {
    char estimate[64];
    std::snprintf(estimate, sizeof estimate, "%.3g parameters", static_cast<double>(*count));
    f.fail("", "the sizes (" + f.sizes_text() + ") give " + estimate + ", " + bytes_text(bytes) +
                   " as float32, more than this machine's " + bytes_text(memory) + " of physical memory");
  }
}

// Unsigned 64-bit arithmetic that remembers an overflow instead of wrapping.
class Count {
 public:
  Count(std::int64_t value)
      : value_(value < 0 ? 0 : static_cast<std::uint64_t>(value)) {}  // NOLINT: implicit on purpose
  friend Count operator*(Count a, Count b) {
    a.overflow_ = a.overflow_ || b.overflow_ || __builtin_mul_overflow(a.value_, b.value_, &a.value_);
    return a;
  }
  friend Count operator+(Count a, Count b) {
    a.overflow_ = a.overflow_ || b.overflow_ || __builtin_add_overflow(a.value_, b.value_, &a.value_);
    return a;
  }
  std::optional<std::uint64_t> value() const { return overflow_ ? std::nullopt : std::optional<std::uint64_t>(value_); }

 private:
  std::uint64_t value_ = 0;
  bool overflow_ = false;
};

// Layers l in [first_dense_layers, num_layers) with (l + 1) % sparse_step == 0
// (hf_weights.cpp's moe_layer), counted without a loop over the layers.
std::int64_t moe_layer_count(const config::ModelSection& m, const config::MoeSection& e) {
  if (!e.enabled) return 0;
  const std::int64_t step = std::max<std::int64_t>(e.sparse_step, 1);
  const std::int64_t first = std::clamp<std::int64_t>(e.first_dense_layers, 0, m.num_layers);
  return m.num_layers / step - first / step;
}

}  // namespace

std::optional<std::uint64_t> parameter_count(const config::ModelSection& m, const config::MoeSection& e) {
  const Count d = m.d_model;
  const Count hd = m.head_dim > 0 ? m.head_dim : m.d_model / std::max<std::int64_t>(m.num_heads, 1);
  const Count q = Count(m.num_heads) * hd, kv = Count(m.num_kv_heads) * hd;
  Count attention = d + q * d + Count(2) * kv * d + d * q + d;  // the two norms, q/k/v and o
  if (m.qkv_bias) attention = attention + q + Count(2) * kv;
  if (m.o_bias) attention = attention + d;
  if (m.qk_norm == config::QkNorm::PerHead) attention = attention + Count(2) * hd;
  if (m.qk_norm == config::QkNorm::Full) attention = attention + q + kv;
  Count moe_mlp = Count(e.num_experts) * d + Count(3) * Count(e.num_experts) * Count(e.d_expert) * d;
  if (e.shared_experts > 0) {
    const Count shared = e.d_shared_expert > 0 ? Count(e.d_shared_expert) : Count(e.shared_experts) * Count(e.d_expert);
    moe_mlp = moe_mlp + Count(3) * shared * d;
    if (e.shared_expert_gate) moe_mlp = moe_mlp + d;
  }
  const Count dense_mlp = Count(3) * Count(m.d_ff) * d;
  const std::int64_t moe_layers = moe_layer_count(m, e);
  const Count embeddings = Count(m.vocab_size) * d * Count(m.tie_embeddings ? 1 : 2);
  return (embeddings + d + Count(m.num_layers) * attention + Count(moe_layers) * moe_mlp +
          Count(m.num_layers - moe_layers) * dense_mlp)
      .value();
}

const char* architecture_class(Architecture arch) {
  switch (arch) {
    case Architecture::Mixtral: return "MixtralForCausalLM";
    case Architecture::Qwen2Moe: return "Qwen2MoeForCausalLM";
    case Architecture::Qwen3Moe: return "Qwen3MoeForCausalLM";
    case Architecture::Olmoe: return "OlmoeForCausalLM";
  }
  return "?";
}

const char* architecture_model_type(Architecture arch) {
  switch (arch) {
    case Architecture::Mixtral: return "mixtral";
    case Architecture::Qwen2Moe: return "qwen2_moe";
    case Architecture::Qwen3Moe: return "qwen3_moe";
    case Architecture::Olmoe: return "olmoe";
  }
  return "?";
}

std::string hf_directory(const std::string& source) {
  return source.rfind("hf:", 0) == 0 ? source.substr(3) : std::string();
}

HfModel read_hf_model(const std::string& dir) {
  const std::string path = (fs::path(dir) / "config.json").string();
  if (!fs::exists(path)) throw HfConfigError(path + ": not found (an hf: source needs DIR/config.json)");
  HfModel out;
  try {
    out.json = JsonValue::parse(storage::read_whole_file(path));
  } catch (const JsonError& error) {
    throw HfConfigError(path + ": not valid JSON: " + error.what());
  }
  if (!out.json.is_object()) throw HfConfigError(path + ": not a JSON object");
  Fields f(out.json, path);
  const Architecture arch = architecture_of(f);
  out.architecture = arch;
  config::ModelSection& m = out.model;
  config::MoeSection& e = out.moe;

  const std::string act = f.string_or("hidden_act", "silu");
  if (act != "silu") f.fail("hidden_act", "'" + act + "' is not implemented (experts are SwiGLU: silu)");
  if (f.has("clip_qkv")) f.fail("clip_qkv", "clipping q/k/v is not implemented");
  if (f.number_or("router_jitter_noise", 0.0) != 0.0) f.fail("router_jitter_noise", "router jitter is not implemented");

  m.vocab_size = f.dimension("vocab_size", 2);
  m.d_model = f.dimension("hidden_size", 1);
  m.num_layers = f.dimension("num_hidden_layers", 1);
  m.num_heads = f.dimension("num_attention_heads", 1);
  m.num_kv_heads = f.dimension_or("num_key_value_heads", m.num_heads, 1);
  m.head_dim = f.dimension_or("head_dim", 0, 0);
  if (m.head_dim == m.d_model / std::max<std::int64_t>(m.num_heads, 1) &&
      m.d_model % std::max<std::int64_t>(m.num_heads, 1) == 0) {
    m.head_dim = 0;  // the default: keep configs of built-in-shaped models minimal
  }
  m.max_seq_len = f.size("max_position_embeddings", 2);
  const double default_theta = arch == Architecture::Mixtral ? 1e6 : 1e4;
  m.rope_theta = rope_theta_of(f, default_theta);
  m.norm_eps = f.number("rms_norm_eps");
  m.tie_embeddings = f.boolean_or("tie_word_embeddings", false);
  read_sliding_window(f, arch, m);

  e.enabled = true;
  e.top_k = f.integer("num_experts_per_tok");
  e.router = config::RouterMode::SoftmaxThenTopK;
  e.shared_experts = 0;
  e.d_shared_expert = 0;
  e.shared_expert_gate = false;
  e.first_dense_layers = 0;
  e.sparse_step = 1;
  switch (arch) {
    case Architecture::Mixtral:
      e.num_experts = num_experts_of(f);
      e.d_expert = f.dimension("intermediate_size", 1);
      e.renormalize = true;  // Mixtral always renormalises the top-k
      m.d_ff = e.d_expert;   // no dense layers; keep the key meaningful
      break;
    case Architecture::Qwen2Moe:
      e.num_experts = num_experts_of(f);
      e.d_expert = f.dimension("moe_intermediate_size", 1);
      e.renormalize = f.boolean_or("norm_topk_prob", false);
      m.qkv_bias = f.boolean_or("qkv_bias", true);
      e.d_shared_expert = f.dimension("shared_expert_intermediate_size", 0);
      if (e.d_shared_expert > 0) {
        e.shared_experts = 1;
        e.shared_expert_gate = true;
      }
      read_layer_pattern(f, m, e);
      break;
    case Architecture::Qwen3Moe:
      e.num_experts = num_experts_of(f);
      e.d_expert = f.dimension("moe_intermediate_size", 1);
      e.renormalize = f.boolean_or("norm_topk_prob", false);
      m.qk_norm = config::QkNorm::PerHead;
      m.qkv_bias = m.o_bias = f.boolean_or("attention_bias", false);
      read_layer_pattern(f, m, e);
      break;
    case Architecture::Olmoe:
      e.num_experts = num_experts_of(f);
      e.d_expert = f.dimension("intermediate_size", 1);
      e.renormalize = f.boolean_or("norm_topk_prob", false);
      m.qk_norm = config::QkNorm::Full;
      m.qkv_bias = m.o_bias = f.boolean_or("attention_bias", false);
      m.d_ff = e.d_expert;
      if (m.head_dim != 0)
        f.fail("head_dim", "OLMoE normalises q over hidden_size: head_dim must be hidden_size / heads");
      break;
  }
  if (e.top_k < 1 || e.top_k > e.num_experts) f.fail("num_experts_per_tok", "must be in [1, num_experts]");
  if (e.first_dense_layers >= m.num_layers) f.fail("mlp_only_layers", "leaves no MoE layer");
  check_parameter_budget(f, m, e);
  return out;
}

void apply_hf_source(config::Config& config) {
  const std::string dir = hf_directory(config.model.source);
  if (dir.empty()) {
    if (!config.model.source.empty()) {
      throw HfConfigError("model.source '" + config.model.source + "': expected \"\" or \"hf:DIR\"");
    }
    return;
  }
  const HfModel hf = read_hf_model(dir);
  std::vector<std::string> conflicts;
  // Sets one key; a value set explicitly in the run config must agree.
  auto take = [&](const std::string& key, auto& target, const auto& value) {
    if (config.origins.count(key) && !(target == value)) {
      std::ostringstream text;
      text << key << " (the run config says " << target << ", config.json " << value << ")";
      conflicts.push_back(text.str());
    }
    target = value;
  };
  config::ModelSection& m = config.model;
  config::MoeSection& e = config.moe;
  take("model.vocab_size", m.vocab_size, hf.model.vocab_size);
  take("model.d_model", m.d_model, hf.model.d_model);
  take("model.num_layers", m.num_layers, hf.model.num_layers);
  take("model.num_heads", m.num_heads, hf.model.num_heads);
  take("model.num_kv_heads", m.num_kv_heads, hf.model.num_kv_heads);
  take("model.head_dim", m.head_dim, hf.model.head_dim);
  take("model.d_ff", m.d_ff, hf.model.d_ff);
  take("model.rope_theta", m.rope_theta, hf.model.rope_theta);
  take("model.norm_eps", m.norm_eps, hf.model.norm_eps);
  take("model.tie_embeddings", m.tie_embeddings, hf.model.tie_embeddings);
  take("model.qkv_bias", m.qkv_bias, hf.model.qkv_bias);
  take("model.o_bias", m.o_bias, hf.model.o_bias);
  take("model.sliding_window", m.sliding_window, hf.model.sliding_window);
  if (config.origins.count("model.qk_norm") && m.qk_norm != hf.model.qk_norm) conflicts.push_back("model.qk_norm");
  m.qk_norm = hf.model.qk_norm;
  // A shorter context than the model's is a run choice; a longer one is not.
  if (!config.origins.count("model.max_seq_len") || m.max_seq_len > hf.model.max_seq_len) {
    m.max_seq_len = hf.model.max_seq_len;
  }
  take("moe.enabled", e.enabled, hf.moe.enabled);
  take("moe.num_experts", e.num_experts, hf.moe.num_experts);
  take("moe.top_k", e.top_k, hf.moe.top_k);
  take("moe.d_expert", e.d_expert, hf.moe.d_expert);
  take("moe.shared_experts", e.shared_experts, hf.moe.shared_experts);
  take("moe.d_shared_expert", e.d_shared_expert, hf.moe.d_shared_expert);
  take("moe.shared_expert_gate", e.shared_expert_gate, hf.moe.shared_expert_gate);
  take("moe.first_dense_layers", e.first_dense_layers, hf.moe.first_dense_layers);
  take("moe.sparse_step", e.sparse_step, hf.moe.sparse_step);
  take("moe.renormalize", e.renormalize, hf.moe.renormalize);
  if (config.origins.count("moe.router") && e.router != hf.moe.router) conflicts.push_back("moe.router");
  e.router = hf.moe.router;
  if (!conflicts.empty()) {
    std::string text = (fs::path(dir) / "config.json").string() + " decides the architecture, but the run config sets:";
    for (const auto& c : conflicts) text += " " + c + ";";
    text += " remove those keys or make them agree";
    // The one architecture key with a run-time counterpart.
    if (std::any_of(conflicts.begin(), conflicts.end(),
                    [](const std::string& c) { return c.rfind("moe.top_k", 0) == 0; }))
      text += " (rollout.moe_top_k sets the experts per token of rollouts; the learner keeps config.json's)";
    throw HfConfigError(text);
  }
}

Architecture export_architecture(const config::ModelSection& m, const config::MoeSection& e) {
  const std::string dir = hf_directory(m.source);
  if (!dir.empty() && fs::exists(fs::path(dir) / "config.json")) return read_hf_model(dir).architecture;
  auto refuse = [](const std::string& what) -> Architecture {
    throw HfConfigError("cannot export as a Hugging Face model: " + what);
  };
  if (!e.enabled) return refuse("moe.enabled = false (a dense model; the supported architectures are MoE)");
  if (m.sliding_window != 0 && (m.qk_norm != config::QkNorm::None || e.shared_experts > 0)) {
    return refuse("sliding_window with QK-norm or shared experts");
  }
  if (e.shared_experts > 0) {
    if (!e.shared_expert_gate || e.shared_experts != 1) {
      return refuse("a shared expert without Qwen2-MoE's sigmoid gate (moe.shared_expert_gate = false)");
    }
    if (m.qk_norm != config::QkNorm::None || m.o_bias) return refuse("a shared expert with QK-norm or an o_proj bias");
    return Architecture::Qwen2Moe;  // q/k/v biases are written as zeros when the policy has none
  }
  const bool renormalized = e.renormalize || e.router == config::RouterMode::TopKThenSoftmax;
  if (m.qk_norm != config::QkNorm::None && m.qkv_bias != m.o_bias) {
    return refuse("Qwen3-MoE and OLMoE have one attention_bias for q, k, v and o (model.qkv_bias != model.o_bias)");
  }
  if (m.qk_norm == config::QkNorm::PerHead) return Architecture::Qwen3Moe;
  if (m.qk_norm == config::QkNorm::Full) {
    if (e.first_dense_layers != 0 || e.sparse_step != 1) return refuse("QK-norm over the projection with dense layers");
    if (m.head_dim != 0) return refuse("OLMoE needs head_dim = d_model / num_heads");
    return Architecture::Olmoe;
  }
  if (m.qkv_bias != m.o_bias) return refuse("q/k/v biases without an o_proj bias and without a shared expert");
  if (!m.qkv_bias && renormalized && e.first_dense_layers == 0 && e.sparse_step == 1) return Architecture::Mixtral;
  return refuse(
      "no QK-norm but Qwen3-MoE and OLMoE need it, and Mixtral has no biases, dense layers or "
      "un-renormalised gates");
}

std::string hf_config_json(Architecture arch, const config::ModelSection& m, const config::MoeSection& e,
                           const JsonValue* source) {
  JsonWriter w;
  w.begin_object();
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
    const std::optional<JsonValue> id = source != nullptr ? source->find(key) : std::nullopt;
    w.key(key);
    if (id && id->kind() == JsonValue::Kind::Number) {
      w.value(static_cast<std::int64_t>(id->as_number()));
    } else if (id && id->kind() == JsonValue::Kind::Array) {
      w.begin_array();
      for (const JsonValue& v : id->as_array())
        if (v.kind() == JsonValue::Kind::Number) w.value(static_cast<std::int64_t>(v.as_number()));
      w.end_array();
    } else {
      w.null();
    }
  }
  w.key("architectures").begin_array().value(architecture_class(arch)).end_array();
  w.key("model_type").value(architecture_model_type(arch));
  w.key("dtype").value("float32");
  w.key("torch_dtype").value("float32");
  w.key("hidden_act").value("silu");
  w.key("vocab_size").value(m.vocab_size);
  w.key("hidden_size").value(m.d_model);
  w.key("num_hidden_layers").value(m.num_layers);
  w.key("num_attention_heads").value(m.num_heads);
  w.key("num_key_value_heads").value(m.num_kv_heads);
  w.key("head_dim").value(m.head_dim != 0 ? m.head_dim : m.d_model / m.num_heads);
  w.key("max_position_embeddings").value(m.max_seq_len);
  w.key("rms_norm_eps").value(m.norm_eps);
  w.key("rope_theta").value(m.rope_theta);
  w.key("rope_parameters")
      .begin_object()
      .key("rope_type")
      .value("default")
      .key("rope_theta")
      .value(m.rope_theta)
      .end_object();
  w.key("tie_word_embeddings").value(m.tie_embeddings);
  w.key("num_experts_per_tok").value(e.top_k);
  w.key("initializer_range").value(m.init_std);
  w.key("attention_dropout").value(0.0);
  w.key("use_cache").value(true);
  auto qwen_layers = [&] {
    w.key("decoder_sparse_step").value(e.sparse_step);
    w.key("mlp_only_layers").begin_array();
    for (std::int64_t l = 0; l < e.first_dense_layers; ++l) w.value(l);
    w.end_array();
    w.key("intermediate_size").value(m.d_ff);
    w.key("moe_intermediate_size").value(e.d_expert);
    w.key("num_experts").value(e.num_experts);
    w.key("norm_topk_prob").value(e.renormalize);
    w.key("use_sliding_window").value(m.sliding_window != 0);
    w.key("sliding_window").value(m.sliding_window != 0 ? m.sliding_window : std::int64_t{4096});
  };
  switch (arch) {
    case Architecture::Mixtral:
      w.key("num_local_experts").value(e.num_experts);
      w.key("intermediate_size").value(e.d_expert);
      if (m.sliding_window != 0)
        w.key("sliding_window").value(m.sliding_window);
      else
        w.key("sliding_window").null();
      break;
    case Architecture::Qwen2Moe:
      qwen_layers();
      w.key("qkv_bias").value(true);
      w.key("shared_expert_intermediate_size")
          .value(e.d_shared_expert != 0 ? e.d_shared_expert : e.shared_experts * e.d_expert);
      w.key("max_window_layers").value(m.num_layers);
      break;
    case Architecture::Qwen3Moe:
      qwen_layers();
      w.key("attention_bias").value(m.qkv_bias);
      break;
    case Architecture::Olmoe:
      w.key("intermediate_size").value(e.d_expert);
      w.key("num_experts").value(e.num_experts);
      w.key("norm_topk_prob").value(e.renormalize);
      w.key("attention_bias").value(m.qkv_bias);
      w.key("clip_qkv").null();
      break;
  }
  w.end_object();
  return w.str();
}

}  // namespace moerl::hf
