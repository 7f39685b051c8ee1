// `moerl bench kv [--config C] [--set k=v ...] [--init base.pt] [--rows N] [--quick]`:
// what an int8 KV cache (rollout.kv_cache_dtype = "int8") costs and saves
// against float32, on the same sequences, in one process.
//
// Sequences: N rows sampled from the policy itself (temperature 1, a float32
// cache), so that they lie where the policy puts its mass, as an actor's do.
// Each is then scored three ways:
//   learner   Policy::forward without a cache: the learner's recomputation;
//   float32   prefill of the first 16 tokens, then one token per step through
//             a float32 KV cache: the actor's way, today's default;
//   int8      the same through an int8 cache (model/kv_cache.h).
// Metrics per context length: KV bytes per cached token (the case's ratio:
// float32 / int8), the behaviour log-prob difference |actor - learner| of
// the sampled tokens (mean, p99, max) for both caches, the importance weight
// exp(learner - actor) that the learner applies (mean and the share outside
// [0.8, 1.25], the clip range's neighbourhood), the share of fed tokens
// that int8 routes to other experts than float32 does, and decode tokens/s
// of both caches, measured in alternating rounds.

#include <algorithm>
#include <chrono>
#include <map>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "moerl/bench/registry.h"
#include "moerl/bench/timing.h"
#include "moerl/config/config.h"
#include "moerl/core/error.h"
#include "moerl/model/kv_cache.h"
#include "moerl/model/policy.h"
#include "moerl/setup/config_loading.h"
#include "bench_args.h"
#include "bench_policy.h"

