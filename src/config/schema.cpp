// The table of every configuration section and key. To add a key: add the
// member (with its default) to the section struct in sections.h and one line
// here; validation, `config show` and `config reference` follow from it.

#include "moerl/config/schema.h"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "moerl/config/config.h"

namespace moerl::config {
namespace detail {
namespace {

std::string type_of(const toml::node& value) {
  switch (value.type()) {
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    default: return "nothing";
  }
}

}  // namespace

std::string read_integer(const toml::node& value, std::int64_t& out) {
  if (const auto* v = value.as_integer()) {
    out = v->get();
    return "";
  }
  return "expected an integer, got " + type_of(value);
}

std::string read_float(const toml::node& value, double& out) {
  // An integer is a fine float ("timeout_s = 60").
  if (const auto* v = value.as_floating_point()) {
    out = v->get();
    return "";
  }
  if (const auto* v = value.as_integer()) {
    out = static_cast<double>(v->get());
    return "";
  }
  return "expected a number, got " + type_of(value);
}

std::string read_boolean(const toml::node& value, bool& out) {
  if (const auto* v = value.as_boolean()) {
    out = v->get();
    return "";
  }
  return "expected true or false, got " + type_of(value);
}

std::string read_string(const toml::node& value, std::string& out) {
  if (const auto* v = value.as_string()) {
    out = v->get();
    return "";
  }
  return "expected a string, got " + type_of(value);
}

}  // namespace detail

std::string toml_string_literal(const std::string& text) {
  std::ostringstream out;
  out << toml::value<std::string>(text);
  return out.str();
}

std::string toml_float_literal(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buffer[40];
  std::snprintf(buffer, sizeof buffer, "%.17g", value);
  std::string text = buffer;
  // Shortest text that reads back to the same double, with a decimal point
  // so that TOML keeps it a float.
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buffer, sizeof buffer, "%.*g", precision, value);
    if (std::strtod(buffer, nullptr) == value) {
      text = buffer;
      break;
    }
  }
  if (text.find_first_of(".en") == std::string::npos) text += ".0";
  return text;
}

std::string FieldSpec::range_violation(const void* section) const {
  if (!numeric) return "";
  const double v = numeric(section);
  std::ostringstream out;
  if (minimum && (minimum_exclusive ? !(v > *minimum) : !(v >= *minimum))) {
    out << "must be " << (minimum_exclusive ? "> " : ">= ") << *minimum;
  } else if (maximum && !(v <= *maximum)) {
    out << "must be <= " << *maximum;
  } else {
    return "";
  }
  if (minimum && maximum) out << " (valid range " << *minimum << " to " << *maximum << ")";
  return out.str();
}

const FieldSpec* SectionSpec::find(const std::string& key) const {
  for (const FieldSpec& f : fields)
    if (f.key == key) return &f;
  return nullptr;
}

