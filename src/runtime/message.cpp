#include "moerl/runtime/message.h"

#include <sstream>

#include "moerl/core/check.h"

namespace moerl::runtime {

const char* message_type_name(MessageType type) {
  switch (type) {
    case MessageType::Hello: return "Hello";
    case MessageType::HelloReply: return "HelloReply";
    case MessageType::Ping: return "Ping";
    case MessageType::Pong: return "Pong";
    case MessageType::MetricsReport: return "MetricsReport";
    case MessageType::StopRequest: return "StopRequest";
    case MessageType::Stop: return "Stop";
    case MessageType::EnvRequest: return "EnvRequest";
    case MessageType::EnvReply: return "EnvReply";
    case MessageType::EnvCapacity: return "EnvCapacity";
    case MessageType::WorkRequest: return "WorkRequest";
    case MessageType::TaskAssignment: return "TaskAssignment";
    case MessageType::Trajectory: return "Trajectory";
    case MessageType::Heartbeat: return "Heartbeat";
    case MessageType::CoordinatorBeat: return "CoordinatorBeat";
    case MessageType::RankLost: return "RankLost";
    case MessageType::GroupsCancelled: return "GroupsCancelled";
    case MessageType::EnvSessionsMoved: return "EnvSessionsMoved";
    case MessageType::JobAbort: return "JobAbort";
    case MessageType::GroupsCancelledReply: return "GroupsCancelledReply";
    case MessageType::FailoverReport: return "FailoverReport";
    case MessageType::EndOfJob: return "EndOfJob";
    case MessageType::EnvReleaseRequest: return "EnvReleaseRequest";
    case MessageType::EnvReleaseReply: return "EnvReleaseReply";
    case MessageType::EnvJoinStart: return "EnvJoinStart";
    case MessageType::RankRejoined: return "RankRejoined";
  }
  return "unknown";
}

bool is_known_message_type(std::uint16_t value) { return value >= 1 && value <= kMaxMessageType; }

std::vector<std::uint8_t> frame_message(MessageType type, int sender_rank, const std::vector<std::uint8_t>& payload) {
  MOERL_CHECK(payload.size() <= kMaxPayloadBytes, std::string("payload of ") + message_type_name(type) +
                                                      " too large: " + std::to_string(payload.size()) + " bytes");
  ByteWriter w;
  w.bytes().reserve(kHeaderBytes + payload.size());
  w.put<std::uint32_t>(kWireMagic);
  w.put<std::uint16_t>(kWireVersion);
  w.put<std::uint16_t>(static_cast<std::uint16_t>(type));
  w.put<std::uint64_t>(payload.size());
  w.put<std::uint32_t>(crc32(payload.data(), payload.size()));
  w.put<std::int32_t>(sender_rank);
  w.put_bytes(payload.data(), payload.size());
  return w.take();
}

namespace {

[[noreturn]] void reject(MessageType expected, int source, const std::string& problem) {
  std::ostringstream out;
  out << "malformed " << message_type_name(expected) << " message from rank " << source << ": " << problem;
  throw MessageError(out.str(), source);
}

}  // namespace

Envelope unframe_message(const std::vector<std::uint8_t>& frame, MessageType expected_type, int mpi_source) {
  if (frame.size() < kHeaderBytes)
    reject(expected_type, mpi_source, "only " + std::to_string(frame.size()) + " bytes, shorter than the header");
  ByteReader header(frame.data(), kHeaderBytes);
  const auto magic = header.get<std::uint32_t>();
  const auto version = header.get<std::uint16_t>();
  const auto type = header.get<std::uint16_t>();
  const auto length = header.get<std::uint64_t>();
  const auto checksum = header.get<std::uint32_t>();
  const auto sender = header.get<std::int32_t>();
  if (magic != kWireMagic) reject(expected_type, mpi_source, "bad magic number (not a moerl message)");
  if (version != kWireVersion)
    reject(expected_type, mpi_source,
           "wire version " + std::to_string(version) + ", this build speaks " + std::to_string(kWireVersion) +
               " (mixed moerl builds in one job?)");
  if (!is_known_message_type(type)) reject(expected_type, mpi_source, "unknown message type " + std::to_string(type));
  if (type != static_cast<std::uint16_t>(expected_type))
    reject(expected_type, mpi_source, std::string("header says ") + message_type_name(static_cast<MessageType>(type)));
  if (length != frame.size() - kHeaderBytes)
    reject(expected_type, mpi_source,
           "header announces " + std::to_string(length) + " payload bytes, received " +
               std::to_string(frame.size() - kHeaderBytes));
  if (sender != mpi_source) reject(expected_type, mpi_source, "header names sender rank " + std::to_string(sender));
  const std::uint8_t* payload = frame.data() + kHeaderBytes;
  if (crc32(payload, length) != checksum) reject(expected_type, mpi_source, "payload checksum mismatch");
  return Envelope{expected_type, mpi_source, std::vector<std::uint8_t>(payload, payload + length)};
}

void Hello::encode(ByteWriter& w) const {
  w.put_string(run_name);
  w.put(config_hash);
}
Hello Hello::decode(ByteReader& r) {
  Hello m;
  m.run_name = r.get_string();
  m.config_hash = r.get<std::uint64_t>();
  return m;
}

void HelloReply::encode(ByteWriter& w) const {
  w.put(rank);
  w.put_string(role);
  w.put(role_index);
  w.put_string(hostname);
  w.put(pid);
  w.put(threads);
  w.put(config_hash);
}
HelloReply HelloReply::decode(ByteReader& r) {
  HelloReply m;
  m.rank = r.get<std::int32_t>();
  m.role = r.get_string();
  m.role_index = r.get<std::int32_t>();
  m.hostname = r.get_string();
  m.pid = r.get<std::int64_t>();
  m.threads = r.get<std::int32_t>();
  m.config_hash = r.get<std::uint64_t>();
  return m;
}

void Ping::encode(ByteWriter& w) const {
  w.put(sequence);
  w.put(sent_at_s);
}
Ping Ping::decode(ByteReader& r) {
  Ping m;
  m.sequence = r.get<std::uint64_t>();
  m.sent_at_s = r.get<double>();
  return m;
}

void Pong::encode(ByteWriter& w) const {
  w.put(sequence);
  w.put(ping_sent_at_s);
}
Pong Pong::decode(ByteReader& r) {
  Pong m;
  m.sequence = r.get<std::uint64_t>();
  m.ping_sent_at_s = r.get<double>();
  return m;
}

void StopRequest::encode(ByteWriter& w) const { w.put_string(reason); }
StopRequest StopRequest::decode(ByteReader& r) { return StopRequest{r.get_string()}; }

void Stop::encode(ByteWriter& w) const {
  w.put_string(reason);
  w.put_vector(lost);
}

Stop Stop::decode(ByteReader& r) {
  Stop m;
  m.reason = r.get_string();
  m.lost = r.get_vector<std::int32_t>();
  return m;
}

void EndOfJob::encode(ByteWriter& w) const {
  w.put(status);
  w.put<std::uint64_t>(fence.size());
  for (const Fence& f : fence) {
    w.put(f.rank);
    w.put_string(f.host);
    w.put(f.pid);
  }
}

EndOfJob EndOfJob::decode(ByteReader& r) {
  EndOfJob m;
  m.status = r.get<std::int32_t>();
  const auto count = r.get<std::uint64_t>();
  if (count > 1u << 20) throw MessageError("EndOfJob holds " + std::to_string(count) + " fences");
  for (std::uint64_t i = 0; i < count; ++i) {
    Fence f;
    f.rank = r.get<std::int32_t>();
    f.host = r.get_string();
    f.pid = r.get<std::int64_t>();
    m.fence.push_back(std::move(f));
  }
  return m;
}

}  // namespace moerl::runtime
