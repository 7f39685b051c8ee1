#include "moerl/learner/evaluation_watch.h"

#include <spdlog/spdlog.h>

#include <utility>

#include "moerl/core/error.h"
#include "moerl/core/join.h"
#include "moerl/learner/coordinator.h"
#include "moerl/storage/checkpoint_store.h"
#include "moerl/telemetry/metrics.h"

namespace moerl::learner {
namespace {

constexpr const char* kStableTag = "stable";

std::string describe_scores(const ScoreTable& table) {
  std::string text;
  for (const auto& [family, score] : table) {
    const Interval ci = score.success_interval();
    text += fmt::format("{}{} {:.0f}% [{:.0f}, {:.0f}]", text.empty() ? "" : ", ", family, 100 * score.success_rate(),
                        100 * ci.low, 100 * ci.high);
  }
  return text;
}

}  // namespace

EvaluationWatch::EvaluationWatch(const config::EvalSection& eval, std::string checkpoint_directory)
    : eval_(eval), directory_(std::move(checkpoint_directory)) {}

void EvaluationWatch::after_step(Coordinator& coordinator, bool base_ready) {
  if (base_ready && !base_written_) {
    base_written_ = true;
    // A resumed run's base is the first attempt's: kept as it was written then.
    if (!read_evaluation(directory_, -1)) {
      const EvaluationRecord base = coordinator.base_evaluation();
      if (!base.sampled.empty()) write_evaluation(directory_, base);
    }
  }
  while (std::optional<EvaluationRecord> record = coordinator.take_periodic_evaluation()) {
    write_evaluation(directory_, *record);
    spdlog::info("evaluation of version {} (played by versions {}-{}): {}", record->version, record->lowest_version,
                 record->highest_version, describe_scores(record->sampled));
    judge(*record);
  }
}

std::optional<std::pair<EvaluationRecord, std::string>> EvaluationWatch::reference() const {
  std::map<std::string, std::int64_t> tags;
  try {
    tags = storage::CheckpointStore(directory_).tags();
  } catch (const Error& error) {
    spdlog::warn("evaluation: cannot read the tags of {}: {}", directory_, error.what());
  }
  if (const auto stable = tags.find(kStableTag); stable != tags.end()) {
    if (auto record = read_evaluation(directory_, stable->second))
      return std::make_pair(*record, "stable v" + std::to_string(stable->second));
    spdlog::warn("evaluation: the stable version v{} has no evaluation in {}; comparing with the base", stable->second,
                 directory_);
  }
  if (auto base = read_evaluation(directory_, -1)) return std::make_pair(*base, std::string("the base"));
  return std::nullopt;
}

void EvaluationWatch::judge(const EvaluationRecord& record) {
  const auto ref = reference();
  if (!ref) return;
  const std::vector<std::string> worse = regressions(ref->first.sampled, record.sampled);
  if (worse.empty()) {
    regressed_in_a_row_ = 0;
    return;
  }
  ++regressed_in_a_row_;
  telemetry::metrics().add("learner.eval_regressions");
  spdlog::warn("evaluation: version {} is below {} beyond the 95% interval ({} in a row): {}", record.version,
               ref->second, regressed_in_a_row_, join(worse, "; "));
  if (eval_.auto_rollback && regressed_in_a_row_ >= eval_.rollback_after) roll_back_to_stable();
}

void EvaluationWatch::roll_back_to_stable() {
  regressed_in_a_row_ = 0;
  try {
    storage::CheckpointStore store(directory_);
    const std::map<std::string, std::int64_t> tags = store.tags();
    if (!tags.count(kStableTag)) {
      spdlog::warn(
          "auto_rollback: {} evaluations in a row regressed, but no version is tagged stable in {} "
          "(moerl checkpoint accept tags one); the job goes on",
          eval_.rollback_after, directory_);
      return;
    }
    const storage::RollbackResult moved = store.rollback_to(kStableTag);
    telemetry::metrics().add("learner.auto_rollbacks");
    spdlog::warn(
        "auto_rollback: {} evaluations in a row regressed; `latest` moved to stable v{} (from {}); the "
        "learners load it after this step",
        eval_.rollback_after, moved.to, moved.from ? "v" + std::to_string(*moved.from) : "none");
  } catch (const Error& error) {
    spdlog::error("auto_rollback: could not return to stable in {}: {}", directory_, error.what());
  }
}

}  // namespace moerl::learner
