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

std::string read_string_list(const toml::node& value, std::vector<std::string>& out) {
  const auto* array = value.as_array();
  if (array == nullptr) return "expected an array of strings, got " + type_of(value);
  std::vector<std::string> items;
  for (size_t i = 0; i < array->size(); ++i) {
    const auto* item = (*array)[i].as_string();
    if (item == nullptr)
      return "expected an array of strings, element " + std::to_string(i) + " is " + type_of((*array)[i]);
    items.push_back(item->get());
  }
  out = std::move(items);
  return "";
}

std::string string_list_literal(const std::vector<std::string>& values) {
  std::string text = "[";
  for (size_t i = 0; i < values.size(); ++i) text += (i ? ", " : "") + toml_string_literal(values[i]);
  return text + "]";
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
  // Whole numbers of ordinary size read best as they are typed: 60.0, not 6e+01.
  if (value == std::floor(value) && std::fabs(value) < 1e15) {
    std::snprintf(buffer, sizeof buffer, "%.1f", value);
    return buffer;
  }
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
          "Bitwise-reproducible runs on CPU at some speed cost: one compute thread per rank, every "
          "session decoded alone, sampling seeded by (run seed, task seed, sample index, position), "
          "episodes trained in (group, sample) order. Needs sync.asynchronous = false.");
  b.choice("device", &RunSection::device, {{"cpu", RunDevice::Cpu}, {"cuda", RunDevice::Cuda}},
           "Where learners and actors compute (env workers always use the CPU). cuda: each rank takes "
           "cuda:(local rank % visible devices), the local rank from OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID "
           "or the ranks sharing the host; a rank without a usable CUDA device stops the job before any work.");
  b.choice("dtype", &RunSection::dtype, {{"float32", RunDtype::Float32}, {"bfloat16", RunDtype::BFloat16}},
           "Compute dtype of the policy. bfloat16: learners keep float32 master weights and optimizer state and "
           "run forward and backward on a bfloat16 copy (log-probs and losses in float32); actors hold bfloat16 "
           "weights. Weights travel in the compute dtype (bfloat16: half the bytes); checkpoints hold float32.");
  b.choice("collectives", &RunSection::collectives, {{"auto", RunCollectives::Auto}, {"mpi", RunCollectives::Mpi}},
           "Backend of the learners' gradient all-reduce and of the weight broadcast. auto: NCCL for a group whose "
           "members each have a GPU of their own in a cuda job (the log says which groups and why), else MPI. mpi: "
           "always MPI (host memory), e.g. where NCCL's transports are not usable.");
  return spec;
}

