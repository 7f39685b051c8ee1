#pragma once
// Learner 0's use of the held-out evaluations ([eval]): after every step it
// writes the base's evaluation and each finished periodic one beside the
// checkpoints (evaluation_record.h), compares each with the reference (the
// version tagged `stable` by `moerl checkpoint accept`, else the base), logs
// a regression beyond the 95% interval and, with [eval] auto_rollback, moves
// the store's `latest` to `stable` after rollback_after regressions in a row;
// the learners then load it as after any rollback (learner.h).

#include <cstdint>
#include <optional>
#include <string>

#include "moerl/config/sections.h"
#include "moerl/learner/evaluation_record.h"

namespace moerl::learner {

class Coordinator;

class EvaluationWatch {
 public:
  // `checkpoint_directory`: the run's checkpoint store, where the records go and `stable` is found.
  EvaluationWatch(const config::EvalSection& eval, std::string checkpoint_directory);
  // `base_ready`: the evaluation before training is complete (false on a resumed run's first steps: it has none).
  void after_step(Coordinator& coordinator, bool base_ready);

 private:
  // The reference and its name ("stable v12", "the base"); nullopt when there is none yet.
  std::optional<std::pair<EvaluationRecord, std::string>> reference() const;
  void judge(const EvaluationRecord& record);
  void roll_back_to_stable();

  config::EvalSection eval_;
  std::string directory_;  // the checkpoint store
  bool base_written_ = false;
  std::int64_t regressed_in_a_row_ = 0;
};

}  // namespace moerl::learner