namespace {

SectionSpec run_section() {
  SectionSpec spec{"run", "Identity and placement of one run.", {}, {}, {}};
  SectionBuilder<RunSection> b(spec, &Config::run);
  b.field("name", &RunSection::name, "Run name; the run directory is output_dir/name.");
  b.field("output_dir", &RunSection::output_dir, "Directory that holds run directories.");
  b.field("seed", &RunSection::seed, "Global seed; each rank derives its own from it.").at_least(0);
  b.field("deterministic", &RunSection::deterministic,
          "Bitwise-reproducible runs (fixed reduction orders, one thread per op) at some speed cost.");
  return spec;
}

SectionSpec cluster_section() {
  SectionSpec spec{"cluster",
                   "Ranks per role. Layout: learners first, then actors, env workers, standby "
                   "actors; the sum must equal the MPI world size.",
                   {}, {}, {}};
  SectionBuilder<ClusterSection> b(spec, &Config::cluster);
  b.field("learners", &ClusterSection::learners, "Learner ranks (data parallel).").at_least(1);
  b.field("actors", &ClusterSection::actors, "Rollout actor ranks.").at_least(1);
  b.field("env_workers", &ClusterSection::env_workers, "Environment worker ranks.").at_least(1);
  b.field("standby_actors", &ClusterSection::standby_actors,
          "Idle actors that take over the sessions of a failed actor.")
      .at_least(0);
  b.field("threads_per_rank", &ClusterSection::threads_per_rank,
          "Compute threads per rank; 0 = cores on this host / ranks on this host.")
      .between(0, 1024);
  b.field("message_timeout_s", &ClusterSection::message_timeout_s,
          "Longest wait for an expected message before the job stops with an error naming the "
          "silent rank.")
      .greater_than(0);
  b.field("shutdown_timeout_s", &ClusterSection::shutdown_timeout_s,
          "How long a clean stop may take before the job is aborted.")
      .greater_than(0);
  return spec;
}

SectionSpec model_section() {
  SectionSpec spec{"model", "The decoder-only transformer policy.", {}, {}, {}};
  SectionBuilder<ModelSection> b(spec, &Config::model);
  b.field("vocab_size", &ModelSection::vocab_size,
          "Vocabulary size; the byte tokenizer needs 264 (256 bytes + 8 special tokens).")
      .at_least(2);
  b.field("d_model", &ModelSection::d_model, "Hidden size.").at_least(1);
  b.field("num_layers", &ModelSection::num_layers, "Transformer blocks.").at_least(1);
  b.field("num_heads", &ModelSection::num_heads, "Attention (query) heads.").at_least(1);
  b.field("num_kv_heads", &ModelSection::num_kv_heads,
          "Key/value heads (grouped-query attention); must divide num_heads.")
      .at_least(1);
  b.field("d_ff", &ModelSection::d_ff, "SwiGLU hidden size of dense feed-forward layers.")
      .at_least(1);
  b.field("max_seq_len", &ModelSection::max_seq_len, "Longest context in tokens.").at_least(2);
  b.field("rope_theta", &ModelSection::rope_theta, "Rotary embedding base.").greater_than(0);
  b.field("norm_eps", &ModelSection::norm_eps, "RMSNorm epsilon.").greater_than(0);
  b.field("tie_embeddings", &ModelSection::tie_embeddings,
          "Share the token embedding with the LM head.");
  b.field("init_std", &ModelSection::init_std, "Standard deviation of the weight initialisation.")
      .greater_than(0);
  return spec;
}

SectionSpec moe_section() {
  SectionSpec spec{"moe", "Mixture-of-experts feed-forward layers.", {}, {}, {}};
  SectionBuilder<MoeSection> b(spec, &Config::moe);
  b.field("enabled", &MoeSection::enabled, "Use MoE feed-forward layers (false: all dense).");
  b.field("num_experts", &MoeSection::num_experts, "Routed experts per MoE layer.").at_least(1);
  b.field("top_k", &MoeSection::top_k, "Experts active per token; at most num_experts.")
      .at_least(1);
  b.field("d_expert", &MoeSection::d_expert, "SwiGLU hidden size of one expert.").at_least(1);
  b.field("shared_experts", &MoeSection::shared_experts,
          "Always-active experts added to the routed ones.")
      .at_least(0);
  b.field("first_dense_layers", &MoeSection::first_dense_layers,
          "Leading layers that stay dense.")
      .at_least(0);
  b.choice("router", &MoeSection::router,
           {{"softmax_topk", RouterMode::SoftmaxThenTopK},
            {"topk_softmax", RouterMode::TopKThenSoftmax}},
           "Softmax over all experts then top-k, or top-k logits then softmax over them.");
  b.field("renormalize", &MoeSection::renormalize, "Gates over the chosen k sum to 1.");
  b.field("aux_loss_weight", &MoeSection::aux_loss_weight,
          "Weight of the Switch/GShard load-balancing loss.")
      .at_least(0);
  b.field("z_loss_weight", &MoeSection::z_loss_weight, "Weight of the router z-loss.")
      .at_least(0);
  b.field("capacity_factor", &MoeSection::capacity_factor,
          "0 = dropless; else each expert takes at most ceil(factor*tokens*k/experts) tokens and "
          "the rest are dropped (counted).")
      .at_least(0);
  b.field("block_size", &MoeSection::block_size,
          "Pad each expert's token segment to a multiple of this (GPU tiling).")
      .between(1, 1024);
  return spec;
}

SectionSpec telemetry_section() {
  SectionSpec spec{"telemetry", "Logs and metrics.", {}, {}, {}};
  SectionBuilder<TelemetrySection> b(spec, &Config::telemetry);
  b.choice("log_level", &TelemetrySection::log_level,
           {{"trace", LogLevel::Trace},
            {"debug", LogLevel::Debug},
            {"info", LogLevel::Info},
            {"warn", LogLevel::Warn},
            {"error", LogLevel::Error}},
           "Lowest level logged.");
  b.field("per_rank_log_files", &TelemetrySection::per_rank_log_files,
          "Also write <run dir>/logs/rank-N.log for every rank.");
  b.field("metrics_file", &TelemetrySection::metrics_file,
          "JSON-lines metrics file in the run directory, one line per step.");
  b.field("metrics_interval_s", &TelemetrySection::metrics_interval_s,
          "How often every rank reports its metrics to learner 0.")
      .greater_than(0);
  return spec;
}

SectionSpec faults_section() {
  SectionSpec spec{"faults",
                   "Deliberate failures for testing fault handling; off (-1) by default.", {}, {}, {}};
  SectionBuilder<FaultsSection> b(spec, &Config::faults);
  b.field("fail_rank", &FaultsSection::fail_rank,
          "This rank raises a fatal error once roles are assigned (-1: none).")
      .at_least(-1);
  b.field("hang_rank", &FaultsSection::hang_rank,
          "This rank stops answering messages, to exercise timeouts (-1: none).")
      .at_least(-1);
  return spec;
}

}  // namespace

const std::vector<SectionSpec>& all_sections() {
  static const std::vector<SectionSpec> sections = {
      run_section(), cluster_section(), model_section(), moe_section(), telemetry_section(),
      faults_section()};
  return sections;
}

const SectionSpec* find_section(const std::string& name) {
  for (const SectionSpec& s : all_sections())
    if (s.name == name) return &s;
  return nullptr;
}

}  // namespace moerl::config
