#pragma once
// A held-out evaluation of one policy version, kept beside its checkpoint so
// that `moerl checkpoint accept` and [eval] auto_rollback can compare
// versions: <checkpoint dir>/vNNNNNN.eval.json (retention deletes it with
// the version's other files) and, for the base the run started from,
// <checkpoint dir>/base.eval.json. Written atomically by learner 0 when a
// periodic evaluation ([eval] every_steps) or the one before training
// completes.
//
// A periodic evaluation of version V asks the actors for version V or newer
// (asynchronous actors may pick up V+1 while they play); `versions` records
// the range that played it.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "moerl/learner/evaluation_scores.h"

namespace moerl::learner {

struct EvaluationRecord {
  std::int64_t version = -1;         // -1: the base (before training)
  std::int64_t lowest_version = -1;  // the policy versions that played it
  std::int64_t highest_version = -1;
  double temperature = 0;  // of `sampled`
  ScoreTable sampled;      // at rollout.eval_temperature
  ScoreTable greedy;       // temperature 0; empty when not played separately

  std::string to_json() const;
  // `what` names the file in errors.
  static EvaluationRecord from_json(const std::string& text, const std::string& what);
};

std::string evaluation_path(const std::string& checkpoint_dir, std::int64_t version);  // version -1: the base
void write_evaluation(const std::string& checkpoint_dir, const EvaluationRecord& record);
// nullopt when the file does not exist; throws Error naming it when it does not parse.
std::optional<EvaluationRecord> read_evaluation(const std::string& checkpoint_dir, std::int64_t version);

// Families in which `candidate` is below `reference` beyond the 95%
// interval of the difference (Newcombe's upper end below 0), each as
// "sort 12% vs 50% (-38 points, interval [-58, -12])". Families missing
// from either side are not compared.
std::vector<std::string> regressions(const ScoreTable& reference, const ScoreTable& candidate);

}  // namespace moerl::learner