SectionSpec cluster_section() {
  SectionSpec spec{"cluster",
                   "Ranks per role. Layout: learners first, then actors, env workers, standby "
                   "actors; the sum must equal the MPI world size.",
                   {},
                   {},
                   {}};
  SectionBuilder<ClusterSection> b(spec, &Config::cluster);
  b.field("learners", &ClusterSection::learners, "Learner ranks (data parallel).").at_least(1);
  b.field("actors", &ClusterSection::actors, "Rollout actor ranks.").at_least(1);
  b.field("env_workers", &ClusterSection::env_workers, "Environment worker ranks.").at_least(1);
  b.field("standby_actors", &ClusterSection::standby_actors,
          "Idle actors: under a fault-tolerant MPI, the i-th actor lost is replaced by standby actor i, "
          "which takes its place in the weight-sync group and in the task queue.")
      .at_least(0);
  b.field("expert_parallel", &ClusterSection::expert_parallel,
          "Learners per expert group: the routed experts of every MoE layer are split over this many "
          "consecutive learners (learner i holds share i mod P), token rows travel to their experts' owner "
          "and back by all-to-all, everything else stays data-parallel. 1 = every learner holds every expert. "
          "Must divide cluster.learners and moe.num_experts.")
      .between(1, 4096);
  b.field("threads_per_rank", &ClusterSection::threads_per_rank,
          "Compute threads per rank; 0 = the cores this process may use (affinity mask, cgroup CPU "
          "quota of a container) / ranks on this host.")
      .between(0, 1024);
  b.field("message_timeout_s", &ClusterSection::message_timeout_s,
          "Longest wait for an expected message before the job stops with an error naming the "
          "silent rank.")
      .greater_than(0);
  b.field("shutdown_timeout_s", &ClusterSection::shutdown_timeout_s,
          "At the end of a job the ranks wait this long for each other (learner 0; the others twice "
          "as long); a rank that has not arrived by then is killed as frozen or lost, so that it cannot "
          "hold the job.")
      .greater_than(0);
  b.field("heartbeat_interval_s", &ClusterSection::heartbeat_interval_s,
          "Every rank tells learner 0 this often that it is alive (from a thread that beats while the "
          "rank computes), and learner 0 tells every rank.")
      .greater_than(0);
  b.field("heartbeat_timeout_s", &ClusterSection::heartbeat_timeout_s,
          "A rank silent this long is declared lost (a frozen rank is found this way); a rank that hears "
          "nothing from learner 0 this long ends itself.")
      .greater_than(0);
  b.field("malformed_message_limit", &ClusterSection::malformed_message_limit,
          "Malformed messages a learner drops from one rank (each with a warning) before it stops "
          "the job naming that rank.")
      .at_least(1);
  b.choice("placement", &ClusterSection::placement,
           {{"rank_order", Placement::RankOrder}, {"host_groups", Placement::HostGroups}},
           "Which process takes which rank: rank_order keeps the launcher's order (learners are its first "
           "ranks); host_groups gives the learner ranks to the processes on training_hosts and every other "
           "role to those on inference_hosts, whatever order the launcher chose, and stops before any work "
           "(status 2) when the counts do not fit.");
  b.field("training_hosts", &ClusterSection::training_hosts,
          "placement = host_groups: host names (glob patterns, e.g. \"gpu-train-*\") of the training nodes; "
          "the processes there become the learners. A host's name is $MOERL_HOST_NAME where set (a "
          "container's node name), else $SLURMD_NODENAME under Slurm, else its hostname.");
  b.field("inference_hosts", &ClusterSection::inference_hosts,
          "placement = host_groups: host name patterns of the inference nodes (actors, env workers, "
          "standby actors); empty = every host not in training_hosts.");
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
  b.field("d_ff", &ModelSection::d_ff, "SwiGLU hidden size of dense feed-forward layers.").at_least(1);
  b.field("max_seq_len", &ModelSection::max_seq_len, "Longest context in tokens.").at_least(2);
  b.field("rope_theta", &ModelSection::rope_theta, "Rotary embedding base.").greater_than(0);
  b.field("norm_eps", &ModelSection::norm_eps, "RMSNorm epsilon.").greater_than(0);
  b.field("tie_embeddings", &ModelSection::tie_embeddings, "Share the token embedding with the LM head.");
  b.field("init_std", &ModelSection::init_std, "Standard deviation of the weight initialisation.").greater_than(0);
  b.field("source", &ModelSection::source,
          "Where the model comes from: \"\" = the built-in model above; \"hf:DIR\" = a Hugging Face "
          "model directory (config.json sets the architecture keys, *.safetensors the weights).");
  b.field("head_dim", &ModelSection::head_dim, "Size of one attention head; 0 = d_model / num_heads.").at_least(0);
  b.choice("qk_norm", &ModelSection::qk_norm,
           {{"none", QkNorm::None}, {"head", QkNorm::PerHead}, {"full", QkNorm::Full}},
           "RMSNorm on queries and keys before rotary: per head (Qwen3-MoE) or over all heads (OLMoE).");
  b.field("qkv_bias", &ModelSection::qkv_bias, "Biases on the q, k and v projections.");
  b.field("o_bias", &ModelSection::o_bias, "Bias on the attention output projection.");
  b.field("sliding_window", &ModelSection::sliding_window,
          "0 = full causal attention; else a query sees only the last this-many positions.")
      .at_least(0);
  return spec;
}

SectionSpec chat_section() {
  SectionSpec spec{"chat",
                   "How multi-turn episodes become tokens: the chat layout (role markers, end-of-turn "
                   "token) and the tokenizer. The policy generates each action and its end-of-turn "
                   "token; everything else is context.",
                   {},
                   {},
                   {}};
  SectionBuilder<ChatSection> b(spec, &Config::chat);
  // No "|" in these texts: they are cells of the Markdown table of `moerl config reference`.
  b.choice("layout", &ChatSection::layout,
           {{"auto", ChatLayoutPreset::Auto},
            {"byte", ChatLayoutPreset::Byte},
            {"chatml", ChatLayoutPreset::ChatMl},
            {"llama3", ChatLayoutPreset::Llama3}},
           "Layout preset: byte (the built-in byte tokenizer's role tokens and end-of-turn token), "
           "chatml (Qwen's im_start/im_end markers) or llama3 (start_header_id/end_header_id headers, "
           "eot_id); auto = byte for the built-in model, chatml for an hf: source.");
  b.field("tokenizer", &ChatSection::tokenizer,
          "tokenizer.json of the chatml/llama3 layouts; empty = DIR/tokenizer.json of source = \"hf:DIR\". "
          "Its ids must fit model.vocab_size.");
  b.field("begin", &ChatSection::begin,
          "Text written once before the first message (may hold special tokens); empty = the preset's.");
  b.field("message", &ChatSection::message,
          "Template of every message, with {role} and {content}; {content} must be followed by "
          "end_of_turn; empty = the preset's.");
  b.field("end_of_turn", &ChatSection::end_of_turn,
          "The token that ends a message; the policy ends its turn with it, and it must be a single "
          "token of the tokenizer; empty = the preset's.");
  b.field("system_role", &ChatSection::system_role, "{role} of system messages; empty = the preset's.");
  b.field("user_role", &ChatSection::user_role, "{role} of user messages (the observations); empty = the preset's.");
  b.field("assistant_role", &ChatSection::assistant_role,
          "{role} of assistant messages (the policy's actions); empty = the preset's.");
  return spec;
}

