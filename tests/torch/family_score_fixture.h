#pragma once
// A FamilyScore with the given counts, for the evaluation tests; its reward
// is one per success (what the sort and guess families pay).

#include "moerl/learner/evaluation_scores.h"

namespace moerl::learner::testing {

inline FamilyScore score(int successes, int episodes) {
  FamilyScore s;
  s.successes = successes;
  s.episodes = episodes;
  s.reward = successes;
  return s;
}

}  // namespace moerl::learner::testing
