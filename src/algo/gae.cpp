// Turn bookkeeping and GAE over turns (see gae.h).

#include "moerl/algo/gae.h"

#include <algorithm>
#include <string>
#include <vector>

#include "moerl/core/check.h"

namespace moerl::algo {

TurnLayout make_turn_layout(const torch::Tensor& sequence_index, const torch::Tensor& turn_index,
                            const torch::Tensor& loss_mask, std::int64_t num_sequences) {
  MOERL_CHECK(sequence_index.dim() == 1 && turn_index.dim() == 1 && loss_mask.dim() == 1,
              "make_turn_layout: sequence_index, turn_index and loss_mask must be [T]");
  const std::int64_t tokens = sequence_index.size(0);
  MOERL_CHECK(turn_index.size(0) == tokens && loss_mask.size(0) == tokens,
              "make_turn_layout: sequence_index, turn_index and loss_mask differ in length");
  // Index bookkeeping is a linear host pass: T is at most a few million and
  // this runs once per batch, outside the autograd graph.
  auto seq = sequence_index.to(torch::kCPU, torch::kLong).contiguous();
  auto turn = turn_index.to(torch::kCPU, torch::kLong).contiguous();
  auto gen = loss_mask.to(torch::kCPU).ne(0).contiguous();
  const auto* sv = seq.data_ptr<std::int64_t>();
  const auto* tv = turn.data_ptr<std::int64_t>();
  const auto* gv = gen.data_ptr<bool>();

  std::vector<std::int64_t> turns_of(num_sequences, 0);
  for (std::int64_t t = 0; t < tokens; ++t) {
    MOERL_CHECK(sv[t] >= 0 && sv[t] < num_sequences, "make_turn_layout: sequence_index " + std::to_string(sv[t]) +
                                                         " at token " + std::to_string(t) + " outside [0, " +
                                                         std::to_string(num_sequences) + ")");
    MOERL_CHECK(tv[t] >= 0, "make_turn_layout: negative turn_index at token " + std::to_string(t));
    turns_of[sv[t]] = std::max(turns_of[sv[t]], tv[t] + 1);
  }
  auto offsets = torch::zeros({num_sequences + 1}, torch::kLong);
  auto* ov = offsets.data_ptr<std::int64_t>();
  for (std::int64_t n = 0; n < num_sequences; ++n) ov[n + 1] = ov[n] + turns_of[n];
  const std::int64_t turns = ov[num_sequences];

  auto token_turn = torch::empty({tokens}, torch::kLong);
  auto turn_episode = torch::empty({turns}, torch::kLong);
  auto first_generated = torch::full({turns}, tokens, torch::kLong);
  auto* ttv = token_turn.data_ptr<std::int64_t>();
  auto* tev = turn_episode.data_ptr<std::int64_t>();
  auto* fgv = first_generated.data_ptr<std::int64_t>();
  for (std::int64_t n = 0; n < num_sequences; ++n)
    for (std::int64_t m = ov[n]; m < ov[n + 1]; ++m) tev[m] = n;
  for (std::int64_t t = 0; t < tokens; ++t) {
    const std::int64_t m = ov[sv[t]] + tv[t];
    ttv[t] = m;
    if (gv[t]) fgv[m] = std::min(fgv[m], t);
  }
  // V(s_k) is read where the policy scored action k's first token: that
  // position's hidden state has read every observation token before the
  // action (position t holds the state after input token t, which predicts
  // target t). One position earlier would miss the last observation token.
  auto value_position = torch::empty({turns}, torch::kLong);
  auto* vpv = value_position.data_ptr<std::int64_t>();
  for (std::int64_t m = 0; m < turns; ++m) {
    MOERL_CHECK(fgv[m] < tokens, "make_turn_layout: turn " + std::to_string(m - ov[tev[m]]) + " of episode " +
                                     std::to_string(tev[m]) + " has no generated token");
    vpv[m] = fgv[m];
  }
  const auto device = sequence_index.device();
  TurnLayout layout;
  layout.token_turn = token_turn.to(device);
  layout.turn_episode = turn_episode.to(device);
  layout.value_position = value_position.to(device);
  layout.turn_offsets = offsets.to(device);
  layout.num_turns = turns;
  return layout;
}

torch::Tensor gather_turn_values(const torch::Tensor& token_values, const TurnLayout& layout) {
  MOERL_CHECK(token_values.dim() == 1, "gather_turn_values: token_values must be [T]");
  return token_values.index_select(0, layout.value_position);
}

GaeResult gae_over_turns(const torch::Tensor& turn_rewards, const torch::Tensor& turn_values,
                         const torch::Tensor& turn_episode, const GaeOptions& options,
                         const torch::Tensor& bootstrap_values) {
  MOERL_CHECK(turn_rewards.dim() == 1 && turn_values.dim() == 1 && turn_episode.dim() == 1,
              "gae_over_turns: turn_rewards, turn_values and turn_episode must be [M]");
  const std::int64_t turns = turn_rewards.size(0);
  MOERL_CHECK(turn_values.size(0) == turns && turn_episode.size(0) == turns,
              "gae_over_turns: turn_rewards has " + std::to_string(turns) + " turns, turn_values " +
                  std::to_string(turn_values.size(0)) + ", turn_episode " + std::to_string(turn_episode.size(0)));
  torch::NoGradGuard no_grad;
  // The recursion runs backwards over a few turns per episode: sequential by
  // nature, cheap on the host in double.
  auto r = turn_rewards.detach().to(torch::kCPU, torch::kDouble).contiguous();
  auto v = turn_values.detach().to(torch::kCPU, torch::kDouble).contiguous();
  auto e = turn_episode.to(torch::kCPU, torch::kLong).contiguous();
  torch::Tensor boot;
  if (bootstrap_values.defined()) boot = bootstrap_values.detach().to(torch::kCPU, torch::kDouble).contiguous();
  const auto* rv = r.data_ptr<double>();
  const auto* vv = v.data_ptr<double>();
  const auto* ev = e.data_ptr<std::int64_t>();
  auto adv = torch::empty({turns}, torch::kDouble);
  auto* av = adv.data_ptr<double>();
  const double gamma = options.gamma;
  const double gl = options.gamma * options.lambda;
  for (std::int64_t k = turns - 1; k >= 0; --k) {
    const bool last = k == turns - 1 || ev[k + 1] != ev[k];
    if (k < turns - 1)
      MOERL_CHECK(ev[k + 1] >= ev[k],
                  "gae_over_turns: turn_episode must be nondecreasing (turn " + std::to_string(k + 1) + ")");
    double next_value = 0;
    double next_adv = 0;
    if (last) {
      if (boot.defined()) {
        MOERL_CHECK(ev[k] >= 0 && ev[k] < boot.numel(),
                    "gae_over_turns: no bootstrap value for episode " + std::to_string(ev[k]));
        next_value = boot.data_ptr<double>()[ev[k]];
      }
    } else {
      next_value = vv[k + 1];
      next_adv = av[k + 1];
    }
    const double delta = rv[k] + gamma * next_value - vv[k];
    av[k] = delta + gl * next_adv;
  }
  GaeResult result;
  auto options_out = turn_values.options();
  result.advantages = adv.to(options_out);
  result.returns = (adv + v).to(options_out);
  return result;
}

}  // namespace moerl::algo