SectionSpec moe_section() {
  SectionSpec spec{"moe", "Mixture-of-experts feed-forward layers.", {}, {}, {}};
  SectionBuilder<MoeSection> b(spec, &Config::moe);
  b.field("enabled", &MoeSection::enabled, "Use MoE feed-forward layers (false: all dense).");
  b.field("num_experts", &MoeSection::num_experts, "Routed experts per MoE layer.").at_least(1);
  b.field("top_k", &MoeSection::top_k, "Experts active per token; at most num_experts.").at_least(1);
  b.field("d_expert", &MoeSection::d_expert, "SwiGLU hidden size of one expert.").at_least(1);
  b.field("shared_experts", &MoeSection::shared_experts, "Always-active experts added to the routed ones.").at_least(0);
  b.field("first_dense_layers", &MoeSection::first_dense_layers, "Leading layers that stay dense.").at_least(0);
  b.choice("router", &MoeSection::router,
           {{"softmax_topk", RouterMode::SoftmaxThenTopK}, {"topk_softmax", RouterMode::TopKThenSoftmax}},
           "Softmax over all experts then top-k, or top-k logits then softmax over them.");
  b.field("renormalize", &MoeSection::renormalize, "Gates over the chosen k sum to 1.");
  b.field("aux_loss_weight", &MoeSection::aux_loss_weight, "Weight of the Switch/GShard load-balancing loss.")
      .at_least(0);
  b.field("z_loss_weight", &MoeSection::z_loss_weight, "Weight of the router z-loss.").at_least(0);
  b.field("capacity_factor", &MoeSection::capacity_factor,
          "0 = dropless; else each expert takes at most ceil(factor*tokens*k/experts) tokens and "
          "the rest are dropped (counted).")
      .at_least(0);
  b.field("block_size", &MoeSection::block_size, "Pad each expert's token segment to a multiple of this (GPU tiling).")
      .between(1, 1024);
  b.field("d_shared_expert", &MoeSection::d_shared_expert,
          "Hidden size of the shared expert; 0 = shared_experts * d_expert.")
      .at_least(0);
  b.field("shared_expert_gate", &MoeSection::shared_expert_gate,
          "Scale the shared expert's output by a learned per-token sigmoid gate (Qwen2-MoE).");
  b.field("sparse_step", &MoeSection::sparse_step,
          "After the first_dense_layers, layer l is an MoE layer when (l + 1) % sparse_step == 0.")
      .at_least(1);
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
  b.field("prometheus_port", &TelemetrySection::prometheus_port,
          "Learner 0 serves every rank's metrics at http://<bind>:<port>/metrics for Prometheus; 0 = off.")
      .between(0, 65535);
  b.field("prometheus_bind", &TelemetrySection::prometheus_bind,
          "Address the /metrics endpoint listens on (loopback by default; 0.0.0.0 for every interface).");
  b.field("imbalance_warn_ratio", &TelemetrySection::imbalance_warn_ratio,
          "Learner 0 logs a warning when an MoE layer's max/mean expert load in a step passes this.")
      .greater_than(1);
  b.field("env_p99_warn_s", &TelemetrySection::env_p99_warn_s,
          "Learner 0 logs a warning when a family's environment step P99 passes this many seconds.")
      .greater_than(0);
  return spec;
}

