#include "moerl/runtime/malformed_messages.h"

#include <spdlog/spdlog.h>

namespace moerl::runtime {

MalformedMessages::MalformedMessages(const RankLayout& layout, std::int64_t limit, std::string receiver)
    : layout_(layout), limit_(limit), receiver_(std::move(receiver)) {}

std::optional<std::string> MalformedMessages::drop(const MessageError& error) {
  const int rank = error.source();
  std::int64_t count = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    count = ++by_rank_[rank];
  }
  const std::string sender =
      rank >= 0 && rank < layout_.world_size()
          ? std::string(role_name(layout_.assignment(rank).role)) + " rank " + std::to_string(rank)
          : std::string("an unknown rank");
  spdlog::warn("{}: dropped a malformed message from {} ({} of {} allowed): {}", receiver_, sender, count, limit_,
               error.what());
  if (count != limit_) return std::nullopt;
  return sender + " sent " + std::to_string(count) +
         " malformed messages ([cluster] malformed_message_limit); the last: " + error.what();
}

std::int64_t MalformedMessages::dropped_from(int rank) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = by_rank_.find(rank);
  return it == by_rank_.end() ? 0 : it->second;
}

}  // namespace moerl::runtime
