// Group-relative advantages, dynamic sampling and the overlong penalty
// (formulas and sources in advantages.h).

#include "moerl/algo/advantages.h"

#include <cmath>
#include <string>
#include <unordered_map>
#include <vector>

#include "moerl/algo/token_batch.h"
#include "moerl/core/check.h"

namespace moerl::algo {

namespace {

void check_episode_inputs(const char* what, const torch::Tensor& rewards, const torch::Tensor& group_ids) {
  MOERL_CHECK(rewards.dim() == 1, std::string(what) + ": rewards must be [N]");
  MOERL_CHECK(group_ids.dim() == 1 && group_ids.size(0) == rewards.size(0),
              std::string(what) + ": group_ids must be [N] like rewards (got " + std::to_string(group_ids.numel()) +
                  " for " + std::to_string(rewards.numel()) + " rewards)");
  MOERL_CHECK(rewards.is_floating_point(), std::string(what) + ": rewards must be floating point");
}

// Per-episode group statistics, broadcast back to episodes.
struct GroupStats {
  torch::Tensor dense;  // [N] int64
  torch::Tensor count;  // [N] group size of each episode's group
  torch::Tensor mean;   // [N]
  torch::Tensor sum;    // [N]
  std::int64_t groups = 0;
};

GroupStats group_stats(const torch::Tensor& rewards, const torch::Tensor& group_ids) {
  GroupStats s;
  s.dense = dense_group_ids(group_ids, &s.groups);
  auto r = rewards.detach();
  auto sums = segment_sum(r, s.dense, s.groups);
  auto counts = segment_sum(torch::ones_like(r), s.dense, s.groups);
  s.sum = sums.index_select(0, s.dense);
  s.count = counts.index_select(0, s.dense);
  s.mean = s.sum / s.count;
  return s;
}

// Each element's group standard deviation, from the values less their group
// mean. Groups of one: unbiased divisor 0 -> use 1 (the numerator is 0 anyway).
torch::Tensor group_std(const torch::Tensor& centred, const GroupStats& s, bool unbiased) {
  auto sq = segment_sum(centred * centred, s.dense, s.groups).index_select(0, s.dense);
  auto divisor = unbiased ? (s.count - 1).clamp_min(1.0) : s.count;
  return (sq / divisor).sqrt();
}

}  // namespace

torch::Tensor dense_group_ids(const torch::Tensor& group_ids, std::int64_t* num_groups) {
  MOERL_CHECK(group_ids.dim() == 1, "dense_group_ids: group_ids must be [N]");
  MOERL_CHECK(!group_ids.is_floating_point(), "dense_group_ids: group_ids must be integers");
  // N is the episode count (hundreds to thousands): a host map is simpler and
  // cheaper than a device sort.
  auto host = group_ids.to(torch::kCPU, torch::kLong).contiguous();
  const auto* ids = host.data_ptr<std::int64_t>();
  const std::int64_t n = host.numel();
  auto dense = torch::empty({n}, torch::kLong);
  auto* out = dense.data_ptr<std::int64_t>();
  std::unordered_map<std::int64_t, std::int64_t> index;
  for (std::int64_t i = 0; i < n; ++i) {
    auto it = index.emplace(ids[i], static_cast<std::int64_t>(index.size())).first;
    out[i] = it->second;
  }
  if (num_groups) *num_groups = static_cast<std::int64_t>(index.size());
  return dense.to(group_ids.device());
}

torch::Tensor grpo_advantages(const torch::Tensor& rewards, const torch::Tensor& group_ids,
                              const GroupAdvantageOptions& options) {
  check_episode_inputs("grpo_advantages", rewards, group_ids);
  torch::NoGradGuard no_grad;
  auto s = group_stats(rewards, group_ids);
  auto centred = rewards.detach() - s.mean;
  if (!options.normalize_by_std) return centred;
  return centred / (group_std(centred, s, options.unbiased_std) + options.eps);
}

torch::Tensor dr_grpo_advantages(const torch::Tensor& rewards, const torch::Tensor& group_ids) {
  GroupAdvantageOptions options;
  options.normalize_by_std = false;
  return grpo_advantages(rewards, group_ids, options);
}

torch::Tensor rloo_advantages(const torch::Tensor& rewards, const torch::Tensor& group_ids) {
  check_episode_inputs("rloo_advantages", rewards, group_ids);
  torch::NoGradGuard no_grad;
  auto s = group_stats(rewards, group_ids);
  auto r = rewards.detach();
  auto others = s.count - 1;
  auto baseline = (s.sum - r) / others.clamp_min(1.0);
  // No other sample in the group: no baseline, no signal.
  return torch::where(others > 0, r - baseline, torch::zeros_like(r));
}

torch::Tensor turn_group_advantages(const torch::Tensor& turn_rewards, const torch::Tensor& turn_episode,
                                    const torch::Tensor& group_ids, const GroupAdvantageOptions& options) {
  MOERL_CHECK(turn_rewards.dim() == 1 && turn_rewards.is_floating_point(),
              "turn_group_advantages: turn_rewards must be a floating-point [M]");
  MOERL_CHECK(turn_episode.dim() == 1 && turn_episode.size(0) == turn_rewards.size(0),
              "turn_group_advantages: turn_episode must be [M] like turn_rewards");
  MOERL_CHECK(group_ids.dim() == 1, "turn_group_advantages: group_ids must be [N]");
  torch::NoGradGuard no_grad;
  const auto episodes = group_ids.size(0);
  const torch::Tensor owner = turn_episode.to(torch::kCPU, torch::kLong).contiguous();
  const auto* e = owner.data_ptr<std::int64_t>();
  const std::int64_t m = owner.numel();
  for (std::int64_t k = 0; k < m; ++k)
    MOERL_CHECK(e[k] >= 0 && e[k] < episodes && (k == 0 || e[k] >= e[k - 1]),
                "turn_group_advantages: turn " + std::to_string(k) + " names episode " + std::to_string(e[k]) +
                    " (episodes 0.." + std::to_string(episodes - 1) + ", in nondecreasing order)");
  const torch::Tensor turn_groups = group_ids.index_select(0, turn_episode.to(group_ids.device()));
  const torch::Tensor normalised =
      grpo_advantages(turn_rewards, turn_groups, options).to(torch::kCPU, torch::kDouble).contiguous();
  // Suffix sums inside each episode (M is a few thousand turns: a host loop).
  const auto* r = normalised.data_ptr<double>();
  std::vector<double> sums(static_cast<size_t>(m));
  double later = 0;
  for (std::int64_t k = m - 1; k >= 0; --k) {
    if (k == m - 1 || e[k] != e[k + 1]) later = 0;
    later += r[k];
    sums[static_cast<size_t>(k)] = later;
  }
  torch::Tensor advantages = torch::tensor(sums, torch::kDouble);
  if (options.normalize_by_std) {
    // The sums again to unit std per group: a 12-turn episode's sums would
    // otherwise outweigh a 2-turn one's several times over, and in a mix of
    // families the long ones' gradient drowned the short ones' (arithmetic
    // fell from 21% to 1% next to guess and sort; docs/algorithms.md).
    const GroupStats g = group_stats(advantages, turn_groups.to(torch::kCPU));
    advantages = advantages / (group_std(advantages - g.mean, g, options.unbiased_std) + options.eps);
  }
  return advantages.to(turn_rewards.options());
}

GroupFilter filter_zero_variance_groups(const torch::Tensor& rewards, const torch::Tensor& group_ids,
                                        double tolerance) {
  check_episode_inputs("filter_zero_variance_groups", rewards, group_ids);
  torch::NoGradGuard no_grad;
  std::int64_t groups = 0;
  auto dense = dense_group_ids(group_ids, &groups).to(torch::kCPU);
  auto r = rewards.detach().to(torch::kCPU, torch::kDouble).contiguous();
  const auto* rv = r.data_ptr<double>();
  const auto* gv = dense.data_ptr<std::int64_t>();
  const std::int64_t n = r.numel();
  std::vector<double> lo(groups, INFINITY), hi(groups, -INFINITY);
  for (std::int64_t i = 0; i < n; ++i) {
    lo[gv[i]] = std::min(lo[gv[i]], rv[i]);
    hi[gv[i]] = std::max(hi[gv[i]], rv[i]);
  }
  GroupFilter f;
  auto kept = torch::empty({n}, torch::kBool);
  auto* kv = kept.data_ptr<bool>();
  for (std::int64_t g = 0; g < groups; ++g) {
    if (hi[g] - lo[g] > tolerance)
      ++f.kept_groups;
    else
      ++f.dropped_groups;
  }
  for (std::int64_t i = 0; i < n; ++i) {
    kv[i] = hi[gv[i]] - lo[gv[i]] > tolerance;
    if (!kv[i]) ++f.dropped_episodes;
  }
  f.kept = kept.to(rewards.device());
  return f;
}

torch::Tensor overlong_penalty(const torch::Tensor& response_lengths, const OverlongOptions& options) {
  MOERL_CHECK(response_lengths.dim() == 1, "overlong_penalty: response_lengths must be [N]");
  MOERL_CHECK(options.max_length > 0, "overlong_penalty: max_length must be positive");
  MOERL_CHECK(options.cache_length > 0 && options.cache_length <= options.max_length,
              "overlong_penalty: cache_length must be in (0, max_length], got " + std::to_string(options.cache_length));
  torch::NoGradGuard no_grad;
  auto dtype = response_lengths.is_floating_point() ? response_lengths.scalar_type() : torch::kFloat;
  auto length = response_lengths.to(dtype);
  const double free_until = static_cast<double>(options.max_length - options.cache_length);
  // Inside the ramp: ((L_max - L_cache) - L) / L_cache, from 0 down to -1 at L_max.
  auto ramp = (free_until - length) / static_cast<double>(options.cache_length);
  auto penalty = torch::where(length <= free_until, torch::zeros_like(length), ramp);
  penalty = torch::where(length > static_cast<double>(options.max_length), torch::full_like(length, -1.0), penalty);
  return penalty * options.factor;
}

}  // namespace moerl::algo