SectionSpec rollout_section() {
  SectionSpec spec{"rollout", "Generation on the actors.", {}, {}, {}};
  SectionBuilder<RolloutSection> b(spec, &Config::rollout);
  b.field("sessions_per_actor", &RolloutSection::sessions_per_actor,
          "Episodes one actor drives at once (its decode batch).")
      .between(1, 4096);
  b.field("temperature", &RolloutSection::temperature, "Sampling temperature; 0 = greedy.").at_least(0);
  b.field("top_p", &RolloutSection::top_p, "Nucleus sampling mass.").between(0, 1);
  b.field("top_k", &RolloutSection::top_k, "Keep the k most likely tokens; 0 = off.").at_least(0);
  b.field("expert_parallel", &RolloutSection::expert_parallel,
          "Actors per expert group: the routed experts of every MoE layer are split over this many "
          "consecutive actors (actor i holds share i mod P), which decode in step (each with its own "
          "sessions) and exchange token rows with all-to-all; each receives only its share of every "
          "weight version. 1 = every actor holds every expert. Must divide cluster.actors and "
          "moe.num_experts; no standby actors (a group cannot take in a replacement).")
      .between(1, 4096);
  b.field("moe_top_k", &RolloutSection::moe_top_k,
          "MoE experts active per token while generating; not top_k, which filters sampled tokens. "
          "0 = the model's moe.top_k (config.json's for hf: models, which this may override), else at "
          "most moe.num_experts. The learner keeps moe.top_k, and its importance weights correct for "
          "the other behaviour log-probs; a k other than moe.top_k needs algo.routing_replay = false.")
      .at_least(0);
  b.field("max_tokens_per_turn", &RolloutSection::max_tokens_per_turn, "Longest action of one turn.").at_least(1);
  b.field("max_tokens_per_episode", &RolloutSection::max_tokens_per_episode,
          "Context budget of one episode; what happens when a turn would not fit: context_policy.")
      .at_least(16);
  b.choice(
      "context_policy", &RolloutSection::context_policy,
      {{"end_episode", ContextBudgetPolicy::EndEpisode}, {"drop_oldest_turns", ContextBudgetPolicy::DropOldestTurns}},
      "When the next turn (its prompt and max_tokens_per_turn) would not fit max_tokens_per_episode: "
      "end_episode ends the episode (flagged truncated); drop_oldest_turns keeps the task statement, "
      "drops whole old turns until it fits, rebuilds the KV cache and goes on (the episode counts "
      "dropped_turns; the learner scores each rebuilt context on its own).");
  b.field("group_size", &RolloutSection::group_size,
          "Samples per task seed (GRPO group size G); at most sessions_per_actor (an actor runs a whole group).")
      .between(1, 1024);
  b.field("eval_episodes", &RolloutSection::eval_episodes,
          "Held-out episodes per family evaluated before and after training; 0 = none.")
      .at_least(0);
  b.field("eval_temperature", &RolloutSection::eval_temperature,
          "Sampling temperature of the evaluation episodes; 0 = greedy.")
      .at_least(0);
  b.field("eval_greedy", &RolloutSection::eval_greedy,
          "With eval_temperature > 0, also play every held-out seed greedily (summary.json "
          "before_greedy/after_greedy).");
  b.choice("kv_cache_dtype", &RolloutSection::kv_cache_dtype,
           {{"float32", KvCacheStorage::Float32}, {"int8", KvCacheStorage::Int8}},
           "How actors store the KV cache: float32, or int8 with one scale per position and head (about "
           "a quarter of the bytes; behaviour log-probs then differ slightly from the learner's, which "
           "its importance weights correct; docs/tuning.md).");
  return spec;
}

