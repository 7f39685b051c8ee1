#include "moerl/runtime/mpi_transport.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "moerl/core/check.h"
#include "moerl/runtime/backoff.h"
#include "moerl/runtime/fault_tolerance.h"
#include "moerl/runtime/mailbox.h"
#include "moerl/runtime/mpi_session.h"

namespace moerl::runtime {

MpiTransport::MpiTransport(MPI_Comm comm) : comm_(comm) {
  MOERL_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MOERL_MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

MpiTransport::MpiTransport(int rank, int size) : comm_(MPI_COMM_NULL), rank_(rank), size_(size) {}

void MpiTransport::route_peer(int rank, MPI_Comm intercomm, int remote_rank) {
  // A dead peer must be an error code here too, as on the job's communicator.
  MOERL_MPI_CHECK(MPI_Comm_set_errhandler(intercomm, MPI_ERRORS_RETURN));
  remember_intercomm(intercomm);
  std::lock_guard<std::mutex> lock(routes_mutex_);
  routes_[rank] = Route{intercomm, remote_rank};
}

bool MpiTransport::has_route(int rank) const { return route_of(rank).has_value(); }

std::optional<MpiTransport::Route> MpiTransport::route_of(int rank) const {
  std::lock_guard<std::mutex> lock(routes_mutex_);
  const auto it = routes_.find(rank);
  if (it == routes_.end()) return std::nullopt;
  return it->second;
}

std::vector<MPI_Comm> MpiTransport::route_comms() const {
  std::lock_guard<std::mutex> lock(routes_mutex_);
  std::vector<MPI_Comm> comms;
  for (const auto& [rank, route] : routes_)
    if (std::find(comms.begin(), comms.end(), route.comm) == comms.end()) comms.push_back(route.comm);
  return comms;
}

int MpiTransport::job_rank_of(MPI_Comm comm, int source) const {
  if (comm == comm_) return source;
  std::lock_guard<std::mutex> lock(routes_mutex_);
  for (const auto& [rank, route] : routes_)
    if (route.comm == comm && route.remote_rank == source) return rank;
  return -1;
}

std::vector<int> MpiTransport::failed_peers() const {
  if (comm_ == MPI_COMM_NULL) return {};
  std::vector<int> failed = failed_ranks(comm_);
  failed.erase(std::remove_if(failed.begin(), failed.end(), [this](int rank) { return has_route(rank); }),
               failed.end());
  return failed;
}

SendResult MpiTransport::send(int destination, int tag, const std::vector<std::uint8_t>& frame, double timeout_s) {
  MPI_Comm comm = comm_;
  int peer = destination;
  if (const std::optional<Route> route = route_of(destination)) {
    comm = route->comm;
    peer = route->remote_rank;
  }
  MPI_Request request;
  const int posted = MPI_Isend(frame.data(), static_cast<int>(frame.size()), MPI_BYTE, peer, tag, comm, &request);
  if (posted != MPI_SUCCESS && is_process_failure(posted)) return SendResult::SendPeerLost;
  MOERL_MPI_CHECK(posted);
  const double deadline = monotonic_seconds() + timeout_s;
  Backoff backoff;
  for (;;) {
    int done = 0;
    const int tested = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (tested != MPI_SUCCESS && is_process_failure(tested)) return SendResult::SendPeerLost;
    MOERL_MPI_CHECK(tested);
    if (done) return SendResult::SendDelivered;
    if (monotonic_seconds() > deadline) {
      MPI_Cancel(&request);
      MPI_Request_free(&request);
      return SendResult::SendTimedOut;
    }
    backoff.pause();
  }
}

// A matched probe (MPI_Improbe + MPI_Mrecv) rather than MPI_Iprobe + MPI_Recv:
// the probed message is taken out of the queue, so neither another thread
// probing the same tag nor a sender that dies mid-transfer can leave a message
// that every later probe finds and no receive can take (a coordinator once
// spun on such a heartbeat and stopped beating).
std::optional<ReceivedFrame> MpiTransport::poll(int tag, int source) {
  if (source != MPI_ANY_SOURCE) {
    if (const std::optional<Route> route = route_of(source)) return poll_comm(route->comm, tag, route->remote_rank);
    if (comm_ == MPI_COMM_NULL) return std::nullopt;
    return poll_comm(comm_, tag, source);
  }
  if (comm_ != MPI_COMM_NULL)
    if (std::optional<ReceivedFrame> frame = poll_comm(comm_, tag, source)) return frame;
  for (MPI_Comm comm : route_comms())
    if (std::optional<ReceivedFrame> frame = poll_comm(comm, tag, source)) return frame;
  return std::nullopt;
}

std::optional<ReceivedFrame> MpiTransport::poll_comm(MPI_Comm comm, int tag, int source) {
  int arrived = 0;
  MPI_Message message = MPI_MESSAGE_NULL;
  MPI_Status status;
  int probed = MPI_Improbe(source, tag, comm, &arrived, &message, &status);
  if (probed != MPI_SUCCESS && is_process_failure(probed)) {
    if (source != MPI_ANY_SOURCE) return std::nullopt;  // a dead peer sends nothing more
    acknowledge_failures(comm);
    probed = MPI_Improbe(source, tag, comm, &arrived, &message, &status);
    if (probed != MPI_SUCCESS && is_process_failure(probed)) return std::nullopt;
  }
  MOERL_MPI_CHECK(probed);
  if (!arrived) return std::nullopt;
  int count = 0;
  MOERL_MPI_CHECK(MPI_Get_count(&status, MPI_BYTE, &count));
  ReceivedFrame frame{job_rank_of(comm, status.MPI_SOURCE), std::vector<std::uint8_t>(static_cast<size_t>(count))};
  const int received = MPI_Mrecv(frame.bytes.data(), count, MPI_BYTE, &message, MPI_STATUS_IGNORE);
  // The sender died after its message was matched but before its bytes came
  // (a large frame waits for the receiver). The matched message is consumed
  // either way, so no later probe finds it again; what it said died with its
  // sender, and the failure detector reports the rank.
  if (received != MPI_SUCCESS && is_process_failure(received)) {
    spdlog::warn(
        "rank {}: a message (tag {}) from rank {} was lost: MPI reported a process failure (error {}) "
        "while receiving it",
        rank_, tag, frame.source, received);
    return std::nullopt;
  }
  MOERL_MPI_CHECK(received);
  return frame;
}

}  // namespace moerl::runtime
