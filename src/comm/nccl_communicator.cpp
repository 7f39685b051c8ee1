// Compiled only when MOERL_WITH_CUDA (see src/CMakeLists.txt).
#include "moerl/comm/nccl_communicator.h"

#include "moerl/core/check.h"

#ifdef MOERL_WITH_CUDA

#include <algorithm>

namespace moerl::comm {

// What outlives a request's launch: the NCCL communicator, the stream the
// staging copies go back on, and whether any request was dropped unfinished.
struct NcclShared {
  ncclComm_t comm = nullptr;
  cudaStream_t copy_stream = nullptr;  // staging copies out (apart from the collectives' stream)
  bool abandoned = false;
  std::shared_ptr<StallInspector> inspector;  // which members a timed-out request lacks
};

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

bool is_device_memory(const void* data) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, data) != cudaSuccess) {
    cudaGetLastError();  // unregistered host memory on older runtimes: clear the sticky error
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

// The extent of a displaced layout, in bytes.
size_t extent_bytes(const std::vector<size_t>& counts, const std::vector<size_t>& displs, size_t element) {
  size_t end = 0;
  for (size_t p = 0; p < counts.size(); ++p)
    if (counts[p]) end = std::max(end, (displs[p] + counts[p]) * element);
  return end;
}

// Complete when the stream has passed the recorded event; a pending NCCL
// error (a peer died) is raised instead of waiting for ever. On completion a
// staged host buffer gets its bytes back.
class NcclRequest : public CommRequest {
 public:
  NcclRequest(std::shared_ptr<NcclShared> shared, cudaStream_t stream, std::string what, void* host, void* device,
              size_t bytes, bool copy_out)
      : shared_(std::move(shared)),
        what_(std::move(what)),
        host_(host),
        device_(device),
        bytes_(bytes),
        copy_out_(copy_out),
        number_(shared_->inspector->started(what_)) {
    MOERL_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    MOERL_CUDA_CHECK(cudaEventRecord(event_, stream));
  }
  ~NcclRequest() override {
    if (!done_) shared_->abandoned = true;
    // A staging buffer of an unfinished collective is left to the abort.
    if (done_ && device_) cudaFreeAsync(device_, shared_->copy_stream);
    cudaEventDestroy(event_);
  }
  bool test() override {
    if (done_) return true;
    shared_->inspector->answer_questions();
    const cudaError_t status = cudaEventQuery(event_);
    if (status == cudaErrorNotReady) {
      ncclResult_t async_error = ncclSuccess;
      MOERL_NCCL_CHECK(ncclCommGetAsyncError(shared_->comm, &async_error));
      check_async_nccl(async_error, what_);
      return false;
    }
    if (status != cudaSuccess)
      throw_backend_failure(__FILE__, __LINE__, "CUDA", "cudaEventQuery", cudaGetErrorString(status));
    if (copy_out_) {
      MOERL_CUDA_CHECK(cudaMemcpyAsync(host_, device_, bytes_, cudaMemcpyDeviceToHost, shared_->copy_stream));
      MOERL_CUDA_CHECK(cudaStreamSynchronize(shared_->copy_stream));
    }
    done_ = true;
    shared_->inspector->finished(number_);
    return true;
  }
  std::string describe() const override { return what_; }
  std::string missing_members(double grace_s) override { return shared_->inspector->missing_from(number_, grace_s); }

 private:
  std::shared_ptr<NcclShared> shared_;
  cudaEvent_t event_ = nullptr;
  std::string what_;
  void* host_;
  void* device_;
  size_t bytes_;
  bool copy_out_;
  std::int64_t number_;
  bool done_ = false;
};

}  // namespace

NcclCommunicator::NcclCommunicator(MPI_Comm mpi_comm, int device, std::string name)
    : shared_(std::make_shared<NcclShared>()), device_(device), name_(std::move(name)) {
  MOERL_MPI_CHECK(MPI_Comm_rank(mpi_comm, &rank_));
  MOERL_MPI_CHECK(MPI_Comm_size(mpi_comm, &size_));
  world_ranks_ = world_ranks_of_members(mpi_comm);
  shared_->inspector = std::make_shared<StallInspector>(mpi_comm, world_ranks_);
  ncclUniqueId id;
  if (rank_ == 0) MOERL_NCCL_CHECK(ncclGetUniqueId(&id));
  MOERL_MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, mpi_comm));
  MOERL_CUDA_CHECK(cudaSetDevice(device_));
  MOERL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  MOERL_CUDA_CHECK(cudaStreamCreateWithFlags(&shared_->copy_stream, cudaStreamNonBlocking));
  MOERL_CUDA_CHECK(cudaEventCreateWithFlags(&producer_done_, cudaEventDisableTiming));
  MOERL_NCCL_CHECK(ncclCommInitRank(&shared_->comm, size_, id, rank_));
  MOERL_CUDA_CHECK(cudaMalloc(&barrier_scratch_, sizeof(int)));
  control_ = std::make_unique<MpiCommunicator>(mpi_comm, name_ + " (control messages over MPI)");
}

NcclCommunicator::~NcclCommunicator() {
  if (shared_->comm) {
    // Destroy waits for outstanding work; a dropped request's kernel may never end.
    if (shared_->abandoned) {
      ncclCommAbort(shared_->comm);
    } else {
      ncclCommDestroy(shared_->comm);
    }
  }
  if (barrier_scratch_) cudaFree(barrier_scratch_);
  if (producer_done_) cudaEventDestroy(producer_done_);
  if (stream_) cudaStreamDestroy(stream_);
  // copy_stream stays with shared_: requests that outlive us free their staging on it.
}

