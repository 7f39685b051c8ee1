#include "moerl/env/task_mix.h"

#include <vector>

#include "moerl/core/check.h"

namespace moerl::env {
namespace {

const config::EnvFamilySection* overrides_for(const config::EnvFamilySections& families, const std::string& family) {
  const auto it = families.find(family);
  return it == families.end() ? nullptr : &it->second;
}

}  // namespace

TaskSpec make_task(const config::EnvSection& env, const config::EnvFamilySections& families, const std::string& family,
                   std::uint64_t seed) {
  TaskSpec task;
  task.family = family;
  task.seed = seed;
  task.difficulty = static_cast<int>(env.difficulty);
  task.shaping = env.shaping == config::Shaping::Shaped ? RewardShaping::Shaped : RewardShaping::Sparse;
  task.max_turns = static_cast<int>(env.max_turns);
  if (const auto* own = overrides_for(families, family)) {
    if (own->difficulty > 0) task.difficulty = static_cast<int>(own->difficulty);
    if (own->max_turns > 0) task.max_turns = static_cast<int>(own->max_turns);
    if (own->shaping != config::ShapingChoice::Inherit)
      task.shaping = own->shaping == config::ShapingChoice::Shaped ? RewardShaping::Shaped : RewardShaping::Sparse;
  }
  return task;
}

std::string pick_family(const config::EnvSection& env, const config::EnvFamilySections& families, std::uint64_t draw,
                        const std::set<std::string>& excluded, const std::map<std::string, double>& scales) {
  MOERL_CHECK(!env.families.empty(), "[env] families is empty");
  std::vector<std::string> allowed;
  for (const std::string& f : env.families)
    if (!excluded.count(f)) allowed.push_back(f);
  if (allowed.empty()) return "";
  auto weight_of = [&](const std::string& f) {
    const auto* own = overrides_for(families, f);
    const auto scale = scales.find(f);
    return (own ? own->weight : 1.0) * (scale == scales.end() ? 1.0 : scale->second);
  };
  double total = 0;
  for (const std::string& f : allowed) total += weight_of(f);
  if (total <= 0) return allowed[draw % allowed.size()];
  double point = static_cast<double>(draw >> 11) * 0x1.0p-53 * total;
  for (const std::string& f : allowed) {
    point -= weight_of(f);
    if (point < 0) return f;
  }
  return allowed.back();
}

}  // namespace moerl::env
