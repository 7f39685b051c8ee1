#include "moerl/runtime/mailbox.h"

#include <chrono>
#include <sstream>

#include "moerl/core/check.h"
#include "moerl/runtime/backoff.h"
#include "moerl/runtime/mpi_transport.h"

namespace moerl::runtime {

double monotonic_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

namespace {

std::string peer_name(int source) {
  return source == MPI_ANY_SOURCE ? std::string("any rank") : "rank " + std::to_string(source);
}

}  // namespace

Mailbox::Mailbox(MPI_Comm comm, double timeout_s) : Mailbox(std::make_unique<MpiTransport>(comm), timeout_s) {}

Mailbox::Mailbox(std::unique_ptr<Transport> transport, double timeout_s)
    : transport_(std::move(transport)), timeout_s_(timeout_s) {
  rank_ = transport_->rank();
  size_ = transport_->size();
}

MPI_Comm Mailbox::comm() const { return transport_->mpi_comm(); }

void Mailbox::send_frame(int destination, MessageType type, const std::vector<std::uint8_t>& frame) {
  MOERL_CHECK(destination >= 0 && destination < size_, "send of " + std::string(message_type_name(type)) + " to rank " +
                                                           std::to_string(destination) + " outside the world of " +
                                                           std::to_string(size_));
  switch (transport_->send(destination, static_cast<int>(type), frame, timeout_s_)) {
    case SendResult::SendDelivered: return;
    case SendResult::SendPeerLost:
      throw PeerLostError(destination, "rank " + std::to_string(rank_) + ": sending " + message_type_name(type) +
                                           " to rank " + std::to_string(destination) + ": MPI reports that rank dead");
    case SendResult::SendTimedOut: {
      std::ostringstream out;
      out << "rank " << rank_ << ": sending " << message_type_name(type) << " to rank " << destination
          << " did not complete within " << timeout_s_ << " s (is rank " << destination << " alive and receiving?)";
      throw TimeoutError(out.str());
    }
  }
}

std::optional<Envelope> Mailbox::poll_envelope(MessageType type, int source) {
  std::optional<ReceivedFrame> frame = transport_->poll(static_cast<int>(type), source);
  if (!frame) return std::nullopt;
  return unframe_message(frame->bytes, type, frame->source);
}

Envelope Mailbox::receive_envelope(MessageType type, int source, double timeout_s) {
  const double deadline = monotonic_seconds() + timeout_s;
  Backoff backoff;
  for (;;) {
    if (std::optional<Envelope> envelope = poll_envelope(type, source)) return std::move(*envelope);
    if (monotonic_seconds() > deadline) {
      std::ostringstream out;
      out << "rank " << rank_ << ": no " << message_type_name(type) << " message from " << peer_name(source)
          << " within " << timeout_s << " s";
      throw TimeoutError(out.str());
    }
    backoff.pause();
  }
}

}  // namespace moerl::runtime
