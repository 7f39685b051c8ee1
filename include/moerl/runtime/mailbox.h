#pragma once
// Typed point-to-point messaging, over MPI (MpiTransport) or, in tests, over
// queues between threads (runtime/in_process_transport.h). The message type is the tag,
// so a receiver waits for exactly the type it expects; every frame is
// validated (unframe_message) and every payload decoded exactly before use.
// Every wait has a timeout that ends in a TimeoutError naming the peer.
//
// Under a fault-tolerant MPI a dead peer is not an error here: a poll for
// messages from it finds none, a poll from any rank acknowledges the failure
// (ULFM blocks MPI_ANY_SOURCE until then) and goes on, and a send to it throws
// PeerLostError. Who died is the coordinator's business (heartbeats).

#include <mpi.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "moerl/runtime/message.h"
#include "moerl/runtime/transport.h"

namespace moerl::runtime {

class TimeoutError : public Error {
 public:
  using Error::Error;
};

// A send to a rank that MPI reports dead (fault-tolerant MPI only; without
// it the job is gone before anyone could see this).
class PeerLostError : public Error {
 public:
  PeerLostError(int rank, const std::string& what) : Error(what), rank_(rank) {}
  int rank() const { return rank_; }

 private:
  int rank_;
};

class Mailbox {
 public:
  // `comm` should be a communicator reserved for messages (a dup of the
  // world), so tags never collide with collectives or other libraries.
  Mailbox(MPI_Comm comm, double timeout_s);
  Mailbox(std::unique_ptr<Transport> transport, double timeout_s);

  int rank() const { return rank_; }
  MPI_Comm comm() const;  // MPI_COMM_NULL over a transport without MPI
  // A rank outside comm(), reached through an intercommunicator (Transport::route_peer).
  void route_peer(int rank, MPI_Comm intercomm, int remote_rank) {
    transport_->route_peer(rank, intercomm, remote_rank);
  }
  bool has_route(int rank) const { return transport_->has_route(rank); }
  // Ranks MPI reports dead (Transport::failed_peers).
  std::vector<int> failed_peers() const { return transport_->failed_peers(); }
  int size() const { return size_; }
  double timeout_s() const { return timeout_s_; }

  template <typename M>
  void send(int destination, const M& message) {
    ByteWriter w;
    message.encode(w);
    send_frame(destination, M::kType, frame_message(M::kType, rank_, w.bytes()));
  }

  // Waits for a message of type M from `source` (MPI_ANY_SOURCE for anyone).
  template <typename M>
  std::pair<int, M> receive(int source, std::optional<double> timeout_s = std::nullopt) {
    Envelope envelope = receive_envelope(M::kType, source, timeout_s.value_or(timeout_s_));
    return {envelope.source, decode<M>(envelope)};
  }

  // A message of type M if one has arrived, without waiting.
  template <typename M>
  std::optional<std::pair<int, M>> try_receive(int source = MPI_ANY_SOURCE) {
    std::optional<Envelope> envelope = poll_envelope(M::kType, source);
    if (!envelope) return std::nullopt;
    return std::make_pair(envelope->source, decode<M>(*envelope));
  }

  Envelope receive_envelope(MessageType type, int source, double timeout_s);
  std::optional<Envelope> poll_envelope(MessageType type, int source);

  // Sends already-framed bytes under the tag of `type`; waits at most the
  // timeout for the send to complete. Public so tests can send bad frames.
  void send_frame(int destination, MessageType type, const std::vector<std::uint8_t>& frame);

 private:
  template <typename M>
  M decode(const Envelope& envelope) {
    try {
      ByteReader r(envelope.payload);
      M message = M::decode(r);
      r.expect_end();
      return message;
    } catch (const WireError& error) {
      throw MessageError(std::string("malformed ") + message_type_name(M::kType) + " message from rank " +
                             std::to_string(envelope.source) + ": " + error.what(),
                         envelope.source);
    }
  }
  std::unique_ptr<Transport> transport_;
  int rank_ = 0;
  int size_ = 1;
  double timeout_s_;
};

// Seconds on a monotonic clock (for timeouts and latencies).
double monotonic_seconds();

}  // namespace moerl::runtime