namespace moerl::bench {
namespace {

constexpr std::int64_t kPrefill = 16;  // tokens prefilled at once before decoding starts

struct KvArgs {
  PolicyBenchArgs policy;
  std::int64_t rows = 8;
};

KvArgs parse_args(const std::vector<std::string>& args, bool quick) {
  KvArgs out;
  if (quick) out.rows = 2;
  out.policy = parse_policy_bench_args(args, "bench kv", "--config F, --set section.key=value, --init FILE, --rows N",
                                       [&](const std::string& option, const auto& value) {
                                         if (option != "--rows") return false;
                                         out.rows = whole_number(value(), "bench kv", "--rows");
                                         if (out.rows < 1) throw Error("bench kv: --rows must be at least 1");
                                         return true;
                                       });
  return out;
}

model::KVCache make_cache(const model::Policy& policy, model::KVCacheDtype dtype, std::int64_t rows) {
  model::PagedCacheOptions paged;
  paged.initial_slots = rows;
  paged.dtype = dtype;
  return model::KVCache(policy->model_config(), policy->embed_tokens->weight.options().requires_grad(false), paged);
}

// Feeds tokens [rows, length] through a fresh cache of `dtype`: the first
// kPrefill at once, then one per step. Returns the log-prob of every token
// after the first ([rows, length - 1]) and the cache's bytes per token; with
// `sample`, tokens past the prefill are drawn from the policy and written in.
struct CachedRun {
  torch::Tensor logprobs;  // [rows, length - 1]
  torch::Tensor experts;   // [fed tokens, moe_layers, k], sorted over k; undefined without MoE
  double bytes_per_token = 0;
  double decode_seconds = 0;
};

CachedRun run_cached(model::Policy& policy, torch::Tensor& tokens, model::KVCacheDtype dtype, bool sample) {
  const std::int64_t rows = tokens.size(0), length = tokens.size(1);
  model::KVCache cache = make_cache(policy, dtype, rows);
  std::vector<model::SequenceId> ids;
  for (std::int64_t r = 0; r < rows; ++r) ids.push_back(cache.add_sequence());
  std::vector<torch::Tensor> logprobs, experts;
  auto out = policy->forward_cached(tokens.narrow(1, 0, kPrefill), torch::Tensor(), cache, ids);
  if (out.expert_indices.defined()) experts.push_back(std::get<0>(out.expert_indices.sort(-1)));
  // Log-probs of tokens 1..kPrefill-1 come from the prefill's logits.
  const torch::Tensor prefill = out.unpack(out.logits).log_softmax(-1);  // [rows, kPrefill, vocab]
  logprobs.push_back(
      prefill.narrow(1, 0, kPrefill - 1).gather(2, tokens.narrow(1, 1, kPrefill - 1).unsqueeze(-1)).squeeze(-1));
  torch::Tensor next = out.next_token_logits();
  const auto started = std::chrono::steady_clock::now();
  for (std::int64_t t = kPrefill; t < length; ++t) {
    const torch::Tensor lp = next.log_softmax(-1);  // [rows, vocab]
    if (sample) tokens.select(1, t).copy_(torch::multinomial(lp.exp(), 1).squeeze(-1));
    logprobs.push_back(lp.gather(1, tokens.select(1, t).unsqueeze(-1)));
    if (t + 1 == length) break;
    out = policy->forward_cached(tokens.narrow(1, t, 1), torch::Tensor(), cache, ids);
    if (out.expert_indices.defined()) experts.push_back(std::get<0>(out.expert_indices.sort(-1)));
    next = out.next_token_logits();
  }
  CachedRun run;
  run.decode_seconds = seconds_since(started);
  run.logprobs = torch::cat(logprobs, 1);
  if (!experts.empty()) run.experts = torch::cat(experts, 0);
  run.bytes_per_token =
      static_cast<double>(cache.blocks_in_use() * cache.bytes_per_block()) / static_cast<double>(rows * length);
  return run;
}

// The learner's log-probs of tokens[:, 1:], without a cache.
torch::Tensor learner_logprobs(model::Policy& policy, const torch::Tensor& tokens) {
  const auto out = policy->forward(tokens);
  const torch::Tensor lp = out.unpack(out.logits).log_softmax(-1);  // [rows, length, vocab]
  const std::int64_t length = tokens.size(1);
  return lp.narrow(1, 0, length - 1).gather(2, tokens.narrow(1, 1, length - 1).unsqueeze(-1)).squeeze(-1);
}

void add_gap_metrics(std::map<std::string, double>& into, const torch::Tensor& actor, const torch::Tensor& learner) {
  const torch::Tensor gap = (actor - learner).abs().flatten().to(torch::kDouble);
  const torch::Tensor weight = (learner - actor).exp().flatten().to(torch::kDouble);
  std::vector<double> values(gap.data_ptr<double>(), gap.data_ptr<double>() + gap.numel());
  into["logp_gap_mean"] = gap.mean().item<double>();
  into["logp_gap_p99"] = percentile(values, 0.99);
  into["logp_gap_max"] = gap.max().item<double>();
  into["iw_mean"] = weight.mean().item<double>();
  into["iw_outside_0.8_1.25"] = ((weight < 0.8) | (weight > 1.25)).to(torch::kDouble).mean().item<double>();
}

BenchCase kv_case(model::Policy& policy, std::int64_t rows, std::int64_t length, int rounds) {
  const std::int64_t vocab = policy->model_config().vocab_size;
  torch::Tensor tokens = torch::randint(vocab, {rows, length}, torch::kLong);
  run_cached(policy, tokens, model::KVCacheDtype::Float, /*sample=*/true);  // on-policy sequences
  const torch::Tensor learner = learner_logprobs(policy, tokens);
  CachedRun f32, i8;
  double f32_s = 1e30, i8_s = 1e30;
  for (int round = 0; round < rounds; ++round) {  // alternating, best round each
    f32 = run_cached(policy, tokens, model::KVCacheDtype::Float, false);
    i8 = run_cached(policy, tokens, model::KVCacheDtype::Int8, false);
    f32_s = std::min(f32_s, f32.decode_seconds);
    i8_s = std::min(i8_s, i8.decode_seconds);
  }
  const double decoded = static_cast<double>(rows * (length - kPrefill));
  BenchCase c;
  c.name = "kv_cache_int8";
  c.params = {{"rows", rows},
              {"context", length},
              {"kv_heads", policy->model_config().num_kv_heads},
              {"layers", policy->model_config().num_layers}};
  c.metrics = {{"kv_bytes_per_token", i8.bytes_per_token}, {"decode_tok_per_s", decoded / i8_s}};
  add_gap_metrics(c.metrics, i8.logprobs, learner);
  c.baseline = {{"kv_bytes_per_token", f32.bytes_per_token}, {"decode_tok_per_s", decoded / f32_s}};
  add_gap_metrics(c.baseline, f32.logprobs, learner);
  // MoE routing is discrete: a small change in a hidden state can send a
  // token to other experts, and such a token's log-prob moves far more.
  if (i8.experts.defined())
    c.metrics["routing_changed"] =
        (i8.experts != f32.experts).flatten(1).any(1).to(torch::kDouble).mean().item<double>();
  c.ratio_metric = "kv_bytes_per_token";
  c.higher_is_better = false;  // ratio = float32 bytes / int8 bytes
  return c;
}

BenchReport run(const BenchOptions& options) {
  const KvArgs args = parse_args(options.args, options.quick);
  const config::Config config = setup::load_config_file(args.policy.config_path, args.policy.overrides);
  torch::NoGradGuard no_grad;
  model::Policy policy = make_bench_policy(config, args.policy.init_path, "bench kv");
  torch::manual_seed(static_cast<std::uint64_t>(config.run.seed) + 7);
  const std::int64_t max_len = policy->model_config().max_seq_len;
  std::vector<std::int64_t> lengths =
      options.quick ? std::vector<std::int64_t>{32} : std::vector<std::int64_t>{64, 512};
  BenchReport report;
  for (std::int64_t length : lengths) {
    if (length > max_len) {
      std::fprintf(stderr, "bench kv: context %lld skipped: model.max_seq_len is %lld\n",
                   static_cast<long long>(length), static_cast<long long>(max_len));
      continue;
    }
    report.cases.push_back(kv_case(policy, args.rows, length, options.quick ? 1 : 3));
  }
  return report;
}

MOERL_BENCHMARK("kv",
                "int8 vs float32 KV cache on the same on-policy sequences: KV bytes per token, behaviour "
                "log-prob gap to the learner's recomputation, importance weights, decode tokens/s",
                run);

}  // namespace
}  // namespace moerl::bench
