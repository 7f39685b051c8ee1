#include "moerl/comm/mpi_communicator.h"

#include <climits>

#include "moerl/core/check.h"
#include "moerl/runtime/fault_tolerance.h"

namespace moerl::comm {
namespace {

MPI_Datatype mpi_type(DataType type) {
  switch (type) {
    case DataType::Float32: return MPI_FLOAT;
    case DataType::Float64: return MPI_DOUBLE;
    case DataType::Int64: return MPI_INT64_T;
    case DataType::Byte: return MPI_BYTE;
  }
  return MPI_BYTE;
}

// Like MOERL_MPI_CHECK, but a dead peer (ULFM) is a PeerFailure the caller recovers from.
void check_call(int code, const char* call, const std::string& group) {
  if (code == MPI_SUCCESS) return;
  if (runtime::is_process_failure(code))
    throw PeerFailure(std::string(call) + " in " + group +
                      ": a member of the group died (MPI reports a process failure)");
  MOERL_MPI_CHECK(code);
}

int checked_count(size_t count, const char* operation) {
  // MPI counts are int; larger transfers are split by the callers (buckets).
  MOERL_CHECK(count <= static_cast<size_t>(INT_MAX),
              std::string(operation) + " of " + std::to_string(count) + " elements exceeds MPI's int count");
  return static_cast<int>(count);
}

class MpiRequest : public CommRequest {
 public:
  MpiRequest(std::string what, std::shared_ptr<StallInspector> inspector)
      : what_(std::move(what)), inspector_(std::move(inspector)), number_(inspector_->started(what_)) {}
  // An abandoned (timed-out) collective can be neither cancelled nor freed
  // in MPI; the job is being stopped by then, so its handle is left behind.
  ~MpiRequest() override = default;
  bool test() override {
    if (done_) return true;
    inspector_->answer_questions();
    int flag = 0;
    check_call(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE), "MPI_Test", what_);
    done_ = flag != 0;
    if (done_) inspector_->finished(number_);
    return done_;
  }
  std::string describe() const override { return what_; }
  std::string missing_members(double grace_s) override { return inspector_->missing_from(number_, grace_s); }
  MPI_Request* handle() { return &request_; }

 private:
  std::string what_;
  std::shared_ptr<StallInspector> inspector_;
  std::int64_t number_;
  MPI_Request request_ = MPI_REQUEST_NULL;
  bool done_ = false;
};

}  // namespace

std::vector<int> world_ranks_of_members(MPI_Comm comm) {
  MPI_Group group = MPI_GROUP_NULL;
  MPI_Group world = MPI_GROUP_NULL;
  MOERL_MPI_CHECK(MPI_Comm_group(comm, &group));
  MOERL_MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world));
  int size = 0;
  MOERL_MPI_CHECK(MPI_Group_size(group, &size));
  std::vector<int> members(static_cast<size_t>(size));
  for (int i = 0; i < size; ++i) members[static_cast<size_t>(i)] = i;
  std::vector<int> world_ranks(members.size());
  MOERL_MPI_CHECK(MPI_Group_translate_ranks(group, size, members.data(), world, world_ranks.data()));
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  return world_ranks;
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name) : name_(std::move(name)) {
  MOERL_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  MOERL_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MOERL_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  world_ranks_ = world_ranks_of_members(comm_);
  inspector_ = std::make_shared<StallInspector>(comm_, world_ranks_);
}

MpiCommunicator::~MpiCommunicator() {
  inspector_.reset();  // its side channel before the group's own communicator
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

std::unique_ptr<CommRequest> MpiCommunicator::broadcast_async(void* data, size_t count, DataType type, int root) {
  auto request = std::make_unique<MpiRequest>("MPI broadcast of " + std::to_string(count) + " " + data_type_name(type) +
                                                  " from rank " + std::to_string(root) + " in " + name_,
                                              inspector_);
  check_call(MPI_Ibcast(data, checked_count(count, "broadcast"), mpi_type(type), root, comm_, request->handle()),
             "MPI_Ibcast", name_);
  return request;
}

std::unique_ptr<CommRequest> MpiCommunicator::allreduce_sum_async(void* data, size_t count, DataType type) {
  auto request = std::make_unique<MpiRequest>(
      "MPI all-reduce of " + std::to_string(count) + " " + data_type_name(type) + " in " + name_, inspector_);
  check_call(MPI_Iallreduce(MPI_IN_PLACE, data, checked_count(count, "all-reduce"), mpi_type(type), MPI_SUM, comm_,
                            request->handle()),
             "MPI_Iallreduce", name_);
  return request;
}

std::unique_ptr<CommRequest> MpiCommunicator::alltoallv_async(const void* send, const std::vector<size_t>& send_counts,
                                                              const std::vector<size_t>& send_displs, void* receive,
                                                              const std::vector<size_t>& receive_counts,
                                                              const std::vector<size_t>& receive_displs,
                                                              DataType type) {
  const size_t n = static_cast<size_t>(size_);
  MOERL_CHECK(
      send_counts.size() == n && send_displs.size() == n && receive_counts.size() == n && receive_displs.size() == n,
      "all-to-all-v needs one count and displacement per rank (" + std::to_string(n) + ")");
  auto to_int = [](const std::vector<size_t>& values) {
    std::vector<int> out;
    for (size_t v : values) out.push_back(checked_count(v, "all-to-all-v"));
    return out;
  };
  // The int vectors must outlive the non-blocking call: keep them in the request.
  struct AlltoallvRequest : MpiRequest {
    using MpiRequest::MpiRequest;
    std::vector<int> sc, sd, rc, rd;
  };
  auto request = std::make_unique<AlltoallvRequest>(
      "MPI all-to-all-v of " + std::string(data_type_name(type)) + " in " + name_, inspector_);
  request->sc = to_int(send_counts);
  request->sd = to_int(send_displs);
  request->rc = to_int(receive_counts);
  request->rd = to_int(receive_displs);
  check_call(MPI_Ialltoallv(send, request->sc.data(), request->sd.data(), mpi_type(type), receive, request->rc.data(),
                            request->rd.data(), mpi_type(type), comm_, request->handle()),
             "MPI_Ialltoallv", name_);
  return request;
}

std::unique_ptr<CommRequest> MpiCommunicator::barrier_async() {
  auto request = std::make_unique<MpiRequest>("MPI barrier in " + name_, inspector_);
  check_call(MPI_Ibarrier(comm_, request->handle()), "MPI_Ibarrier", name_);
  return request;
}

void MpiCommunicator::interrupt() {
  if (!runtime::fault_tolerant_mpi()) throw Error(name_ + ": interrupting a group needs a fault-tolerant MPI (ULFM)");
  runtime::revoke(comm_);
}

std::unique_ptr<Communicator> MpiCommunicator::survivors() {
  if (!runtime::fault_tolerant_mpi())
    throw Error(name_ + ": going on without a lost member needs a fault-tolerant MPI");
  // Every member must stop using the old group: revoking it again is harmless.
  runtime::revoke(comm_);
  return adopt(runtime::shrink(comm_), name_);
}

MpiCommunicator::MpiCommunicator(Adopt, MPI_Comm owned, std::string name) : comm_(owned), name_(std::move(name)) {
  MOERL_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MOERL_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  world_ranks_ = world_ranks_of_members(comm_);
  inspector_ = std::make_shared<StallInspector>(comm_, world_ranks_);
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::adopt(MPI_Comm owned, std::string name) {
  return std::unique_ptr<MpiCommunicator>(new MpiCommunicator(Adopt{}, owned, std::move(name)));
}

}  // namespace moerl::comm
