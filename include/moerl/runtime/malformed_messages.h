#pragma once
// What a receiver does with a message that fails validation: drops it with a
// warning naming the sender, the type and the field, and counts it per sender;
// [cluster] malformed_message_limit of them from one rank mean that rank is
// broken, and the job stops naming it (repeated corruption is not noise).

#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "moerl/runtime/message.h"
#include "moerl/runtime/rank_layout.h"

namespace moerl::runtime {

class MalformedMessages {
 public:
  MalformedMessages(const RankLayout& layout, std::int64_t limit, std::string receiver);

  // Counts and logs `error`; the reason to stop the job once its sender
  // reached the limit (returned once), else nothing. Thread-safe.
  std::optional<std::string> drop(const MessageError& error);
  std::int64_t dropped_from(int rank) const;

 private:
  RankLayout layout_;
  std::int64_t limit_;
  std::string receiver_;
  mutable std::mutex mutex_;
  std::map<int, std::int64_t> by_rank_;
};

}  // namespace moerl::runtime
