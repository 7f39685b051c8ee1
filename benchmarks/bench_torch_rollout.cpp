// `moerl bench rollout`: decode tokens/s and p99 step latency of the
// GenerationEngine against the number of concurrent sessions and the context
// length, with the paged KV cache (the case) against recomputing the full
// forward over every sequence each step (the baseline), in the same run.
// Each case also carries a compute-roofline estimate: achieved FLOP/s
// (tokens/s x FLOPs per token, FLOPs per token = 2 x active parameters +
// attention over the context) divided by the GFLOP/s of a large matmul
// measured on this machine.
// `moerl bench rollout [--config C] [--set k=v] [--init FILE|hf:DIR]`
// decodes with a run's policy and real weights instead of random ones;
// `--recompute 0` times the engine alone (the baseline's full forwards cost
// more than the engine's steps at long contexts, and a peer comparison,
// scripts/bench_peer.sh, does not use them).

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "decode_timing.h"
#include "bench_args.h"
#include "bench_policy.h"
#include "moerl/bench/registry.h"
#include "moerl/config/config.h"
#include "moerl/bench/timing.h"
#include "moerl/model/policy.h"
#include "moerl/setup/config_loading.h"
#include "moerl/text/tokenizer.h"
#include "moerl/rollout/generation_engine.h"

namespace moerl::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Peak-ish matmul throughput of this machine (float32, all compute threads).
double matmul_gflops(std::int64_t n, int reps) {
  torch::NoGradGuard no_grad;
  const torch::Tensor a = torch::randn({n, n});
  const torch::Tensor b = torch::randn({n, n});
  torch::Tensor c = torch::mm(a, b);
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    c = torch::mm(a, b);
    best = std::min(best, seconds_since(t0));
  }
  return 2.0 * static_cast<double>(n * n * n) / best / 1e9;
}

// Parameters one decoded token touches: everything except the embedding
// table (a lookup) and the routed experts it was not sent to.
double active_parameters(model::Policy& policy) {
  const auto& moe = policy->moe_config();
  double total = 0;
  for (const auto& item : policy->named_parameters()) {
    const std::string& name = item.key();
    const double n = static_cast<double>(item.value().numel());
    if (name == "embed_tokens.weight") continue;
    if (name.find(".mlp.experts.") != std::string::npos) {
      total += n * static_cast<double>(moe.top_k) / static_cast<double>(moe.num_experts);
    } else {
      total += n;
    }
  }
  if (policy->model_config().tie_embeddings) total += static_cast<double>(policy->embed_tokens->weight.numel());
  return total;
}

// FLOPs of one token at context length ctx: 2 per active weight plus
// q.k and p.v over ctx positions in every layer.
double flops_per_token(model::Policy& policy, double ctx) {
  const auto& m = policy->model_config();
  return 2.0 * active_parameters(policy) + 4.0 * static_cast<double>(m.num_layers * m.d_model) * ctx;
}

std::vector<std::int64_t> make_prompt(std::int64_t len, std::int64_t salt) {
  std::vector<std::int64_t> t{text::SpecialTokens::kBos, text::SpecialTokens::kUser};
  for (std::int64_t i = 0; static_cast<std::int64_t>(t.size()) < len - 1; ++i)
    t.push_back(32 + (i * 31 + salt * 7) % 90);
  t.push_back(text::SpecialTokens::kAssistant);
  return t;
}

struct Measured {
  double tokens_per_s = 0;
  double p99_step_s = 0;
  double mean_step_s = 0;
  double kv_bytes = 0;
};

