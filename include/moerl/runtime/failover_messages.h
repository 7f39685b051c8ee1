#pragma once
// The messages of failover (a fault-tolerant MPI lets the job go on without
// a lost actor or env worker):
//   RankLost              learner 0 -> every living rank: who was lost (host and pid, so
//                         that a rank on that host can fence a frozen process); the
//                         standby actors, actors and env workers act on it
//   GroupsCancelled       learner 0 -> a learner: training groups of a lost actor
//   GroupsCancelledReply  that learner -> learner 0: the ones it cancelled (those not complete)
//   FailoverReport        an actor -> learner 0: sessions it moved, episodes it restarted
//   EnvReleaseRequest     an env worker -> learner 0: a SIGTERM of its own asks to leave the job
//                         (scale-down); its sessions then move as after a loss
//   EnvReleaseReply       learner 0 -> that env worker: granted (it leaves at once), or refused
//                         and why (it then stops the job as any signal does)

#include <cstdint>
#include <string>
#include <vector>

#include "moerl/runtime/message.h"

namespace moerl::runtime {

struct RankLost {
  static constexpr MessageType kType = MessageType::RankLost;
  std::int32_t rank = -1;
  std::string role;
  std::int32_t role_index = -1;
  std::string host;
  std::int64_t pid = 0;
  std::string why;
  void encode(ByteWriter& w) const;
  static RankLost decode(ByteReader& r);
};

struct GroupsCancelled {
  static constexpr MessageType kType = MessageType::GroupsCancelled;
  std::int32_t lost_rank = -1;
  std::vector<std::uint64_t> groups;
  void encode(ByteWriter& w) const;
  static GroupsCancelled decode(ByteReader& r);
};

struct GroupsCancelledReply {
  static constexpr MessageType kType = MessageType::GroupsCancelledReply;
  std::int32_t lost_rank = -1;
  std::vector<std::uint64_t> cancelled;
  void encode(ByteWriter& w) const;
  static GroupsCancelledReply decode(ByteReader& r);
};

struct FailoverReport {
  static constexpr MessageType kType = MessageType::FailoverReport;
  std::int32_t lost_rank = -1;
  std::int32_t sessions_migrated = 0;
  std::int32_t episodes_restarted = 0;
  void encode(ByteWriter& w) const;
  static FailoverReport decode(ByteReader& r);
};

struct EnvReleaseRequest {
  static constexpr MessageType kType = MessageType::EnvReleaseRequest;
  std::string reason;  // "signal 15"
  void encode(ByteWriter& w) const;
  static EnvReleaseRequest decode(ByteReader& r);
};

struct EnvReleaseReply {
  static constexpr MessageType kType = MessageType::EnvReleaseReply;
  bool granted = false;
  std::string refusal;  // why not, when not granted
  void encode(ByteWriter& w) const;
  static EnvReleaseReply decode(ByteReader& r);
};

}  // namespace moerl::runtime
