// The rollout engine: continuous batching over the paged KV cache against a
// full forward, reproducibility across batch compositions, weight swaps,
// context budgets and block-pool exhaustion.

#include <catch2/catch.hpp>

#include <cmath>
#include <map>

#include "moerl/text/episode_format.h"
#include "moerl/model/policy.h"
#include "moerl/text/tokenizer.h"
#include "moerl/rollout/generation_engine.h"
#include "moerl/telemetry/metrics.h"

using moerl::config::ModelSection;
using moerl::config::MoeSection;
using moerl::model::Policy;
using moerl::rollout::ContextPolicy;
using moerl::rollout::EngineOptions;
using moerl::rollout::GeneratedTurn;
using moerl::rollout::GenerationEngine;
using moerl::rollout::SamplingParams;
using moerl::rollout::StopParams;
using moerl::rollout::StopReason;
using moerl::text::SpecialTokens;

namespace {

ModelSection tiny_model(std::int64_t max_seq_len = 96) {
  ModelSection m;
  m.d_model = 32;
  m.num_layers = 3;
  m.num_heads = 4;
  m.num_kv_heads = 2;
  m.d_ff = 48;
  m.max_seq_len = max_seq_len;
  m.init_std = 0.1;
  return m;
}

MoeSection tiny_moe() {
  MoeSection e;
  e.num_experts = 4;
  e.top_k = 2;
  e.d_expert = 16;
  e.shared_experts = 1;
  e.first_dense_layers = 1;
  return e;
}

Policy make_policy(std::uint64_t seed, std::int64_t max_seq_len = 96) {
  torch::manual_seed(seed);
  Policy p(tiny_model(max_seq_len), tiny_moe());
  p->to(torch::kDouble);
  p->eval();
  return p;
}

std::vector<std::int64_t> prompt(std::int64_t n, std::int64_t salt) {
  std::vector<std::int64_t> t{SpecialTokens::kBos, SpecialTokens::kUser};
  for (std::int64_t i = 0; i < n; ++i) t.push_back(32 + (i * 7 + salt * 13) % 90);
  t.push_back(SpecialTokens::kEndOfTurn);
  t.push_back(SpecialTokens::kAssistant);
  return t;
}

struct Recorded {
  std::vector<std::int64_t> positions;  // context index of each generated token
  std::vector<std::int64_t> tokens;
  std::vector<float> logprobs, model_logprobs;
  std::vector<torch::Tensor> experts;
  std::vector<std::int64_t> versions;
};

void append_turn(Recorded& r, const GeneratedTurn& turn, std::int64_t context_size_after) {
  const auto n = static_cast<std::int64_t>(turn.tokens.size());
  for (std::int64_t i = 0; i < n; ++i) {
    r.positions.push_back(context_size_after - n + i);
    r.tokens.push_back(turn.tokens[static_cast<std::size_t>(i)]);
    r.logprobs.push_back(turn.logprobs[static_cast<std::size_t>(i)]);
    r.model_logprobs.push_back(turn.model_logprobs[static_cast<std::size_t>(i)]);
    r.experts.push_back(turn.expert_indices[i]);
    r.versions.push_back(turn.policy_versions[static_cast<std::size_t>(i)]);
  }
}

// Log-softmax of a full forward over `context`: [n, V] (double).
torch::Tensor full_log_probs(Policy& policy, const std::vector<std::int64_t>& context,
                             const torch::Tensor& forced = torch::Tensor(), torch::Tensor* experts = nullptr) {
  torch::NoGradGuard no_grad;
  const auto n = static_cast<std::int64_t>(context.size());
  const torch::Tensor tokens = torch::tensor(context, torch::kLong).view({1, n});
  auto out = policy->forward(tokens, torch::Tensor(), forced);
  if (experts != nullptr) *experts = out.expert_indices;
  return torch::log_softmax(out.logits.to(torch::kDouble), -1);
}

// Checks each generated token's recorded log-prob and routing against the
// full forward over the final context.
void check_against_full_forward(Policy& policy, const std::vector<std::int64_t>& context, const Recorded& r,
                                const std::string& what) {
  torch::Tensor experts;
  const torch::Tensor lp = full_log_probs(policy, context, torch::Tensor(), &experts);
  double worst = 0;
  for (std::size_t i = 0; i < r.tokens.size(); ++i) {
    const std::int64_t p = r.positions[i];
    REQUIRE(context[static_cast<std::size_t>(p)] == r.tokens[i]);
    const double expected = lp[p - 1][r.tokens[i]].item<double>();
    worst = std::max(worst, std::abs(expected - r.model_logprobs[i]));
    INFO(what << ": token " << i << " at position " << p << ": engine log-prob " << r.model_logprobs[i]
              << ", full forward " << expected);
    CHECK(std::abs(expected - r.model_logprobs[i]) < 1e-4);
    const bool same_route = r.experts[i].equal(experts[p - 1]);
    INFO("engine routing " << r.experts[i] << " full forward routing " << experts[p - 1]);
    CHECK(same_route);
  }
  // Learner-style recomputation replaying the recorded routing (prompt
  // positions from the context routing, then per generated token).
  torch::Tensor forced = experts.clone();
  for (std::size_t i = 0; i < r.tokens.size(); ++i) forced[r.positions[i] - 1] = r.experts[i];
  const torch::Tensor replay = full_log_probs(policy, context, forced);
  for (std::size_t i = 0; i < r.tokens.size(); ++i) {
    const double v = replay[r.positions[i] - 1][r.tokens[i]].item<double>();
    INFO(what << ": replay log-prob " << v << " vs engine " << r.model_logprobs[i]);
    CHECK(std::abs(v - r.model_logprobs[i]) < 1e-4);
  }
  WARN(what << ": " << r.tokens.size() << " tokens, max |engine - full forward| log-prob = " << worst);
}

std::vector<std::uint64_t> run_until_idle(GenerationEngine& engine, int max_steps = 10000) {
  std::vector<std::uint64_t> all;
  for (int i = 0; i < max_steps && engine.has_work(); ++i) {
    auto done = engine.step();
    all.insert(all.end(), done.begin(), done.end());
  }
  return all;
}

// The first turn of one session on a fresh engine: prompt, then generate until it stops.
GeneratedTurn single_turn(Policy& policy, const EngineOptions& options, const std::vector<std::int64_t>& prompt_ids,
                          const SamplingParams& sampling, const StopParams& stop) {
  GenerationEngine engine(policy, options);
  engine.add_session(1, 1);
  engine.append_prompt(1, prompt_ids);
  engine.start_turn(1, sampling, stop);
  run_until_idle(engine);
  return engine.take_turn(1);
}

}  // namespace

