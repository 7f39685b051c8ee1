#pragma once
// moe::ExpertExchange over a Communicator: the expert group's two all-to-all
// exchanges as all-to-all-v collectives, each waited on with a deadline (a
// member that does not join ends in CommTimeout naming it, as every other
// collective does). The rows travel as bytes, so any dtype does.

#include <memory>

#include "moerl/comm/communicator.h"
#include "moerl/moe/expert_exchange.h"

namespace moerl::comm {

class CommunicatorExpertExchange : public moe::ExpertExchange {
 public:
  // comm must outlive this object; timeout_s bounds each exchange.
  CommunicatorExpertExchange(Communicator& comm, double timeout_s);

  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  std::vector<std::int64_t> exchange_counts(const std::vector<std::int64_t>& send, std::size_t block) override;
  void exchange_bytes(const void* send, const std::vector<std::size_t>& send_bytes, void* receive,
                      const std::vector<std::size_t>& receive_bytes) override;
  moe::ExchangeTotals totals() const override { return totals_; }

 private:
  Communicator& comm_;
  double timeout_s_;
  moe::ExchangeTotals totals_;
};

}  // namespace moerl::comm
