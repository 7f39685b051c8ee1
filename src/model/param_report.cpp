#include "moerl/model/param_report.h"

#include <cstdio>
#include <sstream>

#include "moerl/core/check.h"
#include "moerl/model/policy.h"

namespace moerl::model {

namespace {

const std::vector<std::string>& component_names() {
  static const std::vector<std::string> names{"embedding", "attention",      "norms",          "dense_ffn",
                                              "router",    "routed_experts", "shared_experts", "lm_head"};
  return names;
}

ParameterReport empty_report() {
  ParameterReport report;
  for (const std::string& name : component_names()) report.components.push_back({name, 0, 0});
  return report;
}

ParameterCount& row(ParameterReport& report, const std::string& name) {
  for (ParameterCount& c : report.components)
    if (c.component == name) return c;
  MOERL_CHECK(false, "parameter report: unknown component " + name);
  return report.components.front();
}

void add(ParameterReport& report, const std::string& name, std::int64_t total, std::int64_t active) {
  ParameterCount& c = row(report, name);
  c.total += total;
  c.active += active;
  report.total += total;
  report.active += active;
}

std::string human(std::int64_t n) {
  char buf[32];
  const double v = static_cast<double>(n);
  if (v >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2fB", v / 1e9);
  else if (v >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  else if (v >= 1e3)
    std::snprintf(buf, sizeof buf, "%.2fK", v / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(n));
  return buf;
}

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

}  // namespace

const ParameterCount& ParameterReport::component(const std::string& name) const {
  for (const ParameterCount& c : components)
    if (c.component == name) return c;
  MOERL_CHECK(false, "parameter report has no component '" + name + "'");
  return components.front();
}

std::string ParameterReport::format() const {
  std::ostringstream os;
  char line[160];
  std::snprintf(line, sizeof line, "%-16s %16s %10s %16s %10s\n", "component", "total", "", "active/token", "");
  os << line << std::string(72, '-') << '\n';
  auto print = [&](const std::string& name, std::int64_t total, std::int64_t active) {
    std::snprintf(line, sizeof line, "%-16s %16lld %10s %16lld %10s\n", name.c_str(), static_cast<long long>(total),
                  human(total).c_str(), static_cast<long long>(active), human(active).c_str());
    os << line;
  };
  for (const ParameterCount& c : components) print(c.component, c.total, c.active);
  os << std::string(72, '-') << '\n';
  print("total", total, active);
  return os.str();
}

ParameterReport parameter_report(PolicyImpl& policy) {
  ParameterReport report = empty_report();
  const std::int64_t experts = policy.moe_config().num_experts;
  const std::int64_t top_k = policy.moe_config().top_k;
  for (const auto& item : policy.named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    const std::int64_t n = item.value().numel();
    if (contains(name, "embed_tokens."))
      add(report, "embedding", n, n);
    else if (contains(name, "lm_head."))
      add(report, "lm_head", n, n);
    else if (contains(name, ".self_attn."))
      add(report, "attention", n, n);
    else if (contains(name, "norm."))
      add(report, "norms", n, n);
    else if (contains(name, ".mlp.gate."))
      add(report, "router", n, n);
    else if (contains(name, ".mlp.experts."))
      add(report, "routed_experts", n, n / experts * top_k);
    else if (contains(name, ".mlp.shared_expert"))
      add(report, "shared_experts", n, n);
    else if (contains(name, ".mlp."))
      add(report, "dense_ffn", n, n);
    else
      MOERL_CHECK(false, "parameter report: cannot classify parameter " + name);
  }
  return report;
}

ParameterReport expected_parameter_report(const config::ModelSection& model, const config::MoeSection& moe) {
  ParameterReport report = empty_report();
  const std::int64_t d = model.d_model;
  const std::int64_t head_dim = attention_head_dim(model);
  const std::int64_t q = model.num_heads * head_dim, kv = model.num_kv_heads * head_dim;
  const std::int64_t embed = model.vocab_size * d;
  add(report, "embedding", embed, embed);
  if (!model.tie_embeddings) add(report, "lm_head", embed, embed);
  std::int64_t attention = d * q * 2 + d * kv * 2;  // q, o + k, v
  if (model.qkv_bias) attention += q + 2 * kv;
  if (model.o_bias) attention += d;
  if (model.qk_norm == config::QkNorm::PerHead) attention += 2 * head_dim;
  if (model.qk_norm == config::QkNorm::Full) attention += q + kv;
  const std::int64_t d_shared = moe.d_shared_expert > 0 ? moe.d_shared_expert : moe.shared_experts * moe.d_expert;
  for (std::int64_t l = 0; l < model.num_layers; ++l) {
    add(report, "attention", attention, attention);
    add(report, "norms", 2 * d, 2 * d);
    if (is_moe_layer(model, moe, l)) {
      const std::int64_t expert = 3 * d * moe.d_expert;
      add(report, "router", moe.num_experts * d, moe.num_experts * d);
      add(report, "routed_experts", moe.num_experts * expert, moe.top_k * expert);
      std::int64_t shared = moe.shared_experts > 0 ? 3 * d * d_shared : 0;
      if (moe.shared_experts > 0 && moe.shared_expert_gate) shared += d;
      add(report, "shared_experts", shared, shared);
    } else {
      add(report, "dense_ffn", 3 * d * model.d_ff, 3 * d * model.d_ff);
    }
  }
  add(report, "norms", d, d);  // final norm
  return report;
}

}  // namespace moerl::model
