#pragma once
// The NCCL backend of Communicator (built when MOERL_WITH_CUDA): device
// memory, one CUDA stream of its own. MPI bootstraps it: rank 0 of the group
// creates the NCCL unique id and broadcasts it over the MPI communicator.
// Waits poll the stream and NCCL's asynchronous error state; a timeout aborts
// the NCCL communicator (ncclCommAbort) so no rank stays blocked in a kernel.

#ifdef MOERL_WITH_CUDA

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include "moerl/comm/mpi_communicator.h"

namespace moerl::comm {

class NcclCommunicator : public Communicator {
 public:
  // Collective over `mpi_comm`; `device` is this rank's CUDA device.
  NcclCommunicator(MPI_Comm mpi_comm, int device, std::string name);
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }
  const std::string& name() const override { return name_; }
  int world_rank_of(int member) const override { return world_ranks_.at(static_cast<size_t>(member)); }
  cudaStream_t stream() const { return stream_; }

  std::unique_ptr<CommRequest> broadcast_async(void* data, size_t count, DataType type, int root) override;
  std::unique_ptr<CommRequest> allreduce_sum_async(void* data, size_t count, DataType type) override;
  // Implemented as grouped ncclSend/ncclRecv pairs.
  std::unique_ptr<CommRequest> alltoallv_async(const void* send, const std::vector<size_t>& send_counts,
                                               const std::vector<size_t>& send_displs, void* receive,
                                               const std::vector<size_t>& receive_counts,
                                               const std::vector<size_t>& receive_displs, DataType type) override;
  // An all-reduce of one int on the device.
  std::unique_ptr<CommRequest> barrier_async() override;
  // Failover over NCCL needs ncclCommShrink (NCCL 2.27+) behind the same
  // protocol; until that is built a lost member ends the job for a restart.
  void interrupt() override;
  std::unique_ptr<Communicator> survivors() override;

 private:
  std::unique_ptr<CommRequest> after_launch(std::string what);

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  int device_ = 0;
  int rank_ = 0;
  int size_ = 1;
  std::string name_;
  std::vector<int> world_ranks_;
  int* barrier_scratch_ = nullptr;  // one device int for barrier_async
};

}  // namespace moerl::comm

#endif  // MOERL_WITH_CUDA