SectionSpec algo_section() {
  SectionSpec spec{"algo", "The RL objective.", {}, {}, {}};
  SectionBuilder<AlgoSection> b(spec, &Config::algo);
  b.choice("advantage", &AlgoSection::advantage,
           {{"grpo", AdvantageEstimator::Grpo},
            {"dr_grpo", AdvantageEstimator::DrGrpo},
            {"rloo", AdvantageEstimator::Rloo},
            {"ppo", AdvantageEstimator::Ppo}},
           "Advantage estimator: GRPO (group-normalised), Dr.GRPO (no std normalisation), RLOO, or PPO "
           "(a learned value head and GAE over turns; groups are then just batches).");
  b.choice("credit", &AlgoSection::credit, {{"episode", CreditAssignment::Episode}, {"turn", CreditAssignment::Turn}},
           "grpo and dr_grpo: episode = every token of an episode gets the episode's group-relative "
           "advantage; turn = each turn's reward is normalised against every turn reward of its group and "
           "a turn's tokens get the sum of its own and its later turns' (process-reward GRPO; for shaped "
           "rewards, docs/algorithms.md).");
  b.field("gspo", &AlgoSection::gspo, "Sequence-level ratio and clipping (GSPO), recommended for MoE.");
  b.field("clip_low", &AlgoSection::clip_low, "Lower clip range: ratio >= 1 - clip_low.").between(0, 1);
  b.field("clip_high", &AlgoSection::clip_high, "Upper clip range: ratio <= 1 + clip_high (clip-higher).").at_least(0);
  b.choice("normalization", &AlgoSection::normalization,
           {{"token", LossNormalization::Token},
            {"sequence", LossNormalization::Sequence},
            {"constant", LossNormalization::Constant}},
           "Loss normalisation: over all tokens, per sequence, or by a constant (Dr.GRPO).");
  b.field("importance_cap", &AlgoSection::importance_cap,
          "Truncated importance weight C for off-policy tokens (decoupled PPO).")
      .at_least(1);
  b.choice("kl", &AlgoSection::kl, {{"none", KlMode::None}, {"k1", KlMode::K1}, {"k3", KlMode::K3}},
           "KL penalty to the frozen reference policy, and its estimator.");
  b.field("kl_coef", &AlgoSection::kl_coef, "Weight of the KL penalty.").at_least(0);
  b.field("entropy_coef", &AlgoSection::entropy_coef, "Weight of the entropy bonus.").at_least(0);
  b.field("drop_zero_variance_groups", &AlgoSection::drop_zero_variance_groups,
          "Drop groups whose rewards are all equal (dynamic sampling).");
  b.field("routing_replay", &AlgoSection::routing_replay,
          "The learner replays the experts the actor routed to (gates recomputed).");
  b.field("groups_per_step", &AlgoSection::groups_per_step, "GRPO groups per learner step, over all learners.")
      .at_least(1);
  b.field("overlong_cache_tokens", &AlgoSection::overlong_cache_tokens,
          "Soft overlong penalty (DAPO): episodes whose generated tokens come within this many of "
          "[rollout] max_tokens_per_episode lose reward linearly; 0 = off.")
      .at_least(0);
  b.field("overlong_factor", &AlgoSection::overlong_factor, "Overlong penalty at the budget.").at_least(0);
  b.field("routing_check_interval", &AlgoSection::routing_check_interval,
          "Steps between measurements of how often the learner's router would pick other experts "
          "than the replayed ones (metric learner.router_disagreement); 0 = never.")
      .at_least(0);
  b.field("gae_gamma", &AlgoSection::gae_gamma, "PPO: discount per environment turn in GAE.").between(0, 1);
  b.field("gae_lambda", &AlgoSection::gae_lambda, "PPO: GAE lambda (bias-variance trade-off).").between(0, 1);
  b.field("value_coef", &AlgoSection::value_coef, "PPO: weight of the value loss.").at_least(0);
  b.field("value_clip", &AlgoSection::value_clip, "PPO: value clipping range (PPO2 style); 0 = unclipped.").at_least(0);
  b.field("value_lr_scale", &AlgoSection::value_lr_scale,
          "PPO: the value head's learning rate is [optim] lr times this (it starts from scratch).")
      .greater_than(0);
  b.field("whiten_advantages", &AlgoSection::whiten_advantages,
          "PPO: normalise the per-turn advantages to zero mean and unit variance per micro-batch.");
  return spec;
}

SectionSpec optim_section() {
  SectionSpec spec{"optim", "The AdamW optimizer of the learners.", {}, {}, {}};
  SectionBuilder<OptimSection> b(spec, &Config::optim);
  b.field("lr", &OptimSection::lr, "Peak learning rate.").greater_than(0);
  b.field("weight_decay", &OptimSection::weight_decay, "Decoupled weight decay.").at_least(0);
  b.field("beta1", &OptimSection::beta1, "Adam beta1.").between(0, 1);
  b.field("beta2", &OptimSection::beta2, "Adam beta2.").between(0, 1);
  b.field("grad_clip", &OptimSection::grad_clip, "Global gradient-norm clip; 0 = off.").at_least(0);
  b.field("warmup_steps", &OptimSection::warmup_steps, "Linear warm-up steps.").at_least(0);
  b.field("total_steps", &OptimSection::total_steps, "Learner steps of the run.").at_least(1);
  b.field("cosine", &OptimSection::cosine, "Cosine decay to 10% of lr after warm-up.");
  b.field("grad_accumulation", &OptimSection::grad_accumulation, "Micro-batches per optimizer step.").at_least(1);
  b.field("gradient_bucket_mb", &OptimSection::gradient_bucket_mb,
          "With several learners: the gradients' all-reduce runs in buckets of this many MiB, each started "
          "during the backward once its gradients are computed (learner/overlapped_gradients.h); 0 = one "
          "all-reduce after the backward. Float32 runs only: a bfloat16 run reduces after the backward.")
      .at_least(0);
  return spec;
}

SectionSpec sync_section() {
  SectionSpec spec{"sync", "Weight publication from learner 0 to the actors.", {}, {}, {}};
  SectionBuilder<SyncSection> b(spec, &Config::sync);
  b.field("interval", &SyncSection::interval, "Learner steps between publications.").at_least(1);
  b.field("max_staleness", &SyncSection::max_staleness,
          "Oldest policy version still trained on: current - max_staleness; older episodes are dropped.")
      .at_least(0);
  b.field("bucket_mb", &SyncSection::bucket_mb, "Bucket size of a publication in MiB.").between(1, 1024);
  b.field("asynchronous", &SyncSection::asynchronous,
          "Rollouts continue while the learner trains; false = generate, train, sync in turn.");
  return spec;
}

