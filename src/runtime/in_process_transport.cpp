#include "moerl/runtime/in_process_transport.h"

#include "moerl/core/check.h"

namespace moerl::runtime {

class InProcessTransport : public Transport {
 public:
  InProcessTransport(std::shared_ptr<InProcessHub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return hub_->size(); }

  SendResult send(int destination, int tag, const std::vector<std::uint8_t>& frame, double) override {
    std::lock_guard<std::mutex> lock(hub_->mutex_);
    hub_->queues_.at(static_cast<size_t>(destination)).push_back({rank_, tag, frame});
    return SendResult::SendDelivered;
  }

  std::optional<ReceivedFrame> poll(int tag, int source) override {
    std::lock_guard<std::mutex> lock(hub_->mutex_);
    auto& queue = hub_->queues_[static_cast<size_t>(rank_)];
    for (auto it = queue.begin(); it != queue.end(); ++it) {
      if (it->tag != tag || (source != MPI_ANY_SOURCE && it->source != source)) continue;
      ReceivedFrame frame{it->source, std::move(it->bytes)};
      queue.erase(it);
      return frame;
    }
    return std::nullopt;
  }

  // Threads standing in for ranks share no intercommunicator with anyone.
  void route_peer(int rank, MPI_Comm, int) override {
    throw Error("an in-process transport cannot reach rank " + std::to_string(rank) + " outside its hub");
  }

 private:
  std::shared_ptr<InProcessHub> hub_;
  int rank_;
};

std::shared_ptr<InProcessHub> InProcessHub::create(int ranks) {
  MOERL_CHECK(ranks >= 1, "an in-process hub needs at least one rank, got " + std::to_string(ranks));
  return std::shared_ptr<InProcessHub>(new InProcessHub(ranks));
}

std::unique_ptr<Transport> InProcessHub::transport(int rank) {
  MOERL_CHECK(rank >= 0 && rank < size(),
              "rank " + std::to_string(rank) + " outside the in-process hub of " + std::to_string(size()));
  return std::make_unique<InProcessTransport>(shared_from_this(), rank);
}

}  // namespace moerl::runtime
