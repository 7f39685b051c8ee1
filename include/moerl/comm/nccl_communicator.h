#pragma once
// The NCCL backend of Communicator (built when MOERL_WITH_CUDA): one CUDA
// stream of its own. MPI bootstraps it: rank 0 of the group creates the NCCL
// unique id and broadcasts it over the MPI communicator. Waits poll the
// stream and NCCL's asynchronous error state.
//
// Memory: device buffers go to NCCL as they are. Host buffers (the weight-sync
// protocol stages and checksums on the host) are copied into a device buffer
// of the request's own (stream-ordered cudaMallocAsync, never cudaMalloc,
// which can wait for the whole device), and copied back out when the request
// is found complete. The copy-out happens in test(), not on the stream: a
// device-to-pageable copy queued behind a collective whose peers have not
// joined yet would block the launching thread.
//
// Nothing stays posted here between exchanges: a pending NCCL collective is
// a kernel spinning on the GPU, and a rank whose next kernel must first be
// loaded (CUDA loads modules lazily, and loading may wait for the whole
// device) would wait for that kernel, i.e. for its peers. Messages that wait
// for the next event (the weight sync's header) go over control(), an MPI
// twin of the group. (The first GPU run stalled exactly so: the actor's
// header broadcast, posted over NCCL, held its first decode step.)
//
// Ordering: the stream is non-blocking, so a collective posted here never
// holds up LibTorch's work on the default stream (a pending header broadcast
// would otherwise stall every decode step). Each launch first waits on an
// event recorded on the legacy default stream, where LibTorch computes
// unless told otherwise, so a device buffer is read only after its producer
// wrote it. Consumers wait on the request (host side) before reading.
//
// Failure: a request dropped before it completed (a CommTimeout, a peer that
// never joined) marks the communicator abandoned, and its destructor then
// aborts the NCCL communicator (ncclCommAbort) rather than ncclCommDestroy,
// which would wait for the stuck kernel.
//
// NCCL refuses two ranks of one communicator on the same GPU ("Duplicate GPU
// detected"); comm/group_backend.h decides, from every member's host and
// device, whether a group can use NCCL at all.

#ifdef MOERL_WITH_CUDA

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <memory>

#include "moerl/comm/mpi_communicator.h"

namespace moerl::comm {

struct NcclShared;  // nccl_communicator.cpp: what the communicator shares with its requests

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
  // An MPI communicator over the same members (see Communicator::control).
  Communicator& control() override { return *control_; }
  // Failover over NCCL needs ncclCommShrink (NCCL 2.27+) behind the same
  // protocol; until that is built a lost member ends the job for a restart.
  void interrupt() override;
  std::unique_ptr<Communicator> survivors() override;

 private:
  // A host buffer's device copy for the duration of one request (all null
  // for a device buffer, which NCCL reads and writes directly).
  struct Staging {
    void* host = nullptr;
    void* device = nullptr;
    size_t bytes = 0;
    bool copy_out = false;  // the collective writes the buffer: copy it back on completion
  };
  // The pointer NCCL gets for `data`: itself, or its staging copy.
  static void* nccl_pointer(void* data, const Staging& staging) { return staging.device ? staging.device : data; }
  Staging stage_in(void* data, size_t bytes, bool copy_in);
  std::unique_ptr<CommRequest> after_launch(std::string what, Staging staging);
  void wait_for_default_stream();

  std::shared_ptr<NcclShared> shared_;  // comm, streams, abandoned flag: shared with requests
  cudaStream_t stream_ = nullptr;
  cudaEvent_t producer_done_ = nullptr;  // recorded on the default stream before each launch
  int device_ = 0;
  int rank_ = 0;
  int size_ = 1;
  std::string name_;
  std::vector<int> world_ranks_;
  int* barrier_scratch_ = nullptr;  // one device int for barrier_async
  std::unique_ptr<MpiCommunicator> control_;
};

}  // namespace moerl::comm

#endif  // MOERL_WITH_CUDA