SectionSpec checkpoint_section() {
  SectionSpec spec{"checkpoint", "Versioned HDF5 checkpoints of the learner (moerl checkpoint ...).", {}, {}, {}};
  SectionBuilder<CheckpointSection> b(spec, &Config::checkpoint);
  b.field("every_steps", &CheckpointSection::every_steps,
          "Learner steps between checkpoints; 0 = only at the end and on a stop signal.")
      .at_least(0);
  b.field("keep_last", &CheckpointSection::keep_last, "Keep the last K versions plus every tagged one.").at_least(1);
  b.field("directory", &CheckpointSection::directory, "Checkpoint store; empty = <run dir>/checkpoints.");
  b.field("save_on_stop", &CheckpointSection::save_on_stop,
          "On SIGTERM/SIGINT (e.g. Slurm's time limit) write a final checkpoint before exiting.");
  b.field("every_minutes", &CheckpointSection::every_minutes,
          "Also save when this many minutes passed since the last save (checked after each step); 0 = off.")
      .at_least(0);
  b.field("archive_directory", &CheckpointSection::archive_directory,
          "Archive (stand-in for object storage): completed checkpoints, env snapshots and the metrics log "
          "are copied there by a background thread; empty = off.");
  b.field("archive_keep_last", &CheckpointSection::archive_keep_last,
          "Versions kept in the archive, plus tagged ones; 0 = keep all.")
      .at_least(0);
  b.field("archive_wait_s", &CheckpointSection::archive_wait_s,
          "At the end of the run, how long to wait for archive copies before failing with an error.")
      .greater_than(0);
  return spec;
}

SectionSpec eval_section() {
  SectionSpec spec{
      "eval", "Held-out evaluation during training, acceptance of a version, automatic rollback.", {}, {}, {}};
  SectionBuilder<EvalSection> b(spec, &Config::eval);
  b.field("every_steps", &EvalSection::every_steps,
          "Evaluate the policy on the held-out seeds every N learner steps while training (a multiple of "
          "checkpoint.every_steps, so each evaluated version has a checkpoint); 0 = only before and after.")
      .at_least(0);
  b.field("episodes", &EvalSection::episodes,
          "Held-out episodes per family in each of those evaluations; 0 = rollout.eval_episodes.")
      .at_least(0);
  b.field("auto_rollback", &EvalSection::auto_rollback,
          "Return the running job to the checkpoint tagged `stable` when rollback_after evaluations in a row "
          "fall below it beyond their 95% interval.");
  b.field("rollback_after", &EvalSection::rollback_after,
          "Consecutive regressed evaluations before auto_rollback acts.")
      .at_least(1);
  return spec;
}

SectionSpec pretrain_section() {
  SectionSpec spec{"pretrain", "Supervised warm-up of the base policy on scripted-expert demonstrations.", {}, {}, {}};
  SectionBuilder<PretrainSection> b(spec, &Config::pretrain);
  b.field("episodes", &PretrainSection::episodes, "Demonstration episodes generated.").at_least(1);
  b.field("expert_error_rate", &PretrainSection::expert_error_rate,
          "Error rate of the scripted experts (an imperfect base leaves room for RL).")
      .between(0, 1);
  b.field("easier_levels", &PretrainSection::easier_levels,
          "Each demonstration is played at its family's difficulty or up to this many levels below it "
          "(uniformly, never below 1), so that the base also knows the easier levels an [env] curriculum "
          "may start from.")
      .at_least(0);
  b.field("first_stage_families", &PretrainSection::first_stage_families,
          "Families of an optional first stage, trained alone before the whole [env] mix (a skill that needs "
          "a long exposure, like lookup's copying of keys, does not appear from its share of a mix); each "
          "must be in env.families. Empty = one stage.");
  b.field("first_stage_steps", &PretrainSection::first_stage_steps,
          "Optimizer steps of that first stage (each stage has its own optimizer state and lr schedule); "
          "`steps` on the whole mix follow it.")
      .at_least(0);
  b.field("steps", &PretrainSection::steps, "Optimizer steps (on the whole mix, after any first stage).").at_least(1);
  b.field("batch_episodes", &PretrainSection::batch_episodes, "Episodes per step.").at_least(1);
  b.field("lr", &PretrainSection::lr, "Peak learning rate.").greater_than(0);
  b.field("warmup_steps", &PretrainSection::warmup_steps, "Linear warm-up steps.").at_least(0);
  b.field("cosine", &PretrainSection::cosine, "Cosine decay to 10% of lr after warm-up.");
  b.field("output", &PretrainSection::output, "Where the base policy is written; empty = <run dir>/base.pt.");
  return spec;
}

