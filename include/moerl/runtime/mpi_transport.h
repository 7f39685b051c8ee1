#pragma once
// The Mailbox's transport between processes: non-blocking sends tested
// until a deadline, matched probes (MPI_Improbe + MPI_Mrecv) for receives.
// Under a fault-tolerant MPI a dead destination is SendPeerLost, and a poll
// that meets a failure acknowledges it and goes on (ULFM blocks
// MPI_ANY_SOURCE until then).

#include <map>
#include <mutex>
#include <utility>

#include "moerl/runtime/transport.h"

namespace moerl::runtime {

class MpiTransport : public Transport {
 public:
  // `comm` should be reserved for messages (a dup of the world), so tags
  // never collide with collectives or other libraries.
  explicit MpiTransport(MPI_Comm comm);
  // A process that joined a running job as `rank` of `size` (its own
  // MPI_COMM_WORLD is not the job's): every peer is reached through a route.
  MpiTransport(int rank, int size);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  SendResult send(int destination, int tag, const std::vector<std::uint8_t>& frame, double timeout_s) override;
  std::optional<ReceivedFrame> poll(int tag, int source) override;
  MPI_Comm mpi_comm() const override { return comm_; }
  void route_peer(int rank, MPI_Comm intercomm, int remote_rank) override;
  bool has_route(int rank) const override;
  std::vector<int> failed_peers() const override;

 private:
  struct Route {
    MPI_Comm comm = MPI_COMM_NULL;
    int remote_rank = 0;
  };
  std::optional<Route> route_of(int rank) const;
  std::vector<MPI_Comm> route_comms() const;
  // A frame from `comm` (the job's, or a route's), with its source as a job rank.
  std::optional<ReceivedFrame> poll_comm(MPI_Comm comm, int tag, int source);
  int job_rank_of(MPI_Comm comm, int source) const;

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  mutable std::mutex routes_mutex_;
  std::map<int, Route> routes_;  // job rank -> where it is reached
};

}  // namespace moerl::runtime