void NcclCommunicator::wait_for_default_stream() {
  MOERL_CUDA_CHECK(cudaSetDevice(device_));
  MOERL_CUDA_CHECK(cudaEventRecord(producer_done_, cudaStreamLegacy));
  MOERL_CUDA_CHECK(cudaStreamWaitEvent(stream_, producer_done_, 0));
}

NcclCommunicator::Staging NcclCommunicator::stage_in(void* data, size_t bytes, bool copy_in) {
  Staging staging;
  if (bytes == 0 || is_device_memory(data)) return staging;
  staging.host = data;
  staging.bytes = bytes;
  MOERL_CUDA_CHECK(cudaMallocAsync(&staging.device, bytes, stream_));
  if (copy_in) MOERL_CUDA_CHECK(cudaMemcpyAsync(staging.device, data, bytes, cudaMemcpyHostToDevice, stream_));
  return staging;
}

std::unique_ptr<CommRequest> NcclCommunicator::after_launch(std::string what, Staging staging) {
  return std::make_unique<NcclRequest>(shared_, stream_, std::move(what) + " in " + name_, staging.host, staging.device,
                                       staging.bytes, staging.copy_out && staging.device);
}

std::unique_ptr<CommRequest> NcclCommunicator::broadcast_async(void* data, size_t count, DataType type, int root) {
  wait_for_default_stream();
  Staging staging = stage_in(data, count * element_size(type), /*copy_in=*/rank_ == root);
  staging.copy_out = rank_ != root;
  void* buffer = nccl_pointer(data, staging);
  MOERL_NCCL_CHECK(ncclBroadcast(buffer, buffer, count, nccl_type(type), root, shared_->comm, stream_));
  return after_launch("NCCL broadcast of " + std::to_string(count) + " " + data_type_name(type), staging);
}

std::unique_ptr<CommRequest> NcclCommunicator::allreduce_sum_async(void* data, size_t count, DataType type) {
  wait_for_default_stream();
  Staging staging = stage_in(data, count * element_size(type), /*copy_in=*/true);
  staging.copy_out = true;
  void* buffer = nccl_pointer(data, staging);
  MOERL_NCCL_CHECK(ncclAllReduce(buffer, buffer, count, nccl_type(type), ncclSum, shared_->comm, stream_));
  return after_launch("NCCL all-reduce of " + std::to_string(count) + " " + data_type_name(type), staging);
}

std::unique_ptr<CommRequest> NcclCommunicator::alltoallv_async(const void* send, const std::vector<size_t>& send_counts,
                                                               const std::vector<size_t>& send_displs, void* receive,
                                                               const std::vector<size_t>& receive_counts,
                                                               const std::vector<size_t>& receive_displs,
                                                               DataType type) {
  const size_t element = element_size(type);
  const bool host_send = send && !is_device_memory(send);
  const bool host_receive = receive && !is_device_memory(receive);
  MOERL_CHECK(host_send == host_receive,
              name_ + ": an all-to-all-v over NCCL needs both buffers on the host or both on the device");
  wait_for_default_stream();
  // The send side's staging copy is freed with the receive side's request.
  Staging send_staging = stage_in(const_cast<void*>(send), extent_bytes(send_counts, send_displs, element), true);
  Staging staging = stage_in(receive, extent_bytes(receive_counts, receive_displs, element), false);
  staging.copy_out = true;
  const char* send_base = static_cast<const char*>(nccl_pointer(const_cast<void*>(send), send_staging));
  char* receive_base = static_cast<char*>(nccl_pointer(receive, staging));
  MOERL_NCCL_CHECK(ncclGroupStart());
  for (int peer = 0; peer < size_; ++peer) {
    const auto p = static_cast<size_t>(peer);
    if (send_counts[p])
      MOERL_NCCL_CHECK(ncclSend(send_base + send_displs[p] * element, send_counts[p], nccl_type(type), peer,
                                shared_->comm, stream_));
    if (receive_counts[p])
      MOERL_NCCL_CHECK(ncclRecv(receive_base + receive_displs[p] * element, receive_counts[p], nccl_type(type), peer,
                                shared_->comm, stream_));
  }
  MOERL_NCCL_CHECK(ncclGroupEnd());
  if (send_staging.device) MOERL_CUDA_CHECK(cudaFreeAsync(send_staging.device, stream_));
  return after_launch(std::string("NCCL all-to-all-v of ") + data_type_name(type), staging);
}

std::unique_ptr<CommRequest> NcclCommunicator::barrier_async() {
  MOERL_NCCL_CHECK(ncclAllReduce(barrier_scratch_, barrier_scratch_, 1, ncclInt32, ncclSum, shared_->comm, stream_));
  return after_launch("NCCL barrier", Staging{});
}

void NcclCommunicator::interrupt() {
  throw Error(name_ + ": the NCCL backend cannot go on without a lost member yet (the job stops for a restart)");
}

std::unique_ptr<Communicator> NcclCommunicator::survivors() {
  throw Error(name_ + ": the NCCL backend cannot go on without a lost member yet (the job stops for a restart)");
}

}  // namespace moerl::comm

#endif  // MOERL_WITH_CUDA
