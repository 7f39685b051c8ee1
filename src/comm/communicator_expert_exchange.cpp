// moe::ExpertExchange over a Communicator's all-to-all-v.

#include "moerl/comm/communicator_expert_exchange.h"

#include <string>

#include "moerl/core/check.h"
#include "moerl/runtime/mailbox.h"

namespace moerl::comm {
namespace {

// Displacements of consecutive blocks of the given sizes.
std::vector<size_t> displacements(const std::vector<size_t>& sizes) {
  std::vector<size_t> at(sizes.size());
  size_t next = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    at[i] = next;
    next += sizes[i];
  }
  return at;
}

}  // namespace

CommunicatorExpertExchange::CommunicatorExpertExchange(Communicator& comm, double timeout_s)
    : comm_(comm), timeout_s_(timeout_s) {}

std::vector<std::int64_t> CommunicatorExpertExchange::exchange_counts(const std::vector<std::int64_t>& send,
                                                                      std::size_t block) {
  const auto members = static_cast<size_t>(comm_.size());
  MOERL_CHECK(send.size() == members * block, "expert exchange: " + std::to_string(send.size()) +
                                                  " counts are not one block of " + std::to_string(block) +
                                                  " per member of " + comm_.name());
  const double started = runtime::monotonic_seconds();
  std::vector<std::int64_t> received(members * block, 0);
  const std::vector<size_t> sizes(members, block);
  const auto at = displacements(sizes);
  comm_.alltoallv_async(send.data(), sizes, at, received.data(), sizes, at, DataType::Int64)->wait(timeout_s_);
  totals_.seconds += runtime::monotonic_seconds() - started;
  return received;
}

void CommunicatorExpertExchange::exchange_bytes(const void* send, const std::vector<std::size_t>& send_bytes,
                                                void* receive, const std::vector<std::size_t>& receive_bytes) {
  const auto members = static_cast<size_t>(comm_.size());
  MOERL_CHECK(send_bytes.size() == members && receive_bytes.size() == members,
              "expert exchange: need one byte count per member of " + comm_.name());
  const double started = runtime::monotonic_seconds();
  comm_
      .alltoallv_async(send, send_bytes, displacements(send_bytes), receive, receive_bytes,
                       displacements(receive_bytes), DataType::Byte)
      ->wait(timeout_s_);
  totals_.seconds += runtime::monotonic_seconds() - started;
  totals_.exchanges += 1;
  for (size_t p = 0; p < members; ++p) {
    if (static_cast<int>(p) == comm_.rank()) continue;  // what stays here is not sent
    totals_.bytes_sent += static_cast<std::int64_t>(send_bytes[p]);
    totals_.bytes_received += static_cast<std::int64_t>(receive_bytes[p]);
  }
}

}  // namespace moerl::comm
