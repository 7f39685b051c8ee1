// Loading a run configuration: TOML text -> overrides -> typed sections ->
// range checks -> cross-field checks. Every problem is collected before
// anything is thrown, so one launch reports all of them.

#include "moerl/config/config.h"
#include "moerl/config/fault_plan.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "moerl/config/schema.h"
#include "moerl/core/hash.h"

namespace moerl::config {

std::string ConfigIssue::text() const {
  std::ostringstream out;
  out << source;
  if (line > 0) out << ":" << line;
  out << ": ";
  if (key.empty()) return out.str() + message;  // about the file itself, not one of its keys
  const auto dot = key.rfind('.');
  if (dot == std::string::npos) {
    out << "[" << key << "]";
  } else {
    out << "[" << key.substr(0, dot) << "] " << key.substr(dot + 1);
  }
  out << ": " << message;
  return out.str();
}

namespace {

std::string join_issues(const std::vector<ConfigIssue>& issues) {
  std::ostringstream out;
  out << "invalid configuration (" << issues.size() << (issues.size() == 1 ? " error" : " errors") << "):";
  for (const ConfigIssue& issue : issues) out << "\n  " << issue.text();
  return out.str();
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

ConfigError::ConfigError(std::vector<ConfigIssue> issues) : Error(join_issues(issues)), issues_(std::move(issues)) {}

std::string closest_match(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = std::max<size_t>(2, word.size() / 3 + 1) + 1;
  for (const std::string& candidate : candidates) {
    const size_t d = edit_distance(word, candidate);
    if (d < best_distance) {
      best_distance = d;
      best = candidate;
    }
  }
  return best;
}

const std::vector<std::string>& env_family_names() {
  static const std::vector<std::string> names = {"arithmetic", "maze", "guess", "sort", "lookup"};
  return names;
}

Config::Config() {
  for (const std::string& family : env_family_names()) env_families[family] = EnvFamilySection{};
}

ConfigIssue Config::issue(const std::string& key, const std::string& message) const {
  const auto where = origins.find(key);
  if (where != origins.end()) return {where->second.source, where->second.line, key, message};
  return {source_path.empty() ? "<defaults>" : source_path, 0, key, message};
}

std::string Config::run_directory() const {
  if (run.output_dir.empty()) return run.name;
  return run.output_dir + (run.output_dir.back() == '/' ? "" : "/") + run.name;
}

std::string Config::metrics_path() const { return run_directory() + "/" + telemetry.metrics_file; }

std::string Config::env_archive_directory() const {
  return env.archive_dir.empty() ? run_directory() + "/archive/env" : env.archive_dir;
}

namespace {

class Loader {
 public:
  Loader(std::string source_name) { config_.source_path = std::move(source_name); }

  Config load(toml::table& root, const std::vector<std::string>& overrides, const ConfigResolvers& resolvers) {
    for (const std::string& item : overrides) apply_override(root, item);
    for (auto&& [name, node] : root) read_section(std::string(name.str()), node);
    // Tables iterate in key order; report in file order instead.
    const auto order = [this](const ConfigIssue& i) {
      return std::make_pair(i.source == config_.source_path ? 0 : 1, i.line);
    };
    std::stable_sort(issues_.begin(), issues_.end(),
                     [&order](const ConfigIssue& a, const ConfigIssue& b) { return order(a) < order(b); });
    // [model] source = "hf:DIR": DIR/config.json sets the architecture keys,
    // which the cross-field checks then judge.
    if (resolvers.apply_model_source) append(resolvers.apply_model_source(config_));
    check_cross_field();
    if (resolvers.check_chat && !model_or_chat_failed()) append(resolvers.check_chat(config_));
    if (!issues_.empty()) throw ConfigError(issues_);
    return std::move(config_);
  }

  void add_parse_error(const toml::parse_error& error) {
    issues_.push_back(
        {config_.source_path, static_cast<int>(error.source().begin.line), "toml", std::string(error.description())});
    throw ConfigError(issues_);
  }

 private:
  KeyOrigin origin_of(const std::string& key, const toml::node& node) const {
    if (const auto it = override_origin_.find(key); it != override_origin_.end()) return {it->second, 0};
    return {config_.source_path, static_cast<int>(node.source().begin.line)};
  }

  void report(const std::string& key, const toml::node& node, const std::string& message) {
    const KeyOrigin where = origin_of(key, node);
    issues_.push_back({where.source, where.line, key, message});
  }

  // "--set algo.lr=1e-5": the value is parsed as a TOML literal; a bare word
  // that is not one ("--set run.name=exp1") is taken as a string.
  void apply_override(toml::table& root, const std::string& item) {
    const std::string origin = "--set " + item;
    const auto equals = item.find('=');
    const std::string path = item.substr(0, equals);
    std::vector<std::string> parts;
    for (size_t start = 0;;) {
      const size_t dot = path.find('.', start);
      parts.push_back(path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    const bool well_formed = equals != std::string::npos && parts.size() >= 2 &&
                             std::none_of(parts.begin(), parts.end(), [](const std::string& p) { return p.empty(); });
    if (!well_formed) {
      issues_.push_back({origin, 0, path, "expected --set section.key=value"});
      return;
    }
    const std::string key = parts.back(), text = item.substr(equals + 1);
    toml::table* table = &root;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      if (!table->contains(parts[i])) table->insert(parts[i], toml::table{});
      table = table->get_as<toml::table>(parts[i]);
      if (table == nullptr) {
        issues_.push_back({origin, 0, path, "'" + parts[i] + "' is a value, not a table"});
        return;
      }
    }
    try {
      const toml::table parsed = toml::parse("value = " + text);
      parsed.get("value")->visit([&](const auto& node) { table->insert_or_assign(key, node); });
    } catch (const toml::parse_error&) {
      table->insert_or_assign(key, text);
    }
    override_origin_[path] = origin;
  }

  // Top-level section names, or the subsections of `parent` ("env" -> "maze", ...).
  static std::vector<std::string> subsection_names(const std::string& parent) {
    std::vector<std::string> names;
    const std::string prefix = parent.empty() ? "" : parent + ".";
    for (const SectionSpec& s : all_sections()) {
      if (s.name.compare(0, prefix.size(), prefix) != 0) continue;
      const std::string rest = s.name.substr(prefix.size());
      if (rest.find('.') == std::string::npos) names.push_back(rest);
    }
    return names;
  }

  void read_section(const std::string& name, const toml::node& node) {
    const SectionSpec* spec = find_section(name);
    if (spec == nullptr) {
      std::string message = "unknown section";
      if (std::string near = closest_match(name, subsection_names("")); !near.empty())
        message += "; did you mean [" + near + "]?";
      report(name, node, message);
      return;
    }
    const toml::table* table = node.as_table();
    if (table == nullptr) {
      report(name, node, "expected a table ([" + name + "]), got a value");
      return;
    }
    void* section = spec->locate(config_);
    for (auto&& [key_name, value] : *table) {
      const std::string key(key_name.str());
      if (value.is_table() && find_section(name + "." + key) != nullptr) {
        read_section(name + "." + key, value);
      } else {
        read_field(*spec, section, key, value);
      }
    }
  }

  void read_field(const SectionSpec& spec, void* section, const std::string& key, const toml::node& value) {
    const std::string full_key = spec.name + "." + key;
    const FieldSpec* field = spec.find(key);
    if (field == nullptr) {
      std::vector<std::string> keys = subsection_names(spec.name);
      for (const FieldSpec& f : spec.fields) keys.push_back(f.key);
      std::string message = "unknown key";
      if (std::string near = closest_match(key, keys); !near.empty()) message += "; did you mean '" + near + "'?";
      report(full_key, value, message);
      return;
    }
    config_.origins[full_key] = origin_of(full_key, value);
    if (std::string error = field->assign(section, value); !error.empty()) {
      report(full_key, value, error);
      return;
    }
    if (std::string error = field->range_violation(section); !error.empty())
      report(full_key, value, error + ", got " + field->literal(section));
  }

  void require(bool ok, const std::string& key, const std::string& message) {
    if (!ok) issues_.push_back(config_.issue(key, message));
  }

  void check_placement() {
    const ClusterSection& c = config_.cluster;
    if (c.placement == Placement::HostGroups) {
      require(!c.training_hosts.empty(), "cluster.training_hosts",
              "must name the training hosts (glob patterns) when cluster.placement = \"host_groups\"");
    } else {
      // A host list that is silently ignored would put learners wherever the launcher did.
      require(c.training_hosts.empty() && c.inference_hosts.empty(), "cluster.placement",
              "is \"rank_order\", so training_hosts / inference_hosts would be ignored: set placement = "
              "\"host_groups\" or remove them");
    }
    for (const auto* list : {&c.training_hosts, &c.inference_hosts})
      for (const std::string& pattern : *list)
        require(!pattern.empty(), list == &c.training_hosts ? "cluster.training_hosts" : "cluster.inference_hosts",
                "holds an empty host pattern");
  }

  // [cluster] / [rollout] expert_parallel: whole expert groups, whole shares of experts.
  void check_expert_parallel(const std::string& key, std::int64_t p, const std::string& ranks_key, std::int64_t ranks) {
    if (p <= 1) return;
    const std::string size = std::to_string(p);
    require(config_.moe.enabled, key, "is " + size + " but moe.enabled is false: no experts to split");
    require(ranks % p == 0, key, "must divide " + ranks_key + " (" + std::to_string(ranks) + "), got " + size);
    // A Hugging Face model's expert count comes from its config.json: the policy checks it when built.
    if (config_.moe.enabled && config_.model.source.rfind("hf:", 0) != 0)
      require(config_.moe.num_experts % p == 0, key,
              "must divide moe.num_experts (" + std::to_string(config_.moe.num_experts) + "), got " + size);
  }

  void check_expert_parallel() {
    const ClusterSection& c = config_.cluster;
    check_expert_parallel("cluster.expert_parallel", c.expert_parallel, "cluster.learners", c.learners);
    check_expert_parallel("rollout.expert_parallel", config_.rollout.expert_parallel, "cluster.actors", c.actors);
    if (config_.rollout.expert_parallel > 1)
      require(c.standby_actors == 0, "rollout.expert_parallel",
              "is " + std::to_string(config_.rollout.expert_parallel) +
                  ", and a standby actor cannot take a lost member's place in an expert group: set "
                  "cluster.standby_actors = 0");
  }

  void check_cross_field() {
    const ModelSection& m = config_.model;
    const MoeSection& e = config_.moe;
    if (m.num_heads > 0 && m.num_kv_heads > 0) {
      require(m.num_heads % m.num_kv_heads == 0, "model.num_kv_heads",
              "must divide num_heads (" + std::to_string(m.num_heads) + "), got " + std::to_string(m.num_kv_heads));
      require(m.head_dim % 2 == 0, "model.head_dim", "must be even for rotary embeddings");
    }
    if (m.num_heads > 0 && m.num_kv_heads > 0 && m.head_dim == 0) {
      require(
          m.d_model % m.num_heads == 0, "model.d_model",
          "must be a multiple of num_heads (" + std::to_string(m.num_heads) + "), got " + std::to_string(m.d_model));
      if (m.d_model % m.num_heads == 0)
        require((m.d_model / m.num_heads) % 2 == 0, "model.d_model",
                "d_model / num_heads (the head size) must be even for rotary embeddings");
    }
    const std::int64_t eval_every = config_.eval.every_steps, save_every = config_.checkpoint.every_steps;
    if (eval_every > 0 && save_every > 0)
      require(eval_every % save_every == 0, "eval.every_steps",
              "must be a multiple of checkpoint.every_steps (" + std::to_string(save_every) +
                  ") so that every evaluated version has a checkpoint to accept or return to, got " +
                  std::to_string(eval_every));
    if (config_.eval.auto_rollback)
      require(eval_every > 0, "eval.auto_rollback", "needs eval.every_steps > 0 (the evaluations it watches)");
    for (const std::string& family : config_.env.families) {
      const auto& known = env_family_names();
      const bool ok = family == "external" || std::find(known.begin(), known.end(), family) != known.end();
      std::string message = "unknown task family '" + family + "'";
      if (std::string near = closest_match(family, known); !near.empty()) message += "; did you mean '" + near + "'?";
      require(ok, "env.families", message);
      if (family == "external")
        require(!config_.env_external.command.empty(), "env.families",
                "lists 'external' but [env.external] command is empty");
    }
    check_pretrain_stages();
    check_expert_parallel();
    if (config_.algo.credit == CreditAssignment::Turn)
      require(
          config_.algo.advantage == AdvantageEstimator::Grpo || config_.algo.advantage == AdvantageEstimator::DrGrpo,
          "algo.credit",
          "\"turn\" needs algo.advantage = \"grpo\" or \"dr_grpo\" (ppo assigns credit per turn "
          "with its value head; rloo has no per-turn form here)");
    require(!config_.env.families.empty(), "env.families", "must name at least one task family");
    require(!(config_.env.reward_min >= config_.env.reward_max), "env.reward_max",
            "must be greater than env.reward_min");
    require(config_.env.curriculum_lower_at < config_.env.curriculum_raise_at, "env.curriculum_lower_at",
            "must be below env.curriculum_raise_at, or a family's level would move both ways at once");
    for (const std::string& entry : config_.faults.plan) {
      try {
        const FaultAction fault = parse_fault(entry);
        const std::int64_t count = fault.role == "learner"      ? config_.cluster.learners
                                   : fault.role == "actor"      ? config_.cluster.actors
                                   : fault.role == "env_worker" ? config_.cluster.env_workers
                                                                : config_.cluster.standby_actors;
        require(fault.index < count, "faults.plan",
                "entry \"" + entry + "\": there are " + std::to_string(count) + " " + fault.role + " ranks");
      } catch (const Error& error) {
        require(false, "faults.plan", error.what());
      }
    }
    check_placement();
    require(config_.cluster.heartbeat_timeout_s > 2 * config_.cluster.heartbeat_interval_s,
            "cluster.heartbeat_timeout_s",
            "must be more than twice cluster.heartbeat_interval_s (one late beat is not a loss)");
    // An actor asks for work only when a whole group fits its free sessions
    // (rollout::Actor::request_work): a larger group would never be asked for.
    const RolloutSection& r = config_.rollout;
    require(r.group_size <= r.sessions_per_actor, "rollout.group_size",
            "must be <= rollout.sessions_per_actor (" + std::to_string(r.sessions_per_actor) +
                ": an actor runs a whole group at once, so it would never ask for work), got " +
                std::to_string(r.group_size));
    // Asynchronous rollouts make which weights sample which tokens a matter of timing.
    require(!(config_.run.deterministic && config_.sync.asynchronous), "run.deterministic",
            "needs synchronous rollouts: set sync.asynchronous = false");
    if (e.enabled) {
      // Trajectories carry each token's routing as one byte per expert index.
      require(e.num_experts <= 256, "moe.num_experts",
              "must be <= 256 (episodes record each token's experts as bytes), got " + std::to_string(e.num_experts));
      require(e.top_k <= e.num_experts, "moe.top_k",
              "must be <= num_experts (" + std::to_string(e.num_experts) + "), got " + std::to_string(e.top_k));
      require(e.first_dense_layers < m.num_layers, "moe.first_dense_layers",
              "leaves no MoE layer: must be < model.num_layers (" + std::to_string(m.num_layers) + ")");
    }
    check_rollout_experts();
  }

  // [pretrain] first_stage_*: both or neither, and a stage's families come
  // from the task mix (their [env.<family>] settings are the mix's).
  void check_pretrain_stages() {
    const PretrainSection& p = config_.pretrain;
    const auto& mix = config_.env.families;
    if (p.first_stage_families.empty()) {
      require(p.first_stage_steps == 0, "pretrain.first_stage_steps",
              "= " + std::to_string(p.first_stage_steps) +
                  " needs pretrain.first_stage_families (which families "
                  "the first stage trains on)");
      return;
    }
    require(p.first_stage_steps > 0, "pretrain.first_stage_families",
            "needs pretrain.first_stage_steps > 0 (how long the first stage trains)");
    for (const std::string& family : p.first_stage_families) {
      std::string message = "'" + family + "' is not in env.families";
      if (std::string near = closest_match(family, mix); !near.empty()) message += "; did you mean '" + near + "'?";
      require(std::find(mix.begin(), mix.end(), family) != mix.end(), "pretrain.first_stage_families", message);
      require(family != "external", "pretrain.first_stage_families", "'external' has no scripted expert to learn from");
    }
  }

  // rollout.moe_top_k: after apply_hf_source, so that an hf: model's
  // num_experts and top_k (from its config.json) are the ones checked.
  void check_rollout_experts() {
    const MoeSection& e = config_.moe;
    const std::int64_t k = config_.rollout.moe_top_k;
    if (k <= 0) return;  // 0: moe.top_k; below 0 the range check has spoken
    // A failed hf: source left the [moe] defaults: nothing sound to check against.
    for (const ConfigIssue& issue : issues_)
      if (issue.key == "model.source") return;
    if (!e.enabled) {
      require(false, "rollout.moe_top_k", "has no effect on a dense model (moe.enabled = false): leave it 0");
      return;
    }
    require(k <= e.num_experts, "rollout.moe_top_k",
            "must be <= moe.num_experts (" + std::to_string(e.num_experts) + "), got " + std::to_string(k));
    // Routing replay makes the learner route each token to the experts the
    // actor chose; k' experts cannot stand in for the learner's moe.top_k
    // without changing what it trains. Refused rather than silently skipped:
    // routing_replay is on by default, and what the run trains would change.
    require(k == e.top_k || !config_.algo.routing_replay, "rollout.moe_top_k",
            "= " + std::to_string(k) + " differs from moe.top_k = " + std::to_string(e.top_k) +
                ", and algo.routing_replay = true cannot replay " + std::to_string(k) +
                " experts per token in a learner that routes with " + std::to_string(e.top_k) +
                ": set algo.routing_replay = false (the importance weights then correct for the other "
                "routing) or rollout.moe_top_k = 0");
  }

  // [chat] is checked against the tokenizer only when no [model] or [chat]
  // key failed (nothing sound to check, or the same fault twice).
  bool model_or_chat_failed() const {
    for (const ConfigIssue& issue : issues_)
      if (issue.key.rfind("model.", 0) == 0 || issue.key.rfind("chat.", 0) == 0) return true;
    return false;
  }

  void append(const std::vector<ConfigIssue>& more) { issues_.insert(issues_.end(), more.begin(), more.end()); }

  Config config_;
  std::vector<ConfigIssue> issues_;
  std::map<std::string, std::string> override_origin_;
};

}  // namespace

Config load_config_text(const std::string& text, const std::string& source_name,
                        const std::vector<std::string>& overrides, const ConfigResolvers& resolvers) {
  Loader loader(source_name);
  toml::table root;
  try {
    root = toml::parse(text, source_name);
  } catch (const toml::parse_error& error) {
    loader.add_parse_error(error);
  }
  return loader.load(root, overrides, resolvers);
}

namespace {

// The text of a configuration file. What is not a readable file is refused
// here, naming the path: an ifstream opens a directory without complaint and
// reads nothing, which would load as the all-defaults configuration.
std::string read_config_file(const std::string& path) {
  const auto refuse = [&path](const std::string& why) { throw ConfigError({{path, 0, "", why}}); };
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(path, ec);
  if (status.type() == std::filesystem::file_type::not_found) refuse("no such configuration file");
  if (ec) refuse("cannot access the configuration file: " + ec.message());
  if (std::filesystem::is_directory(status)) refuse("is a directory, not a TOML configuration file");
  std::ifstream file(path, std::ios::binary);
  if (!file) refuse(std::string("cannot open the configuration file: ") + std::strerror(errno));
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) refuse(std::string("cannot read the configuration file: ") + std::strerror(errno));
  return text.str();
}

}  // namespace

Config load_config_file(const std::string& path, const std::vector<std::string>& overrides,
                        const ConfigResolvers& resolvers) {
  return load_config_text(read_config_file(path), path, overrides, resolvers);
}

void check_world_size(const Config& config, int world_size) {
  const ClusterSection& c = config.cluster;
  const std::int64_t wanted = c.learners + c.actors + c.env_workers + c.standby_actors;
  if (wanted == world_size) return;
  std::ostringstream message;
  message << "learners + actors + env_workers + standby_actors = " << c.learners << " + " << c.actors << " + "
          << c.env_workers << " + " << c.standby_actors << " = " << wanted << " ranks, but the job has " << world_size
          << " (launch with mpirun -np " << wanted << " or change [cluster])";
  // Point at the first rank count the file sets, so the line is useful.
  std::string key = "cluster";
  for (const char* k : {"cluster.learners", "cluster.actors", "cluster.env_workers", "cluster.standby_actors"})
    if (config.origins.count(k)) {
      key = k;
      break;
    }
  throw ConfigError({config.issue(key, message.str())});
}

std::string to_toml(const Config& config) {
  std::ostringstream out;
  out << "# Resolved moerl configuration";
  if (!config.source_path.empty()) out << " (from " << config.source_path << ")";
  out << "\n";
  for (const SectionSpec& section : all_sections()) {
    out << "\n[" << section.name << "]\n";
    const void* values = section.locate_const(config);
    for (const FieldSpec& field : section.fields) {
      std::string line = field.key + " = " + field.literal(values);
      const bool is_default = !config.origins.count(section.name + "." + field.key);
      out << line;
      if (is_default) out << std::string(line.size() < 36 ? 36 - line.size() : 1, ' ') << "# default";
      out << "\n";
    }
  }
  return out.str();
}

std::uint64_t config_fingerprint(const Config& config) {
  std::uint64_t hash = kFnv1aOffset;
  for (const SectionSpec& section : all_sections()) {
    const void* values = section.locate_const(config);
    for (const FieldSpec& field : section.fields) {
      const std::string line = section.name + "." + field.key + "=" + field.literal(values) + "\n";
      hash = fnv1a(line.data(), line.size(), hash);
    }
  }
  return hash;
}

std::string reference_markdown() {
  const Config defaults;
  std::ostringstream out;
  out << "# Configuration reference\n\n"
      << "Generated by `moerl config reference`. Every key can be set in the TOML file or with\n"
      << "`--set section.key=value`; unknown keys, wrong types and out-of-range values are\n"
      << "errors naming the file, line and key (exit status 2), and so is a config path that is\n"
      << "missing or a directory. With `[model] source = \"hf:DIR\"`, DIR/config.json sets the\n"
      << "architecture keys; its sizes must be in range, and together give a parameter count that\n"
      << "fits 64 bits and whose float32 weights fit this machine's physical memory (the error\n"
      << "names config.json and the keys).\n";
  for (const SectionSpec& section : all_sections()) {
    out << "\n## [" << section.name << "]\n\n"
        << section.doc << "\n\n"
        << "| key | type | default | range | meaning |\n|---|---|---|---|---|\n";
    const void* values = section.locate_const(defaults);
    for (const FieldSpec& field : section.fields) {
      std::ostringstream range;
      if (field.minimum) range << (field.minimum_exclusive ? "> " : ">= ") << *field.minimum;
      if (field.maximum) range << (field.minimum ? ", " : "") << "<= " << *field.maximum;
      out << "| `" << field.key << "` | " << field.type_name << " | `" << field.literal(values) << "` | " << range.str()
          << " | " << field.doc << " |\n";
    }
  }
  return out.str();
}

}  // namespace moerl::config
