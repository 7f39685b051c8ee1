// `moerl bench topk [--config C] [--set k=v ...] [--init base.pt] [--k 1,2,4] [--episodes N] [--quick]`:
// the latency/success trade-off of routing each token to k experts at
// generation time (rollout.moe_top_k) instead of the model's moe.top_k.
// For every k, in this one process (no MPI job):
//   decode    tokens/s and p50/p99 step latency of the GenerationEngine with
//             rollout.sessions_per_actor sessions (an actor's decode batch),
//             every one decoding from a held-out task statement. One engine
//             per k, stepped in turn (one step of each k, then the next), so
//             that a machine that slows down or speeds up during the run
//             weighs on every k alike.
//   success   held-out success per family: N episodes per family (default
//             rollout.eval_episodes) on fixed seeds, the same for every k,
//             played against the built-in environments directly with the
//             actor's layout, context budget and stop rule, sampled at
//             rollout.eval_temperature (0 = greedy) with the same session
//             seeds for every k.
// The baseline is the model's own moe.top_k (measured even when --k leaves
// it out): ratios against it for speed, differences in points for success.
// Timings on a shared machine are noisy: compare the ratios side by side.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "decode_timing.h"
#include "bench_args.h"
#include "bench_policy.h"
#include "moerl/bench/registry.h"
#include "moerl/bench/timing.h"
#include "moerl/config/config.h"
#include "moerl/core/check.h"
#include "moerl/env/task_family.h"
#include "moerl/env/task_mix.h"
#include "moerl/hf/hf_config.h"
#include "moerl/model/hf_policy_loader.h"
#include "moerl/learner/pretrain.h"
#include "moerl/setup/config_loading.h"
#include "moerl/text/episode_format.h"
#include "moerl/rollout/generation_engine.h"

