#pragma once
// How an expert-parallel MoE layer (moe/expert_parallel.h) reaches the other
// members of its expert group: two all-to-all exchanges and nothing else.
// An interface here because the communicators live above moe in the layers;
// comm/communicator_expert_exchange.h implements it over a Communicator, and
// a test may implement it over threads. LibTorch-free.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace moerl::moe {

// Totals since construction, for benchmarks and metrics.
struct ExchangeTotals {
  std::int64_t exchanges = 0;  // calls of exchange_bytes
  std::int64_t bytes_sent = 0;
  std::int64_t bytes_received = 0;
  double seconds = 0;  // wall time inside exchange_bytes and exchange_counts
};

class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Collective: member p gets send[p*block, (p+1)*block). Returns what every
  // member sent here, [size()*block], member-major.
  virtual std::vector<std::int64_t> exchange_counts(const std::vector<std::int64_t>& send, std::size_t block) = 0;

  // Collective: send_bytes[p] bytes to member p, taken from `send` in member
  // order; receive_bytes[p] bytes from member p, written to `receive` in
  // member order. Each member's receive_bytes[p] must equal member p's
  // send_bytes[this member] (exchange_counts tells them first).
  virtual void exchange_bytes(const void* send, const std::vector<std::size_t>& send_bytes, void* receive,
                              const std::vector<std::size_t>& receive_bytes) = 0;

  virtual ExchangeTotals totals() const = 0;
};

}  // namespace moerl::moe
