// Compiled only when MOERL_WITH_CUDA (see src/CMakeLists.txt).
#include "moerl/comm/nccl_communicator.h"

#include "moerl/core/check.h"

#ifdef MOERL_WITH_CUDA

namespace moerl::comm {
namespace {

// A NCCL error found after the call that caused it (ncclCommGetAsyncError).
void check_async_nccl(ncclResult_t status, const std::string& operation) {
  if (status == ncclSuccess) return;
  const bool peer = status == ncclSystemError || status == ncclRemoteError;
  throw_backend_failure(__FILE__, __LINE__, "NCCL", operation, ncclGetErrorString(status), peer ? kNcclDebugHint : "");
}

ncclDataType_t nccl_type(DataType type) {
  switch (type) {
    case DataType::Float32: return ncclFloat32;
    case DataType::Float64: return ncclFloat64;
    case DataType::Int64: return ncclInt64;
    case DataType::Byte: return ncclUint8;
  }
  return ncclUint8;
}

// Complete when the stream has passed the recorded event; a pending NCCL
// error (a peer died) is raised instead of waiting for ever.
class NcclRequest : public CommRequest {
 public:
  NcclRequest(ncclComm_t comm, cudaStream_t stream, std::string what) : comm_(comm), what_(std::move(what)) {
    MOERL_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    MOERL_CUDA_CHECK(cudaEventRecord(event_, stream));
  }
  ~NcclRequest() override { cudaEventDestroy(event_); }
  bool test() override {
    const cudaError_t status = cudaEventQuery(event_);
    if (status == cudaSuccess) return true;
    if (status != cudaErrorNotReady)
      throw_backend_failure(__FILE__, __LINE__, "CUDA", "cudaEventQuery", cudaGetErrorString(status));
    ncclResult_t async_error = ncclSuccess;
    MOERL_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async_error));
    check_async_nccl(async_error, what_);
    return false;
  }
  std::string describe() const override { return what_; }

 private:
  ncclComm_t comm_;
  cudaEvent_t event_ = nullptr;
  std::string what_;
};

}  // namespace

NcclCommunicator::NcclCommunicator(MPI_Comm mpi_comm, int device, std::string name)
    : device_(device), name_(std::move(name)) {
  MOERL_MPI_CHECK(MPI_Comm_rank(mpi_comm, &rank_));
  MOERL_MPI_CHECK(MPI_Comm_size(mpi_comm, &size_));
  world_ranks_ = world_ranks_of_members(mpi_comm);
  ncclUniqueId id;
  if (rank_ == 0) MOERL_NCCL_CHECK(ncclGetUniqueId(&id));
  MOERL_MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, mpi_comm));
  MOERL_CUDA_CHECK(cudaSetDevice(device_));
  MOERL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  MOERL_NCCL_CHECK(ncclCommInitRank(&comm_, size_, id, rank_));
  MOERL_CUDA_CHECK(cudaMalloc(&barrier_scratch_, sizeof(int)));
}

NcclCommunicator::~NcclCommunicator() {
  if (barrier_scratch_) cudaFree(barrier_scratch_);
  if (comm_) ncclCommDestroy(comm_);
  if (stream_) cudaStreamDestroy(stream_);
}

std::unique_ptr<CommRequest> NcclCommunicator::after_launch(std::string what) {
  return std::make_unique<NcclRequest>(comm_, stream_, std::move(what) + " in " + name_);
}

std::unique_ptr<CommRequest> NcclCommunicator::broadcast_async(void* data, size_t count, DataType type, int root) {
  MOERL_NCCL_CHECK(ncclBroadcast(data, data, count, nccl_type(type), root, comm_, stream_));
  return after_launch("NCCL broadcast of " + std::to_string(count) + " " + data_type_name(type));
}

std::unique_ptr<CommRequest> NcclCommunicator::allreduce_sum_async(void* data, size_t count, DataType type) {
  MOERL_NCCL_CHECK(ncclAllReduce(data, data, count, nccl_type(type), ncclSum, comm_, stream_));
  return after_launch("NCCL all-reduce of " + std::to_string(count) + " " + data_type_name(type));
}

std::unique_ptr<CommRequest> NcclCommunicator::alltoallv_async(const void* send, const std::vector<size_t>& send_counts,
                                                               const std::vector<size_t>& send_displs, void* receive,
                                                               const std::vector<size_t>& receive_counts,
                                                               const std::vector<size_t>& receive_displs,
                                                               DataType type) {
  const size_t element = element_size(type);
  MOERL_NCCL_CHECK(ncclGroupStart());
  for (int peer = 0; peer < size_; ++peer) {
    const auto p = static_cast<size_t>(peer);
    if (send_counts[p])
      MOERL_NCCL_CHECK(ncclSend(static_cast<const char*>(send) + send_displs[p] * element, send_counts[p],
                                nccl_type(type), peer, comm_, stream_));
    if (receive_counts[p])
      MOERL_NCCL_CHECK(ncclRecv(static_cast<char*>(receive) + receive_displs[p] * element, receive_counts[p],
                                nccl_type(type), peer, comm_, stream_));
  }
  MOERL_NCCL_CHECK(ncclGroupEnd());
  return after_launch(std::string("NCCL all-to-all-v of ") + data_type_name(type));
}

std::unique_ptr<CommRequest> NcclCommunicator::barrier_async() {
  MOERL_NCCL_CHECK(ncclAllReduce(barrier_scratch_, barrier_scratch_, 1, ncclInt32, ncclSum, comm_, stream_));
  return after_launch("NCCL barrier");
}

void NcclCommunicator::interrupt() {
  throw Error(name_ + ": the NCCL backend cannot go on without a lost member yet (the job stops for a restart)");
}

std::unique_ptr<Communicator> NcclCommunicator::survivors() {
  throw Error(name_ + ": the NCCL backend cannot go on without a lost member yet (the job stops for a restart)");
}

}  // namespace moerl::comm

#endif  // MOERL_WITH_CUDA