namespace moerl::bench {
namespace {

// Held-out seeds: far from the training seeds (run.seed * 1000003 + n) and
// from those of the job's own evaluation (2^40 + ...), so that a base
// pretrained or trained on the usual streams meets these tasks fresh.
constexpr std::uint64_t kHeldOutSeedBase = 3ull << 40;

struct TopkArgs {
  PolicyBenchArgs policy;        // --config, --set, --init
  std::vector<std::int64_t> ks;  // empty: powers of two up to num_experts, and the model's k
  std::int64_t episodes = -1;    // per family; -1 = rollout.eval_episodes (4 with --quick)
};

TopkArgs parse_args(const std::vector<std::string>& args) {
  TopkArgs out;
  out.policy = parse_policy_bench_args(args, "bench topk",
                                       "--config F, --set section.key=value, --init FILE, --k 1,2,4, --episodes N",
                                       [&](const std::string& option, const auto& value) {
                                         if (option == "--k") {
                                           std::stringstream list(value());
                                           for (std::string item; std::getline(list, item, ',');)
                                             out.ks.push_back(whole_number(item, "bench topk", "--k"));
                                           if (out.ks.empty())
                                             throw Error("bench topk: --k needs a list such as 1,2,4");
                                           return true;
                                         }
                                         if (option == "--episodes") {
                                           out.episodes = whole_number(value(), "bench topk", "--episodes");
                                           if (out.episodes < 1)
                                             throw Error("bench topk: --episodes must be at least 1");
                                           return true;
                                         }
                                         return false;
                                       });
  return out;
}

// The k's to measure, sorted, the model's own among them.
std::vector<std::int64_t> resolve_ks(std::vector<std::int64_t> ks, const config::MoeSection& moe) {
  if (ks.empty())
    for (std::int64_t k = 1; k <= moe.num_experts; k *= 2) ks.push_back(k);
  for (std::int64_t k : ks)
    if (k < 1 || k > moe.num_experts)
      throw Error("bench topk: --k " + std::to_string(k) +
                  " must be in [1, moe.num_experts = " + std::to_string(moe.num_experts) + "]");
  ks.push_back(moe.top_k);
  std::sort(ks.begin(), ks.end());
  ks.erase(std::unique(ks.begin(), ks.end()), ks.end());
  return ks;
}

struct HeldOutTask {
  env::TaskSpec task;
  std::uint64_t session_seed = 0;
};

std::vector<HeldOutTask> held_out_tasks(const config::Config& config, std::int64_t per_family) {
  std::vector<HeldOutTask> tasks;
  for (const std::string& family : config.env.families) {
    if (env::find_builtin_family(family) == nullptr)
      throw Error("bench topk: plays the built-in families in this process; '" + family +
                  "' is not one (drop it from env.families with --set)");
    for (std::int64_t i = 0; i < per_family; ++i) {
      HeldOutTask t;
      t.task =
          env::make_task(config.env, config.env_families, family, kHeldOutSeedBase + static_cast<std::uint64_t>(i));
      t.session_seed = t.task.seed * 0x9E3779B97F4A7C15ull + std::hash<std::string>{}(family);
      tasks.push_back(t);
    }
  }
  return tasks;
}

// The actor's engine settings, routing with k experts.
rollout::EngineOptions engine_options(const config::Config& config, const text::EpisodeFormat& format, std::int64_t k) {
  rollout::EngineOptions options;
  options.format = format;
  options.context_budget = config.rollout.max_tokens_per_episode;
  options.context_policy = rollout::ContextPolicy::ContextEndEpisode;
  options.moe_top_k = k;
  return options;
}

// Plays every task to its end, rollout.sessions_per_actor at a time, as an
// actor does (prompt layout, stop rule, the context budget ending the
// episode); returns successes per family.
std::map<std::string, std::int64_t> play_held_out(model::Policy& policy, const config::Config& config,
                                                  const text::EpisodeFormat& format, std::int64_t k,
                                                  const std::vector<HeldOutTask>& tasks) {
  rollout::GenerationEngine engine(policy, engine_options(config, format, k));
  rollout::SamplingParams sampling;
  const double temperature = config.rollout.eval_temperature;
  sampling.greedy = temperature == 0;
  sampling.temperature = temperature > 0 ? temperature : 1.0;
  sampling.top_p = config.rollout.top_p;
  sampling.top_k = config.rollout.top_k;
  rollout::StopParams stop;
  stop.max_turn_tokens = config.rollout.max_tokens_per_turn;

  struct Live {
    std::unique_ptr<env::Environment> env;
    std::string family;
    bool cut_off = false;  // the last action ended without its end-of-turn token
  };
  std::map<std::uint64_t, Live> live;
  std::map<std::string, std::int64_t> successes;
  for (const HeldOutTask& t : tasks) successes.emplace(t.task.family, 0);
  auto prompt = [&](std::uint64_t id, const std::string& observation, bool first) {
    Live& l = live.at(id);
    engine.append_prompt(id, format.prompt_turn(observation, first, l.cut_off));
    // A prompt past the context budget ends the episode: the turn then finishes at once.
    engine.start_turn(id, sampling, stop);
  };
  auto finish = [&](std::uint64_t id, bool success) {
    if (success) ++successes[live.at(id).family];
    engine.remove_session(id);
    live.erase(id);
  };
  std::size_t next = 0;
  const auto slots = static_cast<std::size_t>(config.rollout.sessions_per_actor);
  while (next < tasks.size() || !live.empty()) {
    while (live.size() < slots && next < tasks.size()) {
      const HeldOutTask& t = tasks[next];
      const auto id = static_cast<std::uint64_t>(next++);
      Live l{env::make_builtin_environment(t.task.family), t.task.family, false};
      const std::string observation = l.env->open(t.task);
      live.emplace(id, std::move(l));
      engine.add_session(id, t.session_seed);
      prompt(id, observation, true);
    }
    for (std::uint64_t id : engine.step()) {
      const rollout::GeneratedTurn turn = engine.take_turn(id);
      Live& l = live.at(id);
      if (turn.episode_over) {  // the context budget: not a success, as in a job
        finish(id, false);
        continue;
      }
      l.cut_off = turn.tokens.empty() || turn.tokens.back() != format.end_of_turn_id();
      const env::StepResult result = l.env->step(format.action_text(turn.tokens));
      if (result.done) {
        finish(id, l.env->succeeded());
      } else {
        prompt(id, result.observation, false);
      }
    }
  }
  return successes;
}

struct KResult {
  std::int64_t k = 0;
  std::vector<double> step_s;             // wall seconds of every timed decode step
  std::map<std::string, double> success;  // per family, 0..1
  double mean_success = 0;

