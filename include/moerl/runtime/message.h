#pragma once
// The typed point-to-point messages between roles. A message on the wire is a
// fixed 24-byte header followed by the payload:
//
//   offset size field
//        0    4 magic 0x4C52454D ("MERL")
//        4    2 wire format version (kWireVersion)
//        6    2 message type (MessageType), also used as the MPI tag
//        8    8 payload length in bytes
//       16    4 CRC-32 of the payload
//       20    4 sender's world rank
//
// A receiver validates all six fields against what MPI reports before it
// decodes a payload; any mismatch is a MessageError naming the sender and type.

#include <cstdint>
#include <string>
#include <vector>

#include "moerl/runtime/wire.h"

namespace moerl::runtime {

constexpr std::uint32_t kWireMagic = 0x4C52454D;
constexpr std::uint16_t kWireVersion = 1;
constexpr size_t kHeaderBytes = 24;
// Upper bound on one payload; larger data (weights) goes through collectives.
constexpr std::uint64_t kMaxPayloadBytes = std::uint64_t{1} << 30;

// Message types; values are stable wire identifiers (append, never renumber).
enum class MessageType : std::uint16_t {
  Hello = 1,       // learner 0 -> every rank: the run, its plan
  HelloReply = 2,  // every rank -> learner 0: who and where it is
  Ping = 3,        // any -> any: liveness and latency
  Pong = 4,
  MetricsReport = 5,          // every rank -> learner 0: a metrics snapshot
  StopRequest = 6,            // any rank -> learner 0: a signal or error asks the job to stop
  Stop = 7,                   // learner 0 -> every rank: stop cleanly now
  EnvRequest = 8,             // actor -> env worker: open/step/close/snapshot/restore a session
  EnvReply = 9,               // env worker -> actor
  EnvCapacity = 10,           // learner 0 -> env worker: change the live-session limit
  WorkRequest = 11,           // actor -> learner 0: room for more episodes
  TaskAssignment = 12,        // learner 0 -> actor: task groups to run (or: no more work)
  Trajectory = 13,            // actor -> learner: one finished episode
  Heartbeat = 14,             // every rank -> learner 0: alive, what it holds, how loaded
  CoordinatorBeat = 15,       // learner 0 -> every rank: learner 0 is alive; the step the job is at
  RankLost = 16,              // learner 0 -> every rank: a rank was declared lost
  GroupsCancelled = 17,       // learner 0 -> a learner: groups whose episodes will not all come
  EnvSessionsMoved = 18,      // (reserved)
  JobAbort = 19,              // any rank -> every rank: a fatal error ends the job (fault-tolerant MPI only)
  GroupsCancelledReply = 20,  // a learner -> learner 0: which of the groups it cancelled
  FailoverReport = 21,        // an actor -> learner 0: what it moved or restarted after a loss
  EndOfJob = 22,              // every rank -> learner 0 and back: the handshake before MPI_Finalize
  EnvReleaseRequest = 23,     // an env worker -> learner 0: a SIGTERM asks to take it out of the job
  EnvReleaseReply = 24,       // learner 0 -> that env worker: released, or why not
  EnvJoinStart = 25,          // learner 0 -> actors: spawn a new env worker in a gone one's rank, together
  RankRejoined = 26,          // learner 0 -> every rank: a gone env worker's rank lives again (a new process)
};
constexpr std::uint16_t kMaxMessageType = 26;

const char* message_type_name(MessageType type);
bool is_known_message_type(std::uint16_t value);

// A message that failed validation. source() is the MPI rank it came from
// (-1 when unknown), so that a receiver can count bad messages per sender.
class MessageError : public Error {
 public:
  explicit MessageError(const std::string& what, int source = -1) : Error(what), source_(source) {}
  int source() const { return source_; }

 private:
  int source_;
};

// A validated message: its type, sender and payload bytes.
struct Envelope {
  MessageType type{};
  int source = -1;
  std::vector<std::uint8_t> payload;
};

// Frames a payload with the header above.
std::vector<std::uint8_t> frame_message(MessageType type, int sender_rank, const std::vector<std::uint8_t>& payload);

// Checks a received frame against the type (tag) and source MPI reported;
// throws MessageError describing the first mismatch.
Envelope unframe_message(const std::vector<std::uint8_t>& frame, MessageType expected_type, int mpi_source);

// Typed messages: each has kType, encode(ByteWriter&) and static decode(ByteReader&).
struct Hello {
  static constexpr MessageType kType = MessageType::Hello;
  std::string run_name;
  std::uint64_t config_hash = 0;  // every rank must have loaded the same configuration
  void encode(ByteWriter& w) const;
  static Hello decode(ByteReader& r);
};

struct HelloReply {
  static constexpr MessageType kType = MessageType::HelloReply;
  std::int32_t rank = -1;
  std::string role;
  std::int32_t role_index = -1;
  std::string hostname;
  std::int64_t pid = 0;
  std::int32_t threads = 0;
  std::uint64_t config_hash = 0;
  void encode(ByteWriter& w) const;
  static HelloReply decode(ByteReader& r);
};

struct Ping {
  static constexpr MessageType kType = MessageType::Ping;
  std::uint64_t sequence = 0;
  double sent_at_s = 0;  // sender's monotonic clock, echoed back in the Pong
  void encode(ByteWriter& w) const;
  static Ping decode(ByteReader& r);
};

struct Pong {
  static constexpr MessageType kType = MessageType::Pong;
  std::uint64_t sequence = 0;
  double ping_sent_at_s = 0;
  void encode(ByteWriter& w) const;
  static Pong decode(ByteReader& r);
};

struct StopRequest {
  static constexpr MessageType kType = MessageType::StopRequest;
  std::string reason;
  void encode(ByteWriter& w) const;
  static StopRequest decode(ByteReader& r);
};

struct EndOfJob {
  static constexpr MessageType kType = MessageType::EndOfJob;
  std::int32_t status = 0;  // the sender's exit status
  // Learner 0's answer: processes of ranks that never arrived (frozen), which
  // every rank on their host SIGKILLs before it finalizes.
  struct Fence {
    std::int32_t rank = -1;
    std::string host;
    std::int64_t pid = 0;
  };
  std::vector<Fence> fence;
  void encode(ByteWriter& w) const;
  static EndOfJob decode(ByteReader& r);
};

struct Stop {
  static constexpr MessageType kType = MessageType::Stop;
  std::string reason;
  // The ranks learner 0 declared lost: the end of the job waits for the others only.
  std::vector<std::int32_t> lost;
  void encode(ByteWriter& w) const;
  static Stop decode(ByteReader& r);
};

}  // namespace moerl::runtime
