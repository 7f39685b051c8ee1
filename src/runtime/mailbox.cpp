#include "moerl/runtime/mailbox.h"

#include "moerl/core/check.h"
#include "moerl/runtime/fault_tolerance.h"

#include <algorithm>
#include <chrono>
#include <sstream>
#include <thread>

namespace moerl::runtime {

double monotonic_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

namespace {

// Polling with a growing pause: fast answers stay fast, long waits cost
// almost no CPU (ranks share cores with compute threads).
class Backoff {
 public:
  void pause() {
    std::this_thread::sleep_for(std::chrono::microseconds(pause_us_));
    pause_us_ = std::min(pause_us_ * 2, 2000);
  }

 private:
  int pause_us_ = 20;
};

std::string peer_name(int source) {
  return source == MPI_ANY_SOURCE ? std::string("any rank") : "rank " + std::to_string(source);
}

}  // namespace

Mailbox::Mailbox(MPI_Comm comm, double timeout_s) : comm_(comm), timeout_s_(timeout_s) {
  MOERL_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MOERL_MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

void Mailbox::send_frame(int destination, MessageType type, const std::vector<std::uint8_t>& frame) {
  MOERL_CHECK(destination >= 0 && destination < size_, "send of " + std::string(message_type_name(type)) + " to rank " +
                                                           std::to_string(destination) + " outside the world of " +
                                                           std::to_string(size_));
  auto lost = [&] {
    return PeerLostError(destination, "rank " + std::to_string(rank_) + ": sending " + message_type_name(type) +
                                          " to rank " + std::to_string(destination) + ": MPI reports that rank dead");
  };
  MPI_Request request;
  const int posted = MPI_Isend(frame.data(), static_cast<int>(frame.size()), MPI_BYTE, destination,
                               static_cast<int>(type), comm_, &request);
  if (posted != MPI_SUCCESS && is_process_failure(posted)) throw lost();
  MOERL_MPI_CHECK(posted);
  const double deadline = monotonic_seconds() + timeout_s_;
  Backoff backoff;
  for (;;) {
    int done = 0;
    const int tested = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (tested != MPI_SUCCESS && is_process_failure(tested)) throw lost();
    MOERL_MPI_CHECK(tested);
    if (done) return;
    if (monotonic_seconds() > deadline) {
      MPI_Cancel(&request);
      MPI_Request_free(&request);
      std::ostringstream out;
      out << "rank " << rank_ << ": sending " << message_type_name(type) << " to rank " << destination
          << " did not complete within " << timeout_s_ << " s (is rank " << destination << " alive and receiving?)";
      throw TimeoutError(out.str());
    }
    backoff.pause();
  }
}

std::optional<Envelope> Mailbox::receive_matched(MessageType type, MPI_Message& message, const MPI_Status& status) {
  int count = 0;
  MOERL_MPI_CHECK(MPI_Get_count(&status, MPI_BYTE, &count));
  std::vector<std::uint8_t> frame(static_cast<size_t>(count));
  const int received = MPI_Mrecv(frame.data(), count, MPI_BYTE, &message, MPI_STATUS_IGNORE);
  // The sender died after its message was matched but before its bytes came
  // (a large frame waits for the receiver). The matched message is consumed
  // either way, so no later probe finds it again; what it said died with its
  // sender, and the failure detector reports the rank.
  if (received != MPI_SUCCESS && is_process_failure(received)) return std::nullopt;
  MOERL_MPI_CHECK(received);
  return unframe_message(frame, type, status.MPI_SOURCE);
}

// A matched probe (MPI_Improbe + MPI_Mrecv) rather than MPI_Iprobe + MPI_Recv:
// the probed message is taken out of the queue, so neither another thread
// probing the same tag nor a sender that dies mid-transfer can leave a message
// that every later probe finds and no receive can take (a coordinator once
// spun on such a heartbeat and stopped beating).
std::optional<Envelope> Mailbox::poll_envelope(MessageType type, int source) {
  int arrived = 0;
  MPI_Message message = MPI_MESSAGE_NULL;
  MPI_Status status;
  int probed = MPI_Improbe(source, static_cast<int>(type), comm_, &arrived, &message, &status);
  if (probed != MPI_SUCCESS && is_process_failure(probed)) {
    if (source != MPI_ANY_SOURCE) return std::nullopt;  // a dead peer sends nothing more
    acknowledge_failures(comm_);
    probed = MPI_Improbe(source, static_cast<int>(type), comm_, &arrived, &message, &status);
    if (probed != MPI_SUCCESS && is_process_failure(probed)) return std::nullopt;
  }
  MOERL_MPI_CHECK(probed);
  if (!arrived) return std::nullopt;
  return receive_matched(type, message, status);
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