TEST_CASE("engine decoding with sessions joining and leaving equals a full forward", "[rollout][engine]") {
  Policy policy = make_policy(3);
  EngineOptions options;
  options.block_size = 4;
  options.initial_kv_blocks = 2;
  options.max_step_tokens = 12;  // forces chunked prefill of the longer prompts
  GenerationEngine engine(policy, options);
  SamplingParams sampling;  // temperature 1, unfiltered: behaviour = model log-probs
  std::map<std::uint64_t, Recorded> rec;
  std::map<std::uint64_t, int> turns_left;
  std::map<std::uint64_t, std::vector<std::int64_t>> final_context;

  auto join = [&](std::uint64_t id, std::int64_t len, std::int64_t max_tokens) {
    engine.add_session(id, 100 + id);
    engine.append_prompt(id, prompt(len, static_cast<std::int64_t>(id)));
    StopParams stop;
    stop.stop_on_eot = false;
    stop.max_turn_tokens = max_tokens;
    engine.start_turn(id, sampling, stop);
    turns_left[id] = 2;
  };
  join(1, 5, 6);
  join(2, 17, 3);
  std::int64_t kv_peak = 0;
  for (int step = 0; step < 200 && engine.has_work(); ++step) {
    if (step == 2) join(3, 9, 7);
    if (step == 4) join(4, 1, 5);
    if (step == 5) join(5, 23, 4);
    kv_peak = std::max(kv_peak, engine.kv_bytes_in_use());
    for (std::uint64_t id : engine.step()) {
      GeneratedTurn turn = engine.take_turn(id);
      CHECK(turn.stop_reason == StopReason::StopMaxTurnTokens);
      append_turn(rec[id], turn, static_cast<std::int64_t>(engine.context(id).size()));
      if (--turns_left[id] > 0) {
        // Second turn: an observation joins the context (prefilled with the
        // sampled token that ended the first turn).
        engine.append_prompt(id, {SpecialTokens::kEndOfTurn, SpecialTokens::kUser, 65, 66, SpecialTokens::kEndOfTurn,
                                  SpecialTokens::kAssistant});
        StopParams stop;
        stop.stop_on_eot = false;
        stop.max_turn_tokens = 3 + static_cast<std::int64_t>(id);
        engine.start_turn(id, sampling, stop);
      } else {
        final_context[id] = engine.context(id);
        const std::int64_t before = engine.kv_bytes_in_use();
        engine.remove_session(id);  // leaves mid-way; the others go on
        CHECK(engine.kv_bytes_in_use() < before);
      }
    }
  }
  REQUIRE(final_context.size() == 5);
  CHECK(engine.kv_bytes_in_use() == 0);
  CHECK(kv_peak > 0);
  for (auto& [id, context] : final_context) {
    const Recorded& r = rec[id];
    for (std::size_t i = 0; i < r.tokens.size(); ++i) CHECK(std::abs(r.logprobs[i] - r.model_logprobs[i]) < 1e-6);
    check_against_full_forward(policy, context, r, "session " + std::to_string(id));
  }
  const auto snap = moerl::telemetry::metrics().snapshot();
  CHECK(snap.counters.at("rollout.decode_tokens") > 0);
  CHECK(snap.counters.at("rollout.prefill_tokens") > 0);
  CHECK(snap.histograms.count("rollout.step_latency_s") == 1);
}