// Engine: prefill every session (untimed), then time `steps` decode steps.
Measured run_engine(model::Policy& policy, std::int64_t sessions, std::int64_t ctx, std::int64_t steps) {
  rollout::EngineOptions options;
  options.max_step_tokens = 1 << 20;
  rollout::GenerationEngine engine(policy, options);
  std::vector<std::vector<std::int64_t>> prompts;
  for (std::int64_t s = 0; s < sessions; ++s) prompts.push_back(make_prompt(ctx, s));
  // Two untimed steps after the prefill, as the peer's loop takes
  // (benchmarks/peer/peer_decode.py), so both sides time the same steps.
  constexpr std::int64_t kWarmupSteps = 2;
  const DecodeTiming timing = time_decode_steps(engine, prompts, steps, kWarmupSteps);
  Measured m;
  m.tokens_per_s = timing.tokens_per_s();
  m.p99_step_s = percentile(timing.step_s, 0.99);
  m.mean_step_s = timing.total_s / static_cast<double>(steps);
  m.kv_bytes = static_cast<double>(timing.kv_bytes);
  return m;
}

// Baseline: no cache; every step runs the full forward over every sequence
// and samples greedily from the last position.
Measured run_recompute(model::Policy& policy, std::int64_t sessions, std::int64_t ctx, std::int64_t steps) {
  torch::NoGradGuard no_grad;
  std::vector<std::int64_t> rows;
  for (std::int64_t s = 0; s < sessions; ++s) {
    const auto p = make_prompt(ctx, s);
    rows.insert(rows.end(), p.begin(), p.end());
  }
  torch::Tensor tokens = torch::tensor(rows, torch::kLong).view({sessions, ctx});
  std::vector<double> times;
  const auto t0 = Clock::now();
  for (std::int64_t i = 0; i < steps; ++i) {
    const auto ts = Clock::now();
    auto out = policy->forward(tokens);
    const torch::Tensor next = out.next_token_logits().argmax(-1).unsqueeze(1);
    tokens = torch::cat({tokens, next}, 1);
    times.push_back(seconds_since(ts));
  }
  Measured m;
  const double total = seconds_since(t0);
  m.tokens_per_s = static_cast<double>(sessions * steps) / total;
  m.p99_step_s = percentile(times, 0.99);
  m.mean_step_s = total / static_cast<double>(steps);
  return m;
}

// The sizes decoded: --sessions 1,4,16 --contexts 64,512 --steps 32 (so
// that a peer benchmark, scripts/bench_peer.sh, can ask for the same ones).
struct RolloutSizes {
  std::vector<std::int64_t> sessions, contexts;
  std::int64_t steps = 32;
  bool recompute = true;  // --recompute 0 skips the full-recompute baseline
};

RolloutSizes default_sizes(bool quick) {
  if (quick) return {{1, 4}, {32}, 8};
  return {{1, 4, 16, 64, 256}, {64, 512}, 32};
}

std::vector<std::int64_t> number_list(const std::string& text, const std::string& option) {
  std::vector<std::int64_t> numbers;
  for (size_t at = 0; at <= text.size();) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::int64_t n = whole_number(text.substr(at, comma - at), "bench rollout", option);
    if (n <= 0) throw Error("bench rollout: " + option + " needs positive numbers, got '" + text + "'");
    numbers.push_back(n);
    at = comma + 1;
  }
  return numbers;
}

// The model to decode with: the default architecture with random weights,
// or, with any of --config/--set/--init, a run's policy with real weights
// (--init FILE, or --init hf:DIR for a Hugging Face directory), so that the
// numbers compare with another engine on the same weights.
model::Policy rollout_policy(const BenchOptions& options, RolloutSizes& sizes) {
  int own_options = 0;
  const OwnOption own = [&](const std::string& option, const std::function<const std::string&()>& value) {
    if (option == "--sessions")
      sizes.sessions = number_list(value(), option);
    else if (option == "--contexts")
      sizes.contexts = number_list(value(), option);
    else if (option == "--recompute")
      sizes.recompute = whole_number(value(), "bench rollout", option) != 0;
    else if (option == "--steps")
      sizes.steps = std::max<std::int64_t>(1, whole_number(value(), "bench rollout", option));
    else
      return false;
    ++own_options;
    return true;
  };
  PolicyBenchArgs args = parse_policy_bench_args(options.args, "bench rollout",
                                                 "--config F, --set section.key=value, --init FILE|hf:DIR, --sessions "
                                                 "N,N,.., --contexts N,N,.., --steps N, --recompute 0|1",
                                                 own);
  if (options.args.size() == 2 * static_cast<size_t>(own_options)) {
    config::ModelSection model;  // defaults
    config::MoeSection moe;
    if (options.quick) {
      model.d_model = 64;
      model.d_ff = 128;
      model.max_seq_len = 128;
      moe.d_expert = 64;
    }
    torch::manual_seed(1);
    model::Policy policy(model, moe);
    policy->eval();
    return policy;
  }
  if (args.init_path.rfind("hf:", 0) == 0) {
    args.overrides.push_back("model.source=" + args.init_path);
    args.init_path.clear();
  }
  const config::Config config = setup::load_config_file(args.config_path, args.overrides);
  return make_bench_policy(config, args.init_path, "bench rollout");
}

