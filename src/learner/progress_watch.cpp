#include "moerl/learner/progress_watch.h"

#include <iomanip>
#include <sstream>

namespace moerl::learner {

ProgressWatch::ProgressWatch(double limit_s) : limit_s_(limit_s) {}

void ProgressWatch::start(double now) {
  if (started_ == 0) started_ = now;
  progressed(now);
}

void ProgressWatch::progressed(double now) {
  last_progress_ = now;
  next_warning_ = now + limit_s_ / 2;
}

void ProgressWatch::heard_from(int rank, double now) { last_heard_[rank] = now; }

void ProgressWatch::generated_tokens(double total, double now) {
  if (total > tokens_seen_) {
    if (tokens_seen_ >= 0) progressed(now);
    tokens_seen_ = total;
  }
}

bool ProgressWatch::warn_due(double now) {
  if (now < next_warning_) return false;
  next_warning_ = now + limit_s_ / 4;
  return true;
}

std::string ProgressWatch::quiet_ranks(const runtime::RankLayout& layout, double quiet_s, double now) const {
  std::ostringstream out;
  out << std::fixed << std::setprecision(1);
  bool first = true;
  for (int rank = 0; rank < layout.world_size(); ++rank) {
    if (rank == runtime::RankLayout::kCoordinatorRank) continue;
    const auto heard = last_heard_.find(rank);
    if (heard != last_heard_.end() && now - heard->second <= quiet_s) continue;
    const runtime::RankAssignment who = layout.assignment(rank);
    out << (first ? "" : ", ") << runtime::role_name(who.role) << " " << who.index << " (rank " << rank << ") ";
    if (heard == last_heard_.end()) {
      out << "never heard from in " << now - started_ << " s";
    } else {
      out << "silent " << now - heard->second << " s";
    }
    first = false;
  }
  return out.str();
}

}  // namespace moerl::learner
