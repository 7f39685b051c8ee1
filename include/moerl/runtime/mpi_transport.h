#pragma once
// The Mailbox's transport between processes: non-blocking sends tested
// until a deadline, matched probes (MPI_Improbe + MPI_Mrecv) for receives.
// Under a fault-tolerant MPI a dead destination is SendPeerLost, and a poll
// that meets a failure acknowledges it and goes on (ULFM blocks
// MPI_ANY_SOURCE until then).

#include "moerl/runtime/transport.h"

namespace moerl::runtime {

class MpiTransport : public Transport {
 public:
  // `comm` should be reserved for messages (a dup of the world), so tags
  // never collide with collectives or other libraries.
  explicit MpiTransport(MPI_Comm comm);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  SendResult send(int destination, int tag, const std::vector<std::uint8_t>& frame, double timeout_s) override;
  std::optional<ReceivedFrame> poll(int tag, int source) override;
  MPI_Comm mpi_comm() const override { return comm_; }

 private:
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace moerl::runtime
