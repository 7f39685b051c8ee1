#pragma once
// A learner's watch over the flow of episodes: when nothing arrived for a
// while it warns (once at half the limit, then every quarter of it), and at
// the limit it says so, so that the job stops with the silent ranks named
// instead of sitting idle. Progress is an episode or failure record
// arriving, or generated tokens growing on the actors (a long episode is
// still progress). Which ranks were heard from, and when, comes from every
// message the learner receives (episodes, metrics reports).

#include <map>
#include <string>
#include <vector>

#include "moerl/runtime/rank_layout.h"

namespace moerl::learner {

class ProgressWatch {
 public:
  explicit ProgressWatch(double limit_s);

  void start(double now);  // the clock starts (again): a new phase began
  void progressed(double now);
  void heard_from(int rank, double now);
  // The actors' generated-token total as last reported; growth is progress.
  void generated_tokens(double total, double now);

  double idle_s(double now) const { return now - last_progress_; }
  double limit_s() const { return limit_s_; }
  bool warn_due(double now);  // true when a warning is due now (and marks it given)
  bool expired(double now) const { return idle_s(now) > limit_s_; }

  // "env_worker 0 (rank 3) silent 31.0 s, actor 1 (rank 2) never heard from": every
  // rank of `layout` but learner 0 not heard from for `quiet_s` seconds; "" when none.
  std::string quiet_ranks(const runtime::RankLayout& layout, double quiet_s, double now) const;

 private:
  double limit_s_;
  double last_progress_ = 0;
  double next_warning_ = 0;
  double tokens_seen_ = -1;
  double started_ = 0;
  std::map<int, double> last_heard_;
};

}  // namespace moerl::learner
