#pragma once
// The env worker's messages: one request type (its kind says open, step,
// close, snapshot or restore) and one reply type, so an actor has a single
// queue of answers to drain; plus a capacity change from learner 0.

#include "moerl/env/session_host.h"
#include "moerl/runtime/message.h"

namespace moerl::env {

// A TaskSpec on the wire (env requests, trajectories, session snapshots).
void write_task(runtime::ByteWriter& w, const TaskSpec& task);
TaskSpec read_task(runtime::ByteReader& r);
// A FailureReason byte; WireError on a value outside the enum.
FailureReason read_failure_reason(runtime::ByteReader& r);

struct EnvRequestMessage {
  static constexpr runtime::MessageType kType = runtime::MessageType::EnvRequest;
  EnvRequest request;
  void encode(runtime::ByteWriter& w) const;
  static EnvRequestMessage decode(runtime::ByteReader& r);
};

struct EnvReplyMessage {
  static constexpr runtime::MessageType kType = runtime::MessageType::EnvReply;
  EnvReply reply;
  void encode(runtime::ByteWriter& w) const;
  static EnvReplyMessage decode(runtime::ByteReader& r);
};

struct EnvCapacityMessage {
  static constexpr runtime::MessageType kType = runtime::MessageType::EnvCapacity;
  std::uint64_t sessions = 0;
  void encode(runtime::ByteWriter& w) const { w.put(sessions); }
  static EnvCapacityMessage decode(runtime::ByteReader& r) { return {r.get<std::uint64_t>()}; }
};

}  // namespace moerl::env
