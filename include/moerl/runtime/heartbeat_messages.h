#pragma once
// The messages of heartbeats (runtime/heartbeat.h) and of abort_job() under a
// fault-tolerant MPI.

#include <cstdint>
#include <string>

#include "moerl/runtime/message.h"

namespace moerl::runtime {

struct Heartbeat {
  static constexpr MessageType kType = MessageType::Heartbeat;
  std::int32_t rank = -1;
  std::string role;  // "actor", "env_worker", ...
  std::int32_t role_index = -1;
  std::string host;
  std::int64_t pid = 0;
  std::uint64_t sequence = 0;
  std::int64_t weight_version = -1;  // actors: the weights they generate with
  std::int32_t live_sessions = 0;    // actors: episodes in flight; env workers: sessions hosted
  std::int32_t queue_depth = 0;      // actors: sessions waiting on an env worker
  void encode(ByteWriter& w) const;
  static Heartbeat decode(ByteReader& r);
};

struct CoordinatorBeat {
  static constexpr MessageType kType = MessageType::CoordinatorBeat;
  std::uint64_t sequence = 0;
  std::int64_t step = 0;     // learner steps completed
  std::int64_t version = 0;  // the newest policy version published
  void encode(ByteWriter& w) const;
  static CoordinatorBeat decode(ByteReader& r);
};

struct JobAbort {
  static constexpr MessageType kType = MessageType::JobAbort;
  std::int32_t status = 1;
  std::string reason;
  void encode(ByteWriter& w) const;
  static JobAbort decode(ByteReader& r);
};

}  // namespace moerl::runtime