TEST_CASE("filtered sampling records the log-prob of the distribution actually used", "[rollout][engine]") {
  Policy policy = make_policy(5);
  GenerationEngine engine(policy);
  SamplingParams sampling;
  sampling.temperature = 0.7;
  sampling.top_k = 20;
  sampling.top_p = 0.8;
  engine.add_session(9, 77);
  engine.append_prompt(9, prompt(8, 2));
  StopParams stop;
  stop.stop_on_eot = false;
  stop.max_turn_tokens = 12;
  engine.start_turn(9, sampling, stop);
  run_until_idle(engine);
  const GeneratedTurn turn = engine.take_turn(9);
  REQUIRE(turn.tokens.size() == 12);
  const auto& context = engine.context(9);
  torch::NoGradGuard no_grad;
  auto out = policy->forward(torch::tensor(context, torch::kLong).view({1, -1}));
  const torch::Tensor logits = out.logits.to(torch::kDouble).contiguous();
  const std::int64_t start = static_cast<std::int64_t>(context.size()) - 12;
  for (std::int64_t i = 0; i < 12; ++i) {
    const auto d = moerl::rollout::filter_distribution(logits[start + i - 1].data_ptr<double>(), 264, sampling);
    const double expected = d.log_prob(turn.tokens[static_cast<std::size_t>(i)]);
    INFO("token " << i << ": engine " << turn.logprobs[static_cast<std::size_t>(i)] << ", recomputed " << expected);
    CHECK(std::abs(expected - turn.logprobs[static_cast<std::size_t>(i)]) < 1e-4);
  }
}

TEST_CASE("a session's tokens do not depend on the other sessions in the batch", "[rollout][engine]") {
  Policy policy = make_policy(7);
  SamplingParams sampling;
  sampling.temperature = 1.3;
  StopParams stop;
  stop.stop_on_eot = false;
  stop.max_turn_tokens = 16;
  auto run = [&](bool crowded) {
    GenerationEngine engine(policy);
    engine.add_session(42, 4242);
    engine.append_prompt(42, prompt(6, 1));
    engine.start_turn(42, sampling, stop);
    for (int step = 0; engine.has_work(); ++step) {
      if (crowded && step < 6) {
        const std::uint64_t id = 100 + static_cast<std::uint64_t>(step);
        engine.add_session(id, 7 * id);
        engine.append_prompt(id, prompt(3 + step * 4, step));
        engine.start_turn(id, sampling, stop);
      }
      for (std::uint64_t id : engine.step()) {
        if (id == 42) return engine.take_turn(42).tokens;
        engine.take_turn(id);
      }
    }
    return std::vector<std::int64_t>{};
  };
  const auto alone = run(false);
  const auto crowded = run(true);
  REQUIRE(alone.size() == 16);
  CHECK(alone == crowded);
  // A different seed gives a different stream.
  GenerationEngine engine(policy);
  engine.add_session(42, 4243);
  engine.append_prompt(42, prompt(6, 1));
  engine.start_turn(42, sampling, stop);
  run_until_idle(engine);
  CHECK(engine.take_turn(42).tokens != alone);
}