SectionSpec env_section() {
  SectionSpec spec{"env", "Environment workers and the task mix they serve.", {}, {}, {}};
  SectionBuilder<EnvSection> b(spec, &Config::env);
  b.field("families", &EnvSection::families,
          "Task families new sessions are drawn from (built-in: arithmetic, maze, guess, sort, "
          "lookup; or external).");
  b.field("difficulty", &EnvSection::difficulty, "Default difficulty of new sessions.").between(1, 10);
  b.choice("shaping", &EnvSection::shaping, {{"sparse", Shaping::Sparse}, {"shaped", Shaping::Shaped}},
           "Reward shaping: sparse (1 on success) or shaped (per-step progress rewards too).");
  b.field("max_turns", &EnvSection::max_turns, "Default step budget; 0 = each family's own.").at_least(0);
  b.field("sessions_per_worker", &EnvSection::sessions_per_worker,
          "Live sessions one env worker hosts at most (changeable at run time).")
      .between(1, 100000);
  b.field("threads", &EnvSection::threads,
          "Threads stepping sessions on one env worker; 0 = the rank's compute threads.")
      .between(0, 1024);
  b.field("timeout_s", &EnvSection::timeout_s, "Per-step timeout of an environment.").greater_than(0);
  b.field("max_retries", &EnvSection::max_retries,
          "Retries of a failed or timed-out step before the session ends with a recorded error.")
      .between(0, 100);
  b.field("retry_backoff_s", &EnvSection::retry_backoff_s, "Pause before the first retry; doubles with each retry.")
      .at_least(0);
  b.field("archive_dir", &EnvSection::archive_dir, "Directory for session snapshots; empty = <run dir>/archive/env.");
  b.field("reward_min", &EnvSection::reward_min,
          "Smallest reward an environment may report; a lower or non-finite one fails the attempt "
          "(reason invalid_reward).");
  b.field("reward_max", &EnvSection::reward_max,
          "Largest reward an environment may report; a higher or non-finite one fails the attempt "
          "(reason invalid_reward).");
  b.field("snapshot_every_turns", &EnvSection::snapshot_every_turns,
          "Every this many turns a session's snapshot (the environment's own state) goes to the archive; "
          "a session whose env worker is lost is restored on another from it (and the actions since). "
          "0 = never: the session is then replayed from its start.")
      .at_least(0);
  b.field("breaker_failures", &EnvSection::breaker_failures,
          "Consecutive sessions of one family that fail for good (as one actor sees them) before the "
          "family is paused; 0 = never pause.")
      .at_least(0);
  b.field("breaker_cooldown_s", &EnvSection::breaker_cooldown_s,
          "A paused family is drawn from again after this long (it pauses again at its next failure).")
      .greater_than(0);
  b.field("curriculum", &EnvSection::curriculum,
          "Training difficulty per family follows its recent success: raised above curriculum_raise_at, "
          "lowered below curriculum_lower_at (evaluation keeps the configured difficulty).");
  b.field("curriculum_window", &EnvSection::curriculum_window,
          "Training episodes that decide a family's next move: those of the first groups started at its "
          "current level, once all of them are back. The episodes of a group share one task, so the sample "
          "holds curriculum_window / rollout.group_size tasks: too few, and noise moves the level.")
      .at_least(1);
  b.field("curriculum_raise_at", &EnvSection::curriculum_raise_at,
          "Success over the window at or above which a family's difficulty goes up by one.")
      .between(0, 1);
  b.field("curriculum_lower_at", &EnvSection::curriculum_lower_at,
          "Success over the window at or below which a family's difficulty goes down by one.")
      .between(0, 1);
  b.field("curriculum_max_difficulty", &EnvSection::curriculum_max_difficulty,
          "Highest level the curriculum reaches; 0 = each family's own maximum.")
      .at_least(0);
  b.field("adaptive_weights", &EnvSection::adaptive_weights,
          "New training groups drawn by each family's learning progress (how fast its success moves) "
          "times its [env.<family>] weight; a family that stands still keeps a fifth of the share.");
  return spec;
}

