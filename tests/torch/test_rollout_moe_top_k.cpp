// Active experts at generation time (rollout.moe_top_k): a policy routing
// with k' experts computes what a model configured with top_k = k' and the
// same weights computes; k' = the model's k changes nothing, bit for bit;
// the engine records k' experts per token and behaviour log-probs of the k'
// routing; an hf: model takes the override from its run config.

#include <catch2/catch.hpp>

#include <cmath>
#include <functional>

#include "moerl/config/config.h"
#include "moerl/model/hf_policy_loader.h"
#include "moerl/setup/config_loading.h"
#include "moerl/text/episode_format.h"
#include "moerl/model/policy.h"
#include "moerl/text/tokenizer.h"
#include "moerl/moe/moe_layer.h"
#include "moerl/rollout/generation_engine.h"

using Catch::Matchers::Contains;
using moerl::config::ModelSection;
using moerl::config::MoeSection;
using moerl::model::Policy;
using moerl::rollout::EngineOptions;
using moerl::rollout::GeneratedTurn;
using moerl::rollout::GenerationEngine;
using moerl::rollout::SamplingParams;
using moerl::rollout::StopParams;
using moerl::text::SpecialTokens;

namespace {

ModelSection tiny_model() {
  ModelSection m;
  m.d_model = 32;
  m.num_layers = 3;
  m.num_heads = 4;
  m.num_kv_heads = 2;
  m.d_ff = 48;
  m.max_seq_len = 96;
  m.init_std = 0.1;
  return m;
}

MoeSection tiny_moe(std::int64_t top_k) {
  MoeSection e;
  e.num_experts = 6;
  e.top_k = top_k;
  e.d_expert = 16;
  e.first_dense_layers = 1;  // layers 1 and 2 are MoE
  return e;
}

Policy make_policy(std::int64_t top_k, std::uint64_t seed = 7) {
  torch::manual_seed(seed);
  Policy p(tiny_model(), tiny_moe(top_k));
  p->to(torch::kDouble);
  p->eval();
  return p;
}

// `to` gets `from`'s weights (same architecture, any top_k).
void copy_weights(Policy& from, Policy& to) {
  torch::NoGradGuard no_grad;
  const auto source = from->named_parameters();
  for (auto& item : to->named_parameters()) item.value().copy_(source[item.key()]);
}

std::vector<std::int64_t> prompt(std::int64_t salt) {
  std::vector<std::int64_t> t{SpecialTokens::kBos, SpecialTokens::kUser};
  for (std::int64_t i = 0; i < 11; ++i) t.push_back(32 + (i * 7 + salt * 13) % 90);
  t.push_back(SpecialTokens::kEndOfTurn);
  t.push_back(SpecialTokens::kAssistant);
  return t;
}

moerl::model::PolicyOutput full_forward(Policy& policy, const std::vector<std::int64_t>& context,
                                        const torch::Tensor& forced = torch::Tensor()) {
  torch::NoGradGuard no_grad;
  const auto n = static_cast<std::int64_t>(context.size());
  return policy->forward(torch::tensor(context, torch::kLong).view({1, n}), torch::Tensor(), forced);
}

struct Played {
  GeneratedTurn turn;
  std::vector<std::int64_t> context;  // the whole context after the turn
  torch::Tensor context_routing;      // [fed, moe_layers, k]
};

// One sampled turn of 10 tokens on a fresh engine routing with moe_top_k.
Played play_turn(Policy& policy, std::int64_t moe_top_k, const std::vector<std::int64_t>& tokens) {
  EngineOptions options;
  options.moe_top_k = moe_top_k;
  GenerationEngine engine(policy, options);
  engine.add_session(1, 1234);
  engine.append_prompt(1, tokens);
  StopParams stop;
  stop.stop_on_eot = false;
  stop.max_turn_tokens = 10;
  engine.start_turn(1, SamplingParams(), stop);
  for (int i = 0; i < 100 && !engine.turn_ready(1); ++i) engine.step();
  REQUIRE(engine.turn_ready(1));
  Played out;
  out.turn = engine.take_turn(1);
  out.context = engine.context(1);
  out.context_routing = engine.context_routing(1);
  return out;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("active experts: k' = 1 computes what a top_k = 1 model with the same weights computes",
          "[rollout][moe_top_k]") {
  Policy two = make_policy(2);
  Policy one = make_policy(1, 99);
  copy_weights(two, one);
  const std::vector<std::int64_t> context = prompt(3);
  const auto reference = full_forward(one, context);
  two->set_active_experts(1);
  CHECK(two->active_experts() == 1);
  const auto routed_one = full_forward(two, context);
  REQUIRE(routed_one.expert_indices.sizes() == torch::IntArrayRef({static_cast<std::int64_t>(context.size()), 2, 1}));
  CHECK(routed_one.expert_indices.equal(reference.expert_indices));
  const double diff = (routed_one.logits - reference.logits).abs().max().item<double>();
  INFO("max |logits(k'=1 on a top-2 model) - logits(top-1 model)| = " << diff);
  CHECK(diff == 0.0);
  // And the trained routing gives other log-probs: the override is not a no-op.
  two->set_active_experts(0);
  CHECK(two->active_experts() == 2);
  const auto trained = full_forward(two, context);
  const double moved =
      (torch::log_softmax(trained.logits, -1) - torch::log_softmax(reference.logits, -1)).abs().max().item<double>();
  INFO("max |log-prob(k=2) - log-prob(k'=1)| = " << moved);
  CHECK(moved > 1e-3);
}

TEST_CASE("active experts: the MoE layer's per-expert reference follows k' too", "[rollout][moe_top_k]") {
  torch::manual_seed(5);
  moerl::moe::MoeFeedForward layer(tiny_model(), tiny_moe(2));
  layer->to(torch::kDouble);
  const torch::Tensor x = torch::randn({19, 32}, torch::kDouble);
  for (std::int64_t k : {1, 3, 6}) {
    layer->set_active_experts(k);
    const auto ours = layer->forward(x);
    const auto reference = moerl::moe::reference_moe_forward(*layer, x);
    REQUIRE(ours.expert_indices.size(1) == k);
    CHECK(ours.expert_indices.equal(reference.expert_indices));
    const double diff = (ours.hidden - reference.hidden).abs().max().item<double>();
    INFO("k' = " << k << ": max |ours - reference| = " << diff);
    CHECK(diff < 1e-12);
  }
}

TEST_CASE("active experts: k' = the model's k reproduces the default engine bit for bit", "[rollout][moe_top_k]") {
  Policy policy = make_policy(2);
  const Played by_default = play_turn(policy, 0, prompt(1));
  const Played explicit_k = play_turn(policy, 2, prompt(1));
  CHECK(explicit_k.turn.tokens == by_default.turn.tokens);
  CHECK(explicit_k.turn.logprobs == by_default.turn.logprobs);
  CHECK(explicit_k.turn.model_logprobs == by_default.turn.model_logprobs);
  CHECK(explicit_k.turn.expert_indices.equal(by_default.turn.expert_indices));
  CHECK(explicit_k.context_routing.equal(by_default.context_routing));
}

TEST_CASE("active experts: the engine records k' experts per token and the k' routing's log-probs",
          "[rollout][moe_top_k]") {
  Policy policy = make_policy(2);
  const Played k2 = play_turn(policy, 0, prompt(2));
  const Played k1 = play_turn(policy, 1, prompt(2));
  CHECK(policy->active_experts() == 1);  // the last engine built decides
  const auto n = static_cast<std::int64_t>(k1.turn.tokens.size());
  REQUIRE(n == 10);
  CHECK(k1.turn.expert_indices.sizes() == torch::IntArrayRef({n, 2, 1}));
  CHECK(k2.turn.expert_indices.sizes() == torch::IntArrayRef({n, 2, 2}));
  CHECK(k1.context_routing.size(2) == 1);
  CHECK(k1.context_routing.size(0) == static_cast<std::int64_t>(k1.context.size()) - 1);

  // The recorded log-probs and routing are those of a full forward routing
  // with one expert, and not those of the trained routing.
  const auto start = static_cast<std::int64_t>(k1.context.size()) - n;
  const auto routed_one = full_forward(policy, k1.context);
  const torch::Tensor lp_one = torch::log_softmax(routed_one.logits, -1);
  policy->set_active_experts(0);
  const torch::Tensor lp_two = torch::log_softmax(full_forward(policy, k1.context).logits, -1);
  double worst = 0, apart = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t token = k1.turn.tokens[static_cast<std::size_t>(i)];
    const double recorded = k1.turn.model_logprobs[static_cast<std::size_t>(i)];
    worst = std::max(worst, std::abs(recorded - lp_one[start + i - 1][token].item<double>()));
    apart = std::max(apart, std::abs(recorded - lp_two[start + i - 1][token].item<double>()));
    CHECK(k1.turn.expert_indices[i].equal(routed_one.expert_indices[start + i - 1]));
  }
  INFO("max |engine - full forward| at k' = 1: " << worst << "; against the k = 2 forward: " << apart);
  CHECK(worst < 1e-5);  // model_logprobs are floats
  CHECK(apart > 1e-3);

  // Replaying the recorded one-expert routing reproduces those log-probs;
  // a routing of another k is refused, naming the shape.
  policy->set_active_experts(1);
  torch::Tensor forced = routed_one.expert_indices.clone();
  for (std::int64_t i = 0; i < n; ++i) forced[start + i - 1] = k1.turn.expert_indices[i];
  const torch::Tensor replay = torch::log_softmax(full_forward(policy, k1.context, forced).logits, -1);
  CHECK((replay - lp_one).abs().max().item<double>() < 1e-9);
  const torch::Tensor two_experts = k2.context_routing.narrow(0, 0, 5);
  const std::vector<std::int64_t> head(k1.context.begin(), k1.context.begin() + 5);
  CHECK_THAT(error_of([&] { full_forward(policy, head, two_experts); }),
             Contains("forced_experts must be [T, moe_layers, active experts] = [5, 2, 1]"));
}

TEST_CASE("active experts: out-of-range k' is refused naming the bounds", "[rollout][moe_top_k]") {
  Policy policy = make_policy(2);
  CHECK_THAT(error_of([&] { policy->set_active_experts(7); }),
             Contains("active experts must be 0 (moe.top_k = 2) or in [1, moe.num_experts = 6], got 7"));
  CHECK_THAT(error_of([&] { policy->set_active_experts(-1); }), Contains("got -1"));
  CHECK(policy->active_experts() == 2);
  MoeSection dense = tiny_moe(2);
  dense.enabled = false;
  Policy dense_policy(tiny_model(), dense);
  CHECK(dense_policy->active_experts() == 0);
  CHECK_THAT(error_of([&] { dense_policy->set_active_experts(1); }), Contains("without MoE layers"));
  EngineOptions options;
  options.moe_top_k = 7;
  CHECK_THAT(error_of([&] { GenerationEngine engine(policy, options); }), Contains("got 7"));
}

TEST_CASE("active experts: an hf: model takes rollout.moe_top_k from its run config", "[rollout][moe_top_k][hf]") {
  // The qwen2_moe fixture: 4 experts, num_experts_per_tok = 2, a tokenizer.json.
  const std::string dir = std::string(MOERL_SOURCE_DIR) + "/tests/parity/fixtures/qwen2_moe";
  const moerl::config::Config config = moerl::setup::load_config_text(
      "[model]\nsource = \"hf:" + dir + "\"\n[rollout]\nmoe_top_k = 4\n[algo]\nrouting_replay = false\n", "hf.toml");
  REQUIRE(config.moe.top_k == 2);  // training keeps config.json's routing
  REQUIRE(config.rollout.moe_top_k == 4);
  Policy policy = moerl::model::load_hf_policy(config.model, config.moe);
  policy->eval();
  EngineOptions options;
  options.format = moerl::text::make_episode_format(config.model, config.chat);
  const std::vector<std::int64_t> tokens = options.format.prompt_turn("sort: 3 1 2", true, false);
  auto play = [&](std::int64_t k) {
    options.moe_top_k = k;
    GenerationEngine engine(policy, options);
    engine.add_session(1, 5);
    engine.append_prompt(1, tokens);
    StopParams stop;
    stop.stop_on_eot = false;
    stop.max_turn_tokens = 6;
    engine.start_turn(1, SamplingParams(), stop);
    for (int i = 0; i < 50 && !engine.turn_ready(1); ++i) engine.step();
    REQUIRE(engine.turn_ready(1));
    return engine.take_turn(1);
  };
  const GeneratedTurn trained = play(0);
  const GeneratedTurn all_experts = play(config.rollout.moe_top_k);
  const auto layers = policy->num_moe_layers();
  CHECK(trained.expert_indices.sizes() == torch::IntArrayRef({6, layers, 2}));
  CHECK(all_experts.expert_indices.sizes() == torch::IntArrayRef({6, layers, 4}));
  // Every expert, each once, for every token and layer.
  CHECK(std::get<0>(all_experts.expert_indices.sort(-1)).equal(torch::arange(4, torch::kLong).expand({6, layers, 4})));
  // The routings give other logits over the same prompt.
  auto logits_with = [&](std::int64_t k) {
    policy->set_active_experts(k);
    return full_forward(policy, tokens).logits;
  };
  const double moved = (logits_with(0) - logits_with(4)).abs().max().item<double>();
  INFO("max |logits(k = 2) - logits(k' = 4)| = " << moved);
  CHECK(moved > 1e-5);
}