TEST_CASE("weight swap between steps: versions per token, logits of the new weights", "[rollout][engine]") {
  Policy policy = make_policy(11);
  Policy fresh = make_policy(12);  // the "new" weights
  EngineOptions options;
  options.recompute_kv_on_swap = true;
  GenerationEngine engine(policy, options);
  Policy reference_old = make_policy(11);
  SamplingParams sampling;
  StopParams stop;
  stop.stop_on_eot = false;
  stop.max_turn_tokens = 10;
  for (std::uint64_t id : {1, 2, 3}) {
    engine.add_session(id, id);
    engine.append_prompt(id, prompt(4 + 3 * static_cast<std::int64_t>(id), static_cast<std::int64_t>(id)));
    engine.start_turn(id, sampling, stop);
  }
  for (int i = 0; i < 4; ++i) CHECK(engine.step().empty());
  std::vector<torch::Tensor> wrong = fresh->parameters();
  wrong.pop_back();
  CHECK_THROWS(engine.swap_weights(wrong, 5));
  CHECK(engine.policy_version() == 0);
  engine.swap_weights(fresh->parameters(), 1);
  CHECK(engine.policy_version() == 1);
  run_until_idle(engine);
  for (std::uint64_t id : {1, 2, 3}) {
    const GeneratedTurn turn = engine.take_turn(id);
    REQUIRE(turn.tokens.size() == 10);
    const auto& context = engine.context(id);
    const std::int64_t start = static_cast<std::int64_t>(context.size()) - 10;
    const torch::Tensor lp_old = full_log_probs(reference_old, context);
    const torch::Tensor lp_new = full_log_probs(fresh, context);
    std::int64_t before = 0;
    for (std::int64_t i = 0; i < 10; ++i) {
      const std::int64_t v = turn.policy_versions[static_cast<std::size_t>(i)];
      const auto& lp = v == 0 ? lp_old : lp_new;
      const double expected = lp[start + i - 1][turn.tokens[static_cast<std::size_t>(i)]].item<double>();
      INFO("session " << id << " token " << i << " version " << v << ": engine "
                      << turn.model_logprobs[static_cast<std::size_t>(i)] << ", policy of that version " << expected);
      CHECK(std::abs(expected - turn.model_logprobs[static_cast<std::size_t>(i)]) < 1e-4);
      before += v == 0 ? 1 : 0;
      if (i > 0) CHECK(v >= turn.policy_versions[static_cast<std::size_t>(i - 1)]);
    }
    // The first step samples after the prefill; steps 2..4 decode: 4 tokens before the swap.
    INFO("session " << id << ": " << before << " tokens of version 0");
    CHECK(before == 4);
  }
}