SectionSpec env_family_section(const std::string& family) {
  SectionSpec spec{"env." + family, "Overrides of [env] for the " + family + " family.", {}, {}, {}};
  SectionBuilder<EnvFamilySection> b(
      spec, [family](Config& c) -> EnvFamilySection& { return c.env_families[family]; },
      [family](const Config& c) -> const EnvFamilySection& { return c.env_families.at(family); });
  b.field("difficulty", &EnvFamilySection::difficulty, "Difficulty; 0 = [env] difficulty.").between(0, 10);
  b.choice("shaping", &EnvFamilySection::shaping,
           {{"inherit", ShapingChoice::Inherit}, {"sparse", ShapingChoice::Sparse}, {"shaped", ShapingChoice::Shaped}},
           "Reward shaping; inherit = [env] shaping.");
  b.field("max_turns", &EnvFamilySection::max_turns, "Step budget; 0 = [env] max_turns.").at_least(0);
  b.field("weight", &EnvFamilySection::weight, "Relative share of new sessions from this family.").at_least(0);
  return spec;
}

SectionSpec env_external_section() {
  SectionSpec spec{"env.external",
                   "The external family: a process speaking JSON lines on stdin/stdout "
                   "(docs/external_env.md).",
                   {},
                   {},
                   {}};
  SectionBuilder<ExternalEnvSection> b(spec, &Config::env_external);
  b.field("command", &ExternalEnvSection::command,
          "Shell command that starts one environment process (run with /bin/sh -c).");
  b.field("startup_timeout_s", &ExternalEnvSection::startup_timeout_s,
          "The process must answer its first request within this time.")
      .greater_than(0);
  return spec;
}

SectionSpec faults_section() {
  SectionSpec spec{"faults", "Deliberate failures for testing fault handling; off (-1) by default.", {}, {}, {}};
  SectionBuilder<FaultsSection> b(spec, &Config::faults);
  b.field("fail_rank", &FaultsSection::fail_rank, "This rank raises a fatal error once roles are assigned (-1: none).")
      .at_least(-1);
  b.field("hang_rank", &FaultsSection::hang_rank,
          "This rank stops answering messages, to exercise timeouts (-1: none).")
      .at_least(-1);
  b.field("env_hang_rate", &FaultsSection::env_hang_rate, "Probability that an environment step attempt hangs.")
      .between(0, 1);
  b.field("env_hang_s", &FaultsSection::env_hang_s, "How long an injected hang lasts.").greater_than(0);
  b.field("env_crash_rate", &FaultsSection::env_crash_rate, "Probability that an environment step attempt crashes.")
      .between(0, 1);
  b.field("env_fault_attempts", &FaultsSection::env_fault_attempts,
          "Faults hit only the first N attempts of a step (large = permanent failures).")
      .at_least(1);
  b.field("env_fault_seed", &FaultsSection::env_fault_seed, "Seed choosing which steps the faults hit.").at_least(0);
  b.choice("checkpoint_crash_point", &FaultsSection::checkpoint_crash_point,
           {{"none", CheckpointCrashPoint::None},
            {"after_arrays", CheckpointCrashPoint::AfterArrays},
            {"before_rename", CheckpointCrashPoint::BeforeRename},
            {"before_index", CheckpointCrashPoint::BeforeIndex},
            {"before_latest", CheckpointCrashPoint::BeforeLatest}},
           "Learner 0 _exit()s in the middle of a checkpoint save, at this point (crash tests).");
  b.field("checkpoint_crash_version", &FaultsSection::checkpoint_crash_version,
          "The save of this policy version crashes; -1 = the first save of the run.")
      .at_least(-1);
  b.field("plan", &FaultsSection::plan,
          "Faults of a real run, one per entry: \"kill|freeze|exit ROLE INDEX at step N\" (or \"at S s\"), "
          "\"slow ROLE INDEX by MS ms at step N\", \"kill actor INDEX while receiving\" (mid-publication), "
          "\"corrupt bucket at step N\", \"corrupt message ROLE INDEX at step N\"; ROLE: learner, actor, "
          "env_worker, standby_actor. An entry strikes the first attempt only (a restart resumes past it) "
          "unless it ends with \"on every attempt\" (docs/reliability.md).");
  return spec;
}

}  // namespace

const std::vector<SectionSpec>& all_sections() {
  static const std::vector<SectionSpec> sections = {run_section(),
                                                    cluster_section(),
                                                    model_section(),
                                                    chat_section(),
                                                    moe_section(),
                                                    rollout_section(),
                                                    algo_section(),
                                                    optim_section(),
                                                    sync_section(),
                                                    checkpoint_section(),
                                                    eval_section(),
                                                    pretrain_section(),
                                                    env_section(),
                                                    env_family_section("arithmetic"),
                                                    env_family_section("maze"),
                                                    env_family_section("guess"),
                                                    env_family_section("sort"),
                                                    env_family_section("lookup"),
                                                    env_external_section(),
                                                    telemetry_section(),
                                                    faults_section()};
  return sections;
}

const SectionSpec* find_section(const std::string& name) {
  for (const SectionSpec& s : all_sections())
    if (s.name == name) return &s;
  return nullptr;
}

}  // namespace moerl::config
