#include "moerl/env/env_messages.h"

namespace moerl::env {
namespace {

RequestKind read_kind(runtime::ByteReader& r) {
  const auto kind = r.get<std::uint8_t>();
  if (kind < 1 || kind > 5) throw runtime::WireError("unknown env request kind " + std::to_string(kind));
  return static_cast<RequestKind>(kind);
}

}  // namespace

FailureReason read_failure_reason(runtime::ByteReader& r) {
  const auto reason = r.get<std::uint8_t>();
  if (reason > kMaxFailureReason) throw runtime::WireError("unknown failure reason " + std::to_string(reason));
  return static_cast<FailureReason>(reason);
}

void write_task(runtime::ByteWriter& w, const TaskSpec& t) {
  w.put_string(t.family);
  w.put<std::int32_t>(t.difficulty);
  w.put(t.seed);
  w.put<std::uint8_t>(t.shaping == RewardShaping::Shaped);
  w.put<std::int32_t>(t.max_turns);
}

TaskSpec read_task(runtime::ByteReader& r) {
  TaskSpec t;
  t.family = r.get_string();
  t.difficulty = r.get<std::int32_t>();
  t.seed = r.get<std::uint64_t>();
  t.shaping = r.get<std::uint8_t>() ? RewardShaping::Shaped : RewardShaping::Sparse;
  t.max_turns = r.get<std::int32_t>();
  return t;
}

void EnvRequestMessage::encode(runtime::ByteWriter& w) const {
  const EnvRequest& q = request;
  w.put<std::uint8_t>(static_cast<std::uint8_t>(q.kind));
  w.put(q.request_id);
  w.put(q.session);
  write_task(w, q.task);
  w.put_string(q.action);
  w.put<std::uint8_t>(q.to_archive);
  w.put_vector(q.snapshot);
  w.put_string(q.archive_path);
  w.put<std::uint64_t>(q.replay_after.size());
  for (const std::string& action : q.replay_after) w.put_string(action);
}

EnvRequestMessage EnvRequestMessage::decode(runtime::ByteReader& r) {
  EnvRequestMessage m;
  EnvRequest& q = m.request;
  q.kind = read_kind(r);
  q.request_id = r.get<std::uint64_t>();
  q.session = r.get<std::uint64_t>();
  q.task = read_task(r);
  q.action = r.get_string();
  q.to_archive = r.get<std::uint8_t>() != 0;
  q.snapshot = r.get_vector<std::uint8_t>();
  q.archive_path = r.get_string();
  const auto actions = r.get<std::uint64_t>();
  if (actions > r.remaining()) throw runtime::WireError("replay action count exceeds the payload");
  for (std::uint64_t i = 0; i < actions; ++i) q.replay_after.push_back(r.get_string());
  return m;
}

void EnvReplyMessage::encode(runtime::ByteWriter& w) const {
  const EnvReply& a = reply;
  w.put<std::uint8_t>(static_cast<std::uint8_t>(a.kind));
  w.put(a.request_id);
  w.put(a.session);
  w.put<std::uint8_t>(a.ok);
  w.put<std::uint8_t>(static_cast<std::uint8_t>(a.failure));
  w.put_string(a.error);
  w.put_string(a.observation);
  w.put(a.reward);
  w.put<std::uint8_t>(a.done);
  w.put<std::uint8_t>(a.success);
  w.put<std::int32_t>(a.turn);
  w.put<std::int32_t>(a.attempts);
  w.put<std::uint64_t>(a.info.size());
  for (const auto& [key, value] : a.info) {
    w.put_string(key);
    w.put_string(value);
  }
  w.put_vector(a.snapshot);
  w.put_string(a.archive_path);
}

EnvReplyMessage EnvReplyMessage::decode(runtime::ByteReader& r) {
  EnvReplyMessage m;
  EnvReply& a = m.reply;
  a.kind = read_kind(r);
  a.request_id = r.get<std::uint64_t>();
  a.session = r.get<std::uint64_t>();
  a.ok = r.get<std::uint8_t>() != 0;
  a.failure = read_failure_reason(r);
  a.error = r.get_string();
  a.observation = r.get_string();
  a.reward = r.get<double>();
  a.done = r.get<std::uint8_t>() != 0;
  a.success = r.get<std::uint8_t>() != 0;
  a.turn = r.get<std::int32_t>();
  a.attempts = r.get<std::int32_t>();
  const auto entries = r.get<std::uint64_t>();
  if (entries > r.remaining()) throw runtime::WireError("info map larger than the payload");
  for (std::uint64_t i = 0; i < entries; ++i) {
    std::string key = r.get_string();
    a.info[key] = r.get_string();
  }
  a.snapshot = r.get_vector<std::uint8_t>();
  a.archive_path = r.get_string();
  return m;
}

}  // namespace moerl::env