TEST_CASE("stop conditions: end of turn, stop strings, episode budget", "[rollout][engine]") {
  Policy policy = make_policy(13);
  SamplingParams greedy;
  greedy.greedy = true;
  auto generate = [&](const StopParams& stop) { return single_turn(policy, {}, prompt(5, 3), greedy, stop); };
  StopParams plain;
  plain.stop_on_eot = false;
  plain.max_turn_tokens = 20;
  const GeneratedTurn base = generate(plain);
  REQUIRE(base.tokens.size() == 20);
  CHECK(base.stop_reason == StopReason::StopMaxTurnTokens);
  // Stop string: the bytes of tokens 5..7 of the free run (when they are bytes).
  std::string text;
  for (std::size_t i = 5; i < 8; ++i) {
    if (base.tokens[i] < 256) text.push_back(static_cast<char>(base.tokens[i]));
  }
  if (!text.empty()) {
    StopParams s = plain;
    s.stop_strings = {std::string("\x01\x02\x03never"), text};
    const GeneratedTurn cut = generate(s);
    CHECK(cut.stop_reason == StopReason::StopString);
    CHECK(cut.tokens.size() <= 8);
    CHECK(std::equal(cut.tokens.begin(), cut.tokens.end(), base.tokens.begin()));
  }
  // Episode budget across turns.
  {
    GenerationEngine engine(policy);
    engine.add_session(1, 1);
    engine.append_prompt(1, prompt(5, 3));
    StopParams s = plain;
    s.max_turn_tokens = 6;
    s.max_episode_tokens = 10;
    engine.start_turn(1, greedy, s);
    run_until_idle(engine);
    CHECK(engine.take_turn(1).stop_reason == StopReason::StopMaxTurnTokens);
    engine.append_prompt(1, {SpecialTokens::kUser, 70, SpecialTokens::kEndOfTurn, SpecialTokens::kAssistant});
    engine.start_turn(1, greedy, s);
    run_until_idle(engine);
    const GeneratedTurn second = engine.take_turn(1);
    CHECK(second.stop_reason == StopReason::StopEpisodeBudget);
    CHECK(second.tokens.size() == 4);
    CHECK(second.episode_over);
  }
  // End of turn: make <|eot|> the greedy choice by giving it a scaled copy
  // of the first greedy token's output row (its logit was the largest).
  Policy eot_policy = make_policy(13);
  {
    torch::NoGradGuard no_grad;
    auto& w = eot_policy->lm_head->weight;
    w[SpecialTokens::kEndOfTurn].copy_(w[base.tokens[0]] * 4.0);
  }
  GenerationEngine engine(eot_policy);
  engine.add_session(1, 1);
  engine.append_prompt(1, prompt(5, 3));
  StopParams s;
  s.max_turn_tokens = 20;
  engine.start_turn(1, greedy, s);
  run_until_idle(engine);
  const GeneratedTurn eot = engine.take_turn(1);
  INFO("first token " << eot.tokens[0] << " (base " << base.tokens[0] << ")");
  CHECK(eot.stop_reason == StopReason::StopEndOfTurn);
  CHECK(eot.tokens == std::vector<std::int64_t>{SpecialTokens::kEndOfTurn});
}

TEST_CASE("context budget: end the episode, or truncate keeping the task statement", "[rollout][engine]") {
  Policy policy = make_policy(17, 64);
  SamplingParams sampling;
  StopParams stop;
  stop.stop_on_eot = false;
  stop.max_turn_tokens = 100;
  {
    EngineOptions options;
    options.context_budget = 40;
    GenerationEngine engine(policy, options);
    engine.add_session(1, 1);
    engine.append_prompt(1, prompt(26, 1));  // 30 tokens
    engine.start_turn(1, sampling, stop);
    run_until_idle(engine);
    const GeneratedTurn turn = engine.take_turn(1);
    CHECK(turn.stop_reason == StopReason::StopContextBudget);
    CHECK(turn.episode_over);
    CHECK(turn.tokens.size() == 10);
    CHECK(engine.context(1).size() == 40);
    engine.append_prompt(1, {SpecialTokens::kUser, 70});  // ignored: the episode is over
    engine.start_turn(1, sampling, stop);
    CHECK(engine.step() == std::vector<std::uint64_t>{1});
    CHECK(engine.take_turn(1).tokens.empty());
  }
  {
    EngineOptions options;
    options.context_budget = 40;
    options.context_policy = ContextPolicy::ContextTruncate;
    GenerationEngine engine(policy, options);
    engine.add_session(1, 1);
    const auto task = prompt(6, 1);  // bos user .. eot assistant: head = 9 tokens
    engine.append_prompt(1, task);
    std::size_t max_context = 0;
    engine.start_turn(1, sampling, stop);
    while (engine.has_work()) {
      engine.step();
      max_context = std::max(max_context, engine.context(1).size());
    }
    const GeneratedTurn turn = engine.take_turn(1);
    CHECK(turn.stop_reason == StopReason::StopMaxTurnTokens);
    CHECK(turn.tokens.size() == 100);
    CHECK(turn.context_truncated);
    CHECK_FALSE(turn.episode_over);
    INFO("largest context " << max_context);
    CHECK(max_context <= 40);
    const auto& context = engine.context(1);
    CHECK(std::equal(task.begin(), task.begin() + 9, context.begin()));  // the task statement is kept
    // The kept context was prefilled again: the cache holds all but the last token.
    CHECK(engine.fed_length(1) == static_cast<std::int64_t>(context.size()) - 1);
  }
}

