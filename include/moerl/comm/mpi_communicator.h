#pragma once
// The MPI backend of Communicator: host memory, non-blocking MPI collectives
// (MPI_Ibcast, MPI_Iallreduce, MPI_Ialltoallv, MPI_Ibarrier) completed by
// MPI_Test polling, so waits can time out.

#include <mpi.h>

#include <memory>
#include <vector>

#include "moerl/comm/communicator.h"
#include "moerl/comm/stall_inspector.h"

namespace moerl::comm {

// Every member's rank in MPI_COMM_WORLD, in the order of `comm` (local, not collective).
std::vector<int> world_ranks_of_members(MPI_Comm comm);

class MpiCommunicator : public Communicator {
 public:
  // Duplicates `comm`: our collectives never match someone else's.
  MpiCommunicator(MPI_Comm comm, std::string name);
  // Takes `owned` (a fresh communicator, e.g. from a shrink) without duplicating it.
  static std::unique_ptr<MpiCommunicator> adopt(MPI_Comm owned, std::string name);
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }
  const std::string& name() const override { return name_; }
  int world_rank_of(int member) const override { return world_ranks_.at(static_cast<size_t>(member)); }

  std::unique_ptr<CommRequest> broadcast_async(void* data, size_t count, DataType type, int root) override;
  std::unique_ptr<CommRequest> allreduce_sum_async(void* data, size_t count, DataType type) override;
  std::unique_ptr<CommRequest> alltoallv_async(const void* send, const std::vector<size_t>& send_counts,
                                               const std::vector<size_t>& send_displs, void* receive,
                                               const std::vector<size_t>& receive_counts,
                                               const std::vector<size_t>& receive_displs, DataType type) override;
  std::unique_ptr<CommRequest> barrier_async() override;
  // ULFM: MPIX_Comm_revoke, and MPIX_Comm_shrink into a new group.
  void interrupt() override;
  std::unique_ptr<Communicator> survivors() override;

  MPI_Comm comm() const { return comm_; }

 private:
  struct Adopt {};
  MpiCommunicator(Adopt, MPI_Comm owned, std::string name);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::string name_;
  std::vector<int> world_ranks_;
  // Shared with the requests, which may outlive the communicator (abandoned ones).
  std::shared_ptr<StallInspector> inspector_;
};

}  // namespace moerl::comm