  std::map<std::string, double> metrics(std::int64_t sessions) const {
    double total_s = 0;
    for (double t : step_s) total_s += t;
    const double tokens = static_cast<double>(sessions) * static_cast<double>(step_s.size());
    std::map<std::string, double> m{{"tokens_per_s", total_s > 0 ? tokens / total_s : 0.0},
                                    {"p50_step_ms", percentile(step_s, 0.5) * 1e3},
                                    {"p99_step_ms", percentile(step_s, 0.99) * 1e3},
                                    {"success_mean", mean_success}};
    for (const auto& [family, s] : success) m["success_" + family] = s;
    return m;
  }
};

// Half-width (0..1) of the 95% interval of mean_success(r) - mean_success(base)
// over `n` episodes per family, treating the two as independent samples
// (normal approximation). The k's share their seeds, which only narrows the
// true interval, so this errs on the wide side. 0 for the baseline itself.
double mean_gap_ci95(const KResult& r, const KResult& base, std::int64_t n) {
  if (r.k == base.k) return 0.0;
  double variance = 0;
  for (const auto& [family, p] : r.success) {
    const double q = base.success.at(family);
    variance += (p * (1 - p) + q * (1 - q)) / static_cast<double>(n);
  }
  const auto families = static_cast<double>(r.success.size());
  return 1.96 * std::sqrt(variance) / families;
}

std::string trade_off_table(const std::vector<KResult>& results, const KResult& base,
                            const std::vector<std::string>& families, std::int64_t episodes, std::int64_t sessions) {
  std::ostringstream out;
  char cell[64];
  out << "  k   tokens/s      x   p50 ms      x   p99 ms      x";
  for (const std::string& f : families) {
    std::snprintf(cell, sizeof cell, " %10.10s", f.c_str());
    out << cell;
  }
  out << "    mean  d mean  +-95%\n";
  const auto base_m = base.metrics(sessions);
  for (const KResult& r : results) {
    const auto m = r.metrics(sessions);
    const auto ratio = [&](const char* key) { return base_m.at(key) > 0 ? m.at(key) / base_m.at(key) : 0.0; };
    std::snprintf(cell, sizeof cell, "%3lld", static_cast<long long>(r.k));
    out << cell;
    std::snprintf(cell, sizeof cell, " %10.0f %6.2f %8.3f %6.2f %8.3f %6.2f", m.at("tokens_per_s"),
                  ratio("tokens_per_s"), m.at("p50_step_ms"), ratio("p50_step_ms"), m.at("p99_step_ms"),
                  ratio("p99_step_ms"));
    out << cell;
    for (const std::string& f : families) {
      std::snprintf(cell, sizeof cell, " %9.1f%%", 100 * r.success.at(f));
      out << cell;
    }
    std::snprintf(cell, sizeof cell, " %6.1f%% %+7.1f %6.1f\n", 100 * r.mean_success,
                  100 * (r.mean_success - base.mean_success), 100 * mean_gap_ci95(r, base, episodes));
    out << cell;
  }
  return out.str();
}

BenchReport run_topk_bench(const BenchOptions& options) {
  const TopkArgs args = parse_args(options.args);
  const config::Config config = setup::load_config_file(args.policy.config_path, args.policy.overrides);
  MOERL_CHECK(config.moe.enabled, "bench topk: the model has no MoE layers (moe.enabled = false)");
  const std::vector<std::int64_t> ks = resolve_ks(args.ks, config.moe);
  const std::int64_t episodes = args.episodes > 0 ? args.episodes
                                : options.quick   ? 4
                                                  : std::max<std::int64_t>(config.rollout.eval_episodes, 1);
  const std::int64_t steps = options.quick ? 8 : 256, warmup = options.quick ? 2 : 4;
  torch::NoGradGuard no_grad;
  model::Policy policy = make_bench_policy(config, args.policy.init_path, "bench topk");
  const text::EpisodeFormat format = text::make_episode_format(config.model, config.chat);
  const std::vector<HeldOutTask> tasks = held_out_tasks(config, episodes);

  // Decode timing: an actor's batch, each session on a held-out task statement.
  std::vector<std::vector<std::int64_t>> prompts;
  for (std::int64_t s = 0; s < config.rollout.sessions_per_actor; ++s) {
    const HeldOutTask& t = tasks[static_cast<std::size_t>(s) % tasks.size()];
    prompts.push_back(format.prompt_turn(env::make_builtin_environment(t.task.family)->open(t.task), true, false));
  }
  std::vector<KResult> results(ks.size());
  for (std::size_t i = 0; i < ks.size(); ++i) results[i].k = ks[i];
  {
    // One engine per k over the one policy: each sets the policy's active
    // experts when built, so they are set again before each engine's step.
    std::vector<std::unique_ptr<rollout::GenerationEngine>> engines;
    for (const KResult& r : results) {
      engines.push_back(std::make_unique<rollout::GenerationEngine>(policy, engine_options(config, format, r.k)));
      start_decode_sessions(*engines.back(), prompts, warmup + steps + 1);
    }
    auto step = [&](std::size_t i) {
      policy->set_active_experts(results[i].k);
      const auto start = std::chrono::steady_clock::now();
      engines[i]->step();
      return seconds_since(start);
    };
    for (std::int64_t w = 0; w < warmup; ++w)
      for (std::size_t i = 0; i < results.size(); ++i) step(i);
    // Step by step, the k's in turn (and the first of each turn rotating),
    // so that whatever else the machine does falls on every k alike.
    for (std::int64_t n = 0; n < steps; ++n)
      for (std::size_t j = 0; j < results.size(); ++j) {
        const std::size_t i = (j + static_cast<std::size_t>(n)) % results.size();
        results[i].step_s.push_back(step(i));
      }
  }
  for (KResult& r : results) {
    const std::map<std::string, std::int64_t> won = play_held_out(policy, config, format, r.k, tasks);
    for (const auto& [family, n] : won) {
      r.success[family] = static_cast<double>(n) / static_cast<double>(episodes);
      r.mean_success += r.success[family] / static_cast<double>(won.size());
    }
  }
  const KResult& base =
      *std::find_if(results.begin(), results.end(), [&](const KResult& r) { return r.k == config.moe.top_k; });

  std::printf("bench topk: %lld experts, trained with moe.top_k = %lld (the baseline of every ratio)\n",
              static_cast<long long>(config.moe.num_experts), static_cast<long long>(config.moe.top_k));
  std::printf(
      "decode: %lld sessions, %lld steps per k, the k's stepped in turn; x = this k / k = %lld (tokens/s: "
      "higher is faster; latency: lower is faster)\n",
      static_cast<long long>(config.rollout.sessions_per_actor), static_cast<long long>(steps),
      static_cast<long long>(config.moe.top_k));
  char sampled[48] = "greedy";
  if (config.rollout.eval_temperature > 0)
    std::snprintf(sampled, sizeof sampled, "sampled at temperature %g", config.rollout.eval_temperature);
  std::printf(
      "held-out success: %lld episodes per family on the same seeds for every k, %s (95%% interval about "
      "+-%.0f points per family at 50%%); d mean: points of mean success against k = %lld, +-95%%: the "
      "interval of that difference (independent samples assumed: wide for shared seeds)\n",
      static_cast<long long>(episodes), sampled, 196 * std::sqrt(0.25 / static_cast<double>(episodes)),
      static_cast<long long>(config.moe.top_k));
  std::printf("%s\n",
              trade_off_table(results, base, config.env.families, episodes, config.rollout.sessions_per_actor).c_str());

  BenchReport report;
  report.bench = "topk";
  for (const KResult& r : results) {
    BenchCase c;
    c.name = "k=" + std::to_string(r.k);
    c.params = {{"k", r.k},
                {"model_top_k", config.moe.top_k},
                {"experts", config.moe.num_experts},
                {"sessions", config.rollout.sessions_per_actor},
                {"episodes_per_family", episodes},
                {"eval_temperature", config.rollout.eval_temperature}};
    c.metrics = r.metrics(config.rollout.sessions_per_actor);
    c.metrics["success_mean_gap"] = r.mean_success - base.mean_success;
    c.metrics["success_mean_gap_ci95"] = mean_gap_ci95(r, base, episodes);
    c.baseline = base.metrics(config.rollout.sessions_per_actor);
    c.ratio_metric = "tokens_per_s";
    report.cases.push_back(c);
  }
  return report;
}

MOERL_BENCHMARK("topk",
                "active experts per token at generation (rollout.moe_top_k): decode tokens/s, p50/p99 step "
                "latency and held-out success per family for k in a list, against the model's own top_k",
                run_topk_bench);

}  // namespace
}  // namespace moerl::bench