TEST_CASE("a chat format: stop on its end-of-turn token, stop strings on decoded bytes, its head kept",
          "[rollout][engine][episode_format]") {
  using moerl::text::BpeTokenizer;
  using moerl::text::ChatLayout;
  using moerl::text::ChatRenderer;
  using moerl::text::EpisodeFormat;
  const BpeTokenizer tokenizer =
      BpeTokenizer::from_file(std::string(MOERL_SOURCE_DIR) + "/tests/parity/fixtures/qwen2_moe/tokenizer.json");
  const EpisodeFormat chatml(ChatRenderer(tokenizer, ChatLayout::chatml()));
  const std::int64_t im_end = chatml.end_of_turn_id();
  REQUIRE(im_end == 2);
  ModelSection model = tiny_model(128);
  model.vocab_size = tokenizer.vocab_size();
  torch::manual_seed(29);
  Policy policy(model, tiny_moe());
  policy->to(torch::kDouble);
  policy->eval();
  const std::vector<std::int64_t> task = chatml.prompt_turn("sort: 86 62 57", true, false);
  SamplingParams greedy;
  greedy.greedy = true;
  auto generate = [&](Policy& p, const EpisodeFormat& format, const StopParams& stop) {
    EngineOptions options;
    options.format = format;
    return single_turn(p, options, task, greedy, stop);
  };
  StopParams plain;
  plain.stop_on_eot = false;
  plain.max_turn_tokens = 20;
  const GeneratedTurn base = generate(policy, chatml, plain);
  REQUIRE(base.tokens.size() == 20);
  // A stop string made of the decoded bytes of tokens 5..7 (BPE tokens of
  // one or more bytes each) ends the turn at token 7 at the latest.
  std::string text;
  for (std::size_t i = 5; i < 8; ++i) text += chatml.token_bytes(base.tokens[i]);
  REQUIRE_FALSE(text.empty());
  StopParams with_stop = plain;
  with_stop.stop_strings = {text};
  const GeneratedTurn cut = generate(policy, chatml, with_stop);
  CHECK(cut.stop_reason == StopReason::StopString);
  CHECK(cut.tokens.size() <= 8);
  CHECK(std::equal(cut.tokens.begin(), cut.tokens.end(), base.tokens.begin()));
  CHECK(chatml.action_text(cut.tokens).find(text) != std::string::npos);

  // <|im_end|> made the greedy choice: the chat format ends the turn on it;
  // the byte format, whose end-of-turn is another id, does not.
  {
    torch::NoGradGuard no_grad;
    auto& w = policy->lm_head->weight;
    w[im_end].copy_(w[base.tokens[0]] * 4.0);
  }
  StopParams eot_stop;
  eot_stop.max_turn_tokens = 5;
  const GeneratedTurn eot = generate(policy, chatml, eot_stop);
  CHECK(eot.stop_reason == StopReason::StopEndOfTurn);
  CHECK(eot.tokens == std::vector<std::int64_t>{im_end});
  const GeneratedTurn byte_eot = generate(policy, EpisodeFormat(), eot_stop);
  CHECK(byte_eot.stop_reason == StopReason::StopMaxTurnTokens);
  CHECK(byte_eot.tokens.front() == im_end);

  // Truncation keeps the head through the first user message's <|im_end|>\n.
  EngineOptions options;
  options.format = chatml;
  options.context_budget = 48;
  options.context_policy = ContextPolicy::ContextTruncate;
  GenerationEngine engine(policy, options);
  engine.add_session(1, 1);
  engine.append_prompt(1, task);
  StopParams long_turn;
  long_turn.stop_on_eot = false;
  long_turn.max_turn_tokens = 60;
  engine.start_turn(1, greedy, long_turn);
  run_until_idle(engine);
  const GeneratedTurn truncated = engine.take_turn(1);
  CHECK(truncated.context_truncated);
  const std::int64_t head = chatml.head_length(task);
  CHECK(head == static_cast<std::int64_t>(task.size() - tokenizer.encode("<|im_start|>assistant\n").size()));
  CHECK(std::equal(task.begin(), task.begin() + head, engine.context(1).begin()));
}

