#include "moerl/learner/task_coordinator.h"

#include <iomanip>
#include <sstream>

#include "moerl/core/hash.h"
#include "moerl/core/json_writer.h"
#include "moerl/env/task_mix.h"

namespace moerl::learner {
namespace {

// Held-out seeds live far from the training seeds (which count up from the run seed).
constexpr std::uint64_t kEvalSeedBase = 1ull << 40;

}  // namespace

TaskCoordinator::TaskCoordinator(const config::Config& config, runtime::Mailbox& mailbox, int learners,
                                 std::vector<int> actor_ranks)
    : config_(config), mailbox_(mailbox), learners_(learners), actors_(std::move(actor_ranks)),
      assigned_episodes_(static_cast<size_t>(learners), 0) {
  next_seed_ = static_cast<std::uint64_t>(config.run.seed) * 1000003ull;
  start_evaluation(0);
}

void TaskCoordinator::start_evaluation(std::int64_t min_version) {
  eval_queue_.clear();
  for (const std::string& family : config_.env.families) {
    for (std::int64_t i = 0; i < config_.rollout.eval_episodes; ++i) {
      rollout::TaskGroup g;
      g.group_id = next_group_++;
      g.task = env::make_task(config_, family, kEvalSeedBase + static_cast<std::uint64_t>(i) * 7919 + std::hash<std::string>{}(family) % 1000);
      g.size = 1;
      g.evaluation = true;
      g.min_version = min_version;
      eval_queue_.push_back(g);
    }
  }
  eval_outstanding_ = static_cast<int>(eval_queue_.size());
  if (eval_outstanding_ == 0) phase_ = phase_ == Phase::EvalBefore ? Phase::Train : Phase::Done;
}

void TaskCoordinator::resume(std::uint64_t next_group, std::uint64_t next_seed, std::int64_t version) {
  next_group_ = cursor_group_ = next_group;
  next_seed_ = cursor_seed_ = next_seed;
  min_version_floor_ = version;
  eval_queue_.clear();
  eval_outstanding_ = 0;
  phase_ = Phase::Train;
}

std::int64_t TaskCoordinator::train_groups_allowed() const {
  const std::int64_t per_step = config_.algo.groups_per_step;
  if (!config_.sync.asynchronous) return assigned_this_step_ < per_step ? per_step - assigned_this_step_ : 0;
  // Bounded staleness: at most (1 + max_staleness) steps' worth of groups out at once.
  return std::max<std::int64_t>(0, per_step * (1 + config_.sync.max_staleness) - in_flight_);
}

std::vector<rollout::TaskGroup> TaskCoordinator::next_groups(int free_slots, std::int64_t policy_version) {
  std::vector<rollout::TaskGroup> groups;
  if (phase_ == Phase::EvalBefore || phase_ == Phase::EvalAfter) {
    while (!eval_queue_.empty() && free_slots >= 1) {
      groups.push_back(eval_queue_.front());
      eval_queue_.pop_front();
      --free_slots;
    }
    return groups;
  }
  if (phase_ != Phase::Train) return groups;
  const int group_size = static_cast<int>(config_.rollout.group_size);
  std::int64_t allowed = train_groups_allowed();
  while (allowed > 0 && free_slots >= group_size) {
    rollout::TaskGroup g;
    g.group_id = next_group_++;
    const std::uint64_t seed = next_seed_++;
    g.task = env::make_task(config_, env::pick_family(config_, mix64(seed)), seed);
    g.size = group_size;
    g.min_version = std::max(min_version_floor_, config_.sync.asynchronous ? std::int64_t{0} : policy_version);
    groups.push_back(g);
    free_slots -= group_size;
    --allowed;
    ++in_flight_;
    ++assigned_this_step_;
    assigned_episodes_[g.group_id % static_cast<std::uint64_t>(learners_)] += group_size;
  }
  return groups;
}

void TaskCoordinator::serve(std::int64_t policy_version) {
  while (auto request = mailbox_.try_receive<rollout::WorkRequest>())
    pending_.emplace_back(request->first, request->second.free_slots);
  while (!pending_.empty()) {
    auto [actor, free_slots] = pending_.front();
    if (phase_ == Phase::Done) {
      mailbox_.send(actor, rollout::TaskAssignment{{}, true});
      pending_.pop_front();
      continue;
    }
    std::vector<rollout::TaskGroup> groups = next_groups(free_slots, policy_version);
    if (groups.empty()) break;  // answer later, when work is allowed
    mailbox_.send(actor, rollout::TaskAssignment{std::move(groups), false});
    pending_.pop_front();
  }
}

void TaskCoordinator::record_evaluation(const rollout::Trajectory& episode) {
  auto& table = phase_ == Phase::EvalBefore ? before_ : after_;
  FamilyScore& score = table[episode.task.family];
  ++score.episodes;
  score.successes += episode.success;
  score.reward += episode.reward;
  if (--eval_outstanding_ <= 0) phase_ = phase_ == Phase::EvalBefore ? Phase::Train : Phase::Done;
}

void TaskCoordinator::on_step(std::int64_t groups_consumed, std::int64_t groups_dropped, std::int64_t policy_version,
                              bool training_done) {
  in_flight_ -= groups_consumed + groups_dropped;
  if (config_.sync.asynchronous) {
    assigned_this_step_ = 0;
  } else if (groups_dropped > 0) {
    assigned_this_step_ -= groups_dropped;  // replace what staleness dropped
  } else {
    assigned_this_step_ = 0;
  }
  step_version_ = policy_version;
  cursor_group_ = next_group_;
  cursor_seed_ = next_seed_;
  if (training_done && phase_ == Phase::Train) {
    phase_ = Phase::EvalAfter;
    start_evaluation(policy_version);
  }
}

void TaskCoordinator::finish_actors() {
  if (finished_sent_) return;
  // Actors with a request pending get the answer now; the others get it unasked.
  std::vector<int> answered;
  for (const auto& [actor, free] : pending_) {
    mailbox_.send(actor, rollout::TaskAssignment{{}, true});
    answered.push_back(actor);
  }
  pending_.clear();
  for (int actor : actors_)
    if (std::find(answered.begin(), answered.end(), actor) == answered.end())
      mailbox_.send(actor, rollout::TaskAssignment{{}, true});
  finished_sent_ = true;
}

std::string TaskCoordinator::evaluation_table() const {
  std::ostringstream out;
  out << std::left << std::setw(12) << "family" << std::setw(20) << "success before" << std::setw(20)
      << "success after" << std::setw(18) << "reward before" << "reward after\n";
  for (const std::string& family : config_.env.families) {
    const FamilyScore b = before_.count(family) ? before_.at(family) : FamilyScore{};
    const FamilyScore a = after_.count(family) ? after_.at(family) : FamilyScore{};
    std::ostringstream sb, sa;
    sb << std::fixed << std::setprecision(0) << 100 * b.success_rate() << "% (" << b.successes << "/" << b.episodes << ")";
    sa << std::fixed << std::setprecision(0) << 100 * a.success_rate() << "% (" << a.successes << "/" << a.episodes << ")";
    out << std::left << std::setw(12) << family << std::setw(20) << sb.str() << std::setw(20) << sa.str()
        << std::setw(18) << std::fixed << std::setprecision(3) << b.mean_reward() << a.mean_reward() << "\n";
  }
  return out.str();
}

std::string TaskCoordinator::summary_json(std::int64_t steps, double wall_s) const {
  JsonWriter json;
  auto write_table = [&](const std::map<std::string, FamilyScore>& table) {
    json.begin_object();
    for (const auto& [family, score] : table)
      json.key(family).begin_object().key("success").value(score.success_rate()).key("reward").value(score.mean_reward())
          .key("episodes").value(score.episodes).end_object();
    json.end_object();
  };
  json.begin_object().key("before");
  write_table(before_);
  json.key("after");
  write_table(after_);
  json.key("steps").value(steps).key("wall_s").value(wall_s).end_object();
  return json.str();
}

}  // namespace moerl::learner