BenchReport run_rollout_bench(const BenchOptions& options) {
  BenchReport report;
  report.bench = "rollout";
  torch::NoGradGuard no_grad;
  RolloutSizes sizes = default_sizes(options.quick);
  model::Policy policy = rollout_policy(options, sizes);
  const config::ModelSection& model = policy->model_config();
  const config::MoeSection& moe = policy->moe_config();
  const double peak = matmul_gflops(options.quick ? 256 : 1024, options.quick ? 2 : 5);
  const std::vector<std::int64_t>& batch_sizes = sizes.sessions;
  const std::vector<std::int64_t>& contexts = sizes.contexts;
  const std::int64_t steps = sizes.steps;
  for (std::int64_t ctx : contexts) {
    // The prompt, the prefill's token, two warm-up steps and the timed ones must stay below the budget.
    if (ctx + steps + 3 >= model.max_seq_len) {
      std::fprintf(stderr, "bench rollout: context %lld skipped: model.max_seq_len is %lld\n",
                   static_cast<long long>(ctx), static_cast<long long>(model.max_seq_len));
      continue;
    }
    for (std::int64_t sessions : batch_sizes) {
      const Measured cached = run_engine(policy, sessions, ctx, steps);
      const double mid_ctx = static_cast<double>(ctx) + static_cast<double>(steps) / 2;
      const double flops = flops_per_token(policy, mid_ctx);
      BenchCase c;
      c.name = "decode";
      c.params = {{"sessions", sessions},
                  {"context", ctx},
                  {"steps", steps},
                  {"d_model", model.d_model},
                  {"layers", model.num_layers},
                  {"experts", moe.num_experts},
                  {"top_k", moe.top_k}};
      c.metrics = {{"tokens_per_s", cached.tokens_per_s},
                   {"p99_step_ms", cached.p99_step_s * 1e3},
                   {"kv_MB", cached.kv_bytes / 1e6},
                   {"GFLOPs", cached.tokens_per_s * flops / 1e9},
                   {"roofline_frac", cached.tokens_per_s * flops / 1e9 / peak},
                   {"matmul_GFLOPs", peak}};
      if (sizes.recompute) {
        // The recompute baseline costs sessions x context tokens per step:
        // fewer steps where that is large (tokens/s is per step anyway).
        const std::int64_t full_steps = std::clamp<std::int64_t>(steps * 4096 / (sessions * ctx), 2, steps);
        const Measured full = run_recompute(policy, sessions, ctx, full_steps);
        // The baseline's useful work is the same tokens; the recomputed
        // context is its waste, so only tokens/s and latency are comparable.
        c.baseline = {{"tokens_per_s", full.tokens_per_s}, {"p99_step_ms", full.p99_step_s * 1e3}};
        c.ratio_metric = "tokens_per_s";
      }
      report.cases.push_back(c);
    }
  }
  return report;
}

MOERL_BENCHMARK("rollout",
                "engine decode tokens/s and p99 step latency vs sessions and context, paged KV cache vs "
                "full recompute; roofline fraction",
                run_rollout_bench);

}  // namespace
}  // namespace moerl::bench