TEST_CASE("block pool exhaustion preempts sessions and still decodes exactly", "[rollout][engine]") {
  Policy policy = make_policy(19);
  EngineOptions options;
  options.block_size = 4;
  options.initial_kv_blocks = 2;
  options.max_kv_blocks = 8;  // 32 positions for 4 sessions that need ~24 each
  GenerationEngine engine(policy, options);
  CHECK(engine.context_budget() == 32);
  const double preempt_before = [] {
    auto snap = moerl::telemetry::metrics().snapshot();
    return snap.counters.count("rollout.preemptions") ? snap.counters.at("rollout.preemptions") : 0.0;
  }();
  SamplingParams sampling;
  StopParams stop;
  stop.stop_on_eot = false;
  stop.max_turn_tokens = 12;
  for (std::uint64_t id = 1; id <= 4; ++id) {
    engine.add_session(id, id * 3);
    engine.append_prompt(id, prompt(6 + static_cast<std::int64_t>(id), static_cast<std::int64_t>(id)));
    engine.start_turn(id, sampling, stop);
  }
  std::map<std::uint64_t, Recorded> rec;
  std::int64_t total_preemptions = 0;
  for (int i = 0; i < 500 && engine.has_work(); ++i) {
    for (std::uint64_t id : engine.step()) {
      const GeneratedTurn turn = engine.take_turn(id);
      CHECK(turn.stop_reason == StopReason::StopMaxTurnTokens);
      total_preemptions += turn.preemptions;
      append_turn(rec[id], turn, static_cast<std::int64_t>(engine.context(id).size()));
    }
    CHECK(engine.kv_blocks_in_use() <= 8);
  }
  REQUIRE(rec.size() == 4);
  const auto snap = moerl::telemetry::metrics().snapshot();
  const double preemptions = snap.counters.at("rollout.preemptions") - preempt_before;
  INFO("preemptions " << preemptions);
  CHECK(preemptions > 0);
  for (std::uint64_t id = 1; id <= 4; ++id) {
    REQUIRE(rec[id].tokens.size() == 12);
    check_against_full_forward(policy, engine.context(id), rec[id], "pool session " + std::to_string(id));
  }
}

TEST_CASE("paged KV memory follows the tokens held", "[rollout][engine][kvcache]") {
  ModelSection m = tiny_model(64);
  moerl::model::PagedCacheOptions paged;
  paged.block_size = 8;
  paged.initial_blocks = 2;
  paged.max_blocks = 6;
  moerl::model::KVCache cache(m, torch::TensorOptions().dtype(torch::kFloat), paged);
  const auto a = cache.add_sequence();
  const auto b = cache.add_sequence();
  CHECK(cache.blocks_needed({a, b}, {9, 3}) == 3);
  cache.prepare({a, b}, {9, 3});
  cache.advance({a, b}, {9, 3});
  CHECK(cache.blocks_in_use() == 3);
  CHECK(cache.used_bytes() == 3 * cache.bytes_per_block());
  CHECK(cache.bytes_per_block() == 2 * 3 * 8 * 2 * 8 * 4);  // k+v, layers, block, kv heads, head dim, float
  CHECK(cache.blocks_available() == 3);
  CHECK_THROWS_AS(cache.prepare({a}, {40}), moerl::model::KVCacheFullError);
  CHECK(cache.length(a) == 9);
  cache.remove_sequence(a);
  CHECK(cache.blocks_in_use() == 1);
  CHECK(cache.blocks_available() == 5);
}
