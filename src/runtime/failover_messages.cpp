#include "moerl/runtime/failover_messages.h"

namespace moerl::runtime {

void RankLost::encode(ByteWriter& w) const {
  w.put(rank);
  w.put_string(role);
  w.put(role_index);
  w.put_string(host);
  w.put(pid);
  w.put_string(why);
}

RankLost RankLost::decode(ByteReader& r) {
  RankLost m;
  m.rank = r.get<std::int32_t>();
  m.role = r.get_string();
  m.role_index = r.get<std::int32_t>();
  m.host = r.get_string();
  m.pid = r.get<std::int64_t>();
  m.why = r.get_string();
  return m;
}

void GroupsCancelled::encode(ByteWriter& w) const {
  w.put(lost_rank);
  w.put_vector(groups);
}

GroupsCancelled GroupsCancelled::decode(ByteReader& r) {
  GroupsCancelled m;
  m.lost_rank = r.get<std::int32_t>();
  m.groups = r.get_vector<std::uint64_t>();
  return m;
}

void GroupsCancelledReply::encode(ByteWriter& w) const {
  w.put(lost_rank);
  w.put_vector(cancelled);
}

GroupsCancelledReply GroupsCancelledReply::decode(ByteReader& r) {
  GroupsCancelledReply m;
  m.lost_rank = r.get<std::int32_t>();
  m.cancelled = r.get_vector<std::uint64_t>();
  return m;
}

void FailoverReport::encode(ByteWriter& w) const {
  w.put(lost_rank);
  w.put(sessions_migrated);
  w.put(episodes_restarted);
}

FailoverReport FailoverReport::decode(ByteReader& r) {
  FailoverReport m;
  m.lost_rank = r.get<std::int32_t>();
  m.sessions_migrated = r.get<std::int32_t>();
  m.episodes_restarted = r.get<std::int32_t>();
  return m;
}

void EnvReleaseRequest::encode(ByteWriter& w) const { w.put_string(reason); }

EnvReleaseRequest EnvReleaseRequest::decode(ByteReader& r) { return EnvReleaseRequest{r.get_string()}; }

void EnvReleaseReply::encode(ByteWriter& w) const {
  w.put<std::uint8_t>(granted ? 1 : 0);
  w.put_string(refusal);
}

EnvReleaseReply EnvReleaseReply::decode(ByteReader& r) {
  EnvReleaseReply m;
  m.granted = r.get<std::uint8_t>() != 0;
  m.refusal = r.get_string();
  return m;
}

}  // namespace moerl::runtime
